"""The Mesh-TensorFlow paper's Transformer LM layouts beside the planner's, on TPU v2 and v3.

    python experiments/mesh_tf_paper.py 15 --out experiments/results  # 15 s a search; mesh_tf_paper.{csv,png}
    python experiments/mesh_tf_paper.py --enfr 30 --out experiments/results  # En-Fr: mesh_tf_enfr.csv
    python experiments/mesh_tf_paper.py --plot  # redraws the PNG from the committed CSVs

Configs (Shazeer et al. 2018, the language-model experiments): 6 layers, d_model 1024,
d_kv 256, batch 256, sequence 256, vocabulary 32768, d_ff = 8192 * 2^k and heads = 8 * 2^k
for k = -1 ... 5 (0.14B to 4.9B parameters), here the example GPT (``models/gpt.py``) at
those widths in bfloat16. The paper's meshes count TPU cores; the profiles' devices are
chips (2 cores each), so a core mesh runs on half as many chips with its model axis
halved (batch:32 -> batch:16 on 16 chips), or its batch axis where there is no model axis.
Which mesh goes with which k (two sizes per mesh, the largest on 512 cores) is this
script's reading of the paper, not checked row by row against its table.

The En-Fr Transformer (``--enfr``): the Mesh-TF README's scaling figure reports about 2,570
TFLOP/s splitting the model and about 2,330 TFLOP/s splitting data on 512 TPU-v2 cores. Its
configs here are the 512-core ones of ``mtf_transformer_paper_tr`` (tensor2tensor's
``mtf_transformer.py``: 6 + 6 layers, d_model 1024, d_kv 128, sequence 256, 32k vocabulary,
d_ff = 4096 * 2^k, heads = 8 * 2^k): model splitting ``paper_tr_6_mesh_64_8`` (k = 6,
batch 128, ``model:64;batch:8``) and data splitting ``paper_tr_0_mesh_512`` (k = 0, batch
2048, ``batch:512``), on the example T5 (``models/t5.py``: shared embeddings, Adam where the
paper used Adafactor). That these two configs are the README figure's is this script's
reading.

Per row: the paper's layout (batch on the batch axis; d_ff, heads and vocab on the model
axis) priced by the cost model, and the planner's own plan on the same chips; both step
times and TFLOP/s (model FLOPs over the slice). The tpu-v2/v3 figures are approximate.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
# k -> the paper's mesh in cores
MESHES = {
    -1: {"batch": 32},
    0: {"batch": 32},
    1: {"model": 4, "batch": 8},
    2: {"model": 4, "batch": 8},
    3: {"model": 8, "batch": 16},
    4: {"model": 8, "batch": 16},
    5: {"batch": 16, "model": 32},
}
RULES = {"batch": "batch", "d_ff": "model", "heads": "model", "vocab": "model"}


def on_chips(mesh: dict[str, int]) -> dict[str, int]:
    """A core mesh on chips of 2 cores: the model axis halved, else the batch axis."""
    out = dict(mesh)
    axis = "model" if "model" in out else "batch"
    out[axis] //= 2
    return {k: v for k, v in out.items() if v > 1} or {"batch": 1}


def paper_vs_plan(wl: al.Workload, hw: al.Hardware, cores: dict[str, int], time_limit_s: float):
    """The paper's layout on ``cores`` (mapped onto chips) priced, and the planner's plan on
    the same chips: the row fields both tables share."""
    g = al.trace(wl)
    params = sum(g.tensors[t].size for t in g.inputs if g.tensors[t].path.startswith("params/"))
    mesh = on_chips(cores)
    rules = {d: a for d, a in RULES.items() if a in mesh}
    paper = al.evaluate(wl, hw, mesh=mesh, rules=rules, graph=g)
    t0 = time.perf_counter()
    auto = al.plan(wl, hw, time_limit_s=time_limit_s, graph=g)
    wall = time.perf_counter() - t0
    flops = paper.predicted["model_flops"]
    return {
        "params_b": params / 1e9,
        "paper_mesh_cores": " x ".join(f"{a}:{s}" for a, s in cores.items()),
        "paper_mesh_chips": " x ".join(f"{a}:{s}" for a, s in mesh.items()),
        "paper_step_s": paper.predicted["step_time_s"],
        "paper_tflops": flops / paper.predicted["step_time_s"] / 1e12,
        "paper_fits": bool(paper.predicted["fits"]),
        "paper_memory_gib": paper.predicted["memory_bytes_per_device"] / 2**30,
        "plan_mesh": " x ".join(f"{a}:{s}" for a, s in auto.mesh.items()),
        "plan_rules": "; ".join(f"{d}->{'x'.join(a)}" for d, a in auto.rules()),
        "plan_status": auto.status,
        "plan_step_s": auto.predicted["step_time_s"],
        "plan_tflops": flops / auto.predicted["step_time_s"] / 1e12,
        "plan_fits": bool(auto.predicted["fits"]),
        "plan_memory_gib": auto.predicted["memory_bytes_per_device"] / 2**30,
        "speedup": paper.predicted["step_time_s"] / auto.predicted["step_time_s"],
        "plan_wall_s": wall,
    }


def main(time_limit_s: float = 15.0) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    rows = []
    for family in ("tpu-v2", "tpu-v3"):
        for k, cores in MESHES.items():
            n = math.prod(cores.values())
            hw = al.hardware(f"{family}-{n}")
            wl = al.load_workload(
                ROOT / "models" / "gpt.py", size="gpt3-small", layers=6, d_model=1024,
                head_dim=256, heads=int(8 * 2**k), d_ff=int(8192 * 2**k), vocab=32768,
                seq=256, batch=256, dtype="bfloat16", attention="naive",
            )  # fmt: skip
            row = {
                "hardware": hw.name,
                "k": k,
                "d_ff": int(8192 * 2**k),
                "heads": int(8 * 2**k),
                "cores": n,
                "chips": hw.num_devices,
                **paper_vs_plan(wl, hw, cores, time_limit_s),
            }
            rows.append(row)
            print(
                f"{hw.name:<12} k={k:>2} {row['params_b']:5.2f}B  paper {row['paper_mesh_chips']:<18}"
                f" {row['paper_tflops']:7.1f} TFLOP/s{'' if row['paper_fits'] else ' (no fit)'}"
                f"   plan {row['plan_mesh']:<22} {row['plan_tflops']:7.1f} TFLOP/s  "
                f"x{row['speedup']:.2f}",
                flush=True,
            )
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "mesh_tf_paper.csv", index=False)
    plot(df)
    return df


# the Mesh-TF README's En-Fr figures on 512 TPU-v2 cores: (name, k, batch, core mesh, TFLOP/s)
EN_FR = (
    ("model splitting", 6, 128, {"model": 64, "batch": 8}, 2570.0),
    ("data splitting", 0, 2048, {"batch": 512}, 2330.0),
)


def en_fr(time_limit_s: float = 30.0) -> pd.DataFrame:
    """The En-Fr Transformer's two 512-core cases: paper layout and plan, beside the README."""
    rows = []
    hw = al.hardware("tpu-v2-512")
    for name, k, batch, cores, reported in EN_FR:
        wl = al.load_workload(
            ROOT / "models" / "t5.py", size="base", layers=6, d_model=1024, head_dim=128,
            heads=int(8 * 2**k), d_ff=int(4096 * 2**k), vocab=32768, enc_seq=256, dec_seq=256,
            batch=batch, dtype="bfloat16", attention="naive",
        )  # fmt: skip
        row = {
            "case": name,
            "k": k,
            "batch": batch,
            "reported_tflops": reported,
            **paper_vs_plan(wl, hw, cores, time_limit_s),
        }
        rows.append(row)
        print(
            f"En-Fr {name:<16} {row['params_b']:5.2f}B  reported {reported:6.0f} TFLOP/s   paper "
            f"layout predicted {row['paper_tflops']:6.0f}{'' if row['paper_fits'] else ' (no fit)'}"
            f"   plan {row['plan_mesh']} {row['plan_tflops']:6.0f}",
            flush=True,
        )
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "mesh_tf_enfr.csv", index=False)
    return df


