"""How well the search's work clock tracks the CPU it spends (issue 34, item 1).

The work clock (``search/clock.py``) charges each piece of the search what it costs on the
reference machine (this project's 2-core one); its constants were read off the example
models' plans (in-sample rows below). The library wrappers' plans were not looked at when
choosing them (held-out rows). A plan whose CPU time runs far past its work is one the
wall-clock stop cuts on a machine slower than the reference; the budget is half the limit,
so up to 2x is absorbed.

python experiments/clock_calibration.py --out experiments/results
(writes clock_calibration.csv and .png into --out; default a fresh folder under /tmp)
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("AUTOLAYOUT_WALL_SLACK", "20")  # CPU against work, not the stop

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import fresh  # noqa: E402

import autolayout as al  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
LIB = MODELS / "libraries"
IN_SAMPLE = [
    (MODELS / "gpt.py", {"size": "tiny"}, "cpu-8"),
    (MODELS / "my_transformer.py", {}, "cpu-8"),
    (MODELS / "mlp.py", {}, "cpu-8"),
    (MODELS / "moe.py", {"size": "tiny"}, "cpu-8"),
    (MODELS / "t5.py", {"size": "tiny"}, "cpu-8"),
    (MODELS / "unet3d.py", {"size": "tiny"}, "cpu-8"),
    (MODELS / "gpt.py", {"size": "gpt3-xl", "scan": True, "remat": "full"}, "h100-64"),
    (MODELS / "gpt.py", {"size": "gpt3-6.7b", "layers": 8}, "tpu-v4-256"),
    (MODELS / "moe.py", {"size": "base"}, "h100-64"),
]
HELD_OUT = [
    (LIB / "hf_llama.py", {}, "cpu-8"),
    (LIB / "hf_bert.py", {}, "cpu-8"),
    (LIB / "nnx_lm.py", {}, "cpu-8"),
    (LIB / "eqx_vit.py", {}, "cpu-8"),
    (LIB / "keras_gpt2.py", {}, "cpu-8"),
    (LIB / "hf_mistral.py", {}, "cpu-8"),
    (LIB / "hf_llama.py", {"size": "llama2-7b"}, "h100-64"),
    (LIB / "nnx_lm.py", {"size": "base"}, "tpu-v4-256"),
    (MODELS / "gpt.py", {"size": "llama3-8b", "scan": True, "remat": "full"}, "h100-64"),
]


def measure(model: Path, sets: dict, hw: str, limit: float) -> dict:
    wl = al.load_workload(model, target=hw, **sets)
    c0, w0 = time.process_time(), time.perf_counter()
    p = al.plan(wl, hw, time_limit_s=limit, remat="as_written")
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    work = p.solver["work_s"]
    return {"model": model.stem + "".join(f",{k}={v}" for k, v in sets.items()),
            "hardware": hw, "limit_s": limit, "budget_s": limit * al.search.WORK_SHARE,
            "work_s": round(work, 2), "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "cpu_over_work": round(cpu / work, 3), "ops": len(p.graph.ops),
            "status": p.status}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limits", default="6,20")
    ap.add_argument("--out", type=Path, default=None, help="default: a fresh results/runs/<time>/")
    a = ap.parse_args()
    out = a.out or fresh()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for limit in (float(x) for x in a.limits.split(",")):
        for sample, cases in (("in", IN_SAMPLE), ("held out", HELD_OUT)):
            for model, sets, hw in cases:
                r = {"sample": sample, **measure(model, sets, hw, limit)}
                print(r, flush=True)
                rows.append(r)
    df = pd.DataFrame(rows)
    df.to_csv(out / "clock_calibration.csv", index=False)
    summary = df.groupby("sample").cpu_over_work.describe()[["count", "50%", "min", "max"]]
    print(summary.to_string(), f"\nwritten to {out}", sep="\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for sample, marker in (("in", "o"), ("held out", "x")):
        d = df[df["sample"] == sample]
        ax.scatter(d.work_s, d.cpu_s, marker=marker, label=f"{sample} ({len(d)} plans)")
    top = max(df.work_s.max(), df.cpu_s.max()) * 1.05
    ax.plot([0, top], [0, top], color="gray", lw=0.8, label="CPU = work")
    ax.plot([0, top], [0, 2 * top], color="tab:red", lw=0.8, ls="--",
            label="CPU = 2 x work (the stop's margin)")  # fmt: skip
    ax.set_xlabel("work charged (reference s)")
    ax.set_ylabel("CPU seconds of the plan")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "clock_calibration.png", dpi=110)


if __name__ == "__main__":
    main()