def plot(df: pd.DataFrame) -> None:
    enfr = OUT / "mesh_tf_enfr.csv"
    enfr = enfr if enfr.exists() else RESULTS / "mesh_tf_enfr.csv"
    extra = pd.read_csv(enfr) if enfr.exists() else None
    fig, axes = plt.subplots(
        1, 3 if extra is not None else 2, figsize=(15 if extra is not None else 11, 4),
        gridspec_kw={"width_ratios": [7, 7, 3] if extra is not None else [1, 1]},
    )  # fmt: skip
    for ax, (hw, d) in zip(
        axes[:2], df.groupby(df.hardware.str.rsplit("-", n=1).str[0]), strict=False
    ):
        x = range(len(d))
        ax.bar([i - 0.2 for i in x], d.paper_tflops, 0.4, label="paper's layout (priced)")
        ax.bar([i + 0.2 for i in x], d.plan_tflops, 0.4, label="planner")
        for i, r in enumerate(d.itertuples()):
            for dx, fits, y in (
                (-0.2, r.paper_fits, r.paper_tflops),
                (0.2, r.plan_fits, r.plan_tflops),
            ):
                if not fits:
                    ax.text(i + dx, y * 0.8, "no fit", rotation=90, ha="center", va="center",
                            fontsize=7, color="white")  # fmt: skip
        ax.set_xticks(list(x), [f"{p:.2f}B\n{c} cores" for p, c in zip(d.params_b, d.cores,
                                                                       strict=True)],
                      fontsize=7)  # fmt: skip
        ax.set_xlabel("Transformer LM (parameters, TPU cores)")
        ax.set_title(f"{hw} (approximate profile)")
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    if extra is not None:
        ax = axes[2]
        x = range(len(extra))
        ax.bar([i - 0.27 for i in x], extra.reported_tflops, 0.27, color="0.4",
               label="Mesh-TF README (measured, 2018)")  # fmt: skip
        ax.bar([i for i in x], extra.paper_tflops, 0.27, label="paper's layout (priced)")
        ax.bar([i + 0.27 for i in x], extra.plan_tflops, 0.27, label="planner")
        ax.set_xticks(
            list(x),
            [f"{c}\n{p:.1f}B" for c, p in zip(extra.case, extra.params_b, strict=True)],
            fontsize=7,
        )
        ax.set_title("En-Fr, 512 v2 cores")
        ax.set_ylabel("TFLOP/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    both = pd.concat([df.paper_tflops, df.plan_tflops])
    for ax in axes[:2]:
        ax.set_ylim(both.min() * 0.7, both.max() * 1.4)
    axes[0].set_ylabel("predicted TFLOP/s (model FLOPs, whole slice)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "mesh_tf_paper.png", dpi=120)


if __name__ == "__main__":
    OUT = take_out()
    if sys.argv[1:] == ["--plot"]:  # redraw from the committed CSVs
        plot(pd.read_csv(RESULTS / "mesh_tf_paper.csv"))
    elif sys.argv[1:2] == ["--enfr"]:
        en_fr(float(sys.argv[2]) if len(sys.argv) > 2 else 30.0)
        plot(pd.read_csv(RESULTS / "mesh_tf_paper.csv"))
    else:
        main(float(sys.argv[1]) if len(sys.argv) > 1 else 15.0)
