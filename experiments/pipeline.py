"""Pipeline stages as a planner's choice (issue 24): GPT-3 175B planned with and without stages,
and a published pipelined run priced in its own layout.

    python experiments/pipeline.py 60 --out experiments/results  # s a plan; pipeline.csv, .png
    python experiments/pipeline.py --figure    # redraws the figure from the committed CSV

Rows ``planned``: the example GPT at GPT-3 175B (scanned layers, full remat, batch 1536 x 2048)
on ``h100-512`` (64 nodes of 8, 400 Gb/s per GPU between nodes) and on two TPU v5p slices joined
by the data-centre network (``2xtpu-v5p-256``), and at Megatron-LM's 145.6B shapes on its 1536
A100s (200 Gb/s per GPU between nodes), planned by ``al.plan(pipeline=True)`` with each
schedule: ``gpipe`` (what ``al.apply`` runs) and ``1f1b`` (priced as Megatron-LM runs it). Each
row holds the best plan with stages and the best without, and which the planner chose.

Row ``published``: Megatron-LM's 145.6B GPT (Narayanan et al. 2021, SC'21, Table 1: 80 layers,
hidden 12288, 96 heads, vocab 51200, sequence 2048, batch 2304, tensor 8 x pipeline 8 on 1536
A100s, 148 TFLOP/s per GPU, 47% of peak), priced in its own layout: 8 stages of 10 layers,
tensor parallel 8 in a node, data parallel 24, 1F1B, full recomputation, microbatches of one
sequence per replica (96 a step; the table does not give the microbatch size: an assumption).
Its published MFU counts the model's FLOPs without recomputation: the paper's 148 TFLOP/s
counts Megatron's formula with it, ``96 B s l h^2 (1 + s/6h + V/16lh)``, so the step time is
that over 148 TFLOP/s x 1536 and the MFU is our model FLOPs over it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al
from autolayout.core import find_stack, stage_workload
from autolayout.cost_models import pipelined_plan, stage_hardware

HERE = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
GPT = HERE / "models" / "gpt.py"


def megatron_145b() -> al.Workload:
    L, h, heads, V, s, B = 80, 12288, 96, 51200, 2048, 2304
    return al.load_workload(GPT, size="gpt3-175b", scan=True, remat="full", layers=L, d_model=h,
                            heads=heads, head_dim=h // heads, d_ff=4 * h, vocab=V, seq=s, batch=B,
                            attention="naive")  # fmt: skip


def planned(limit: float) -> list[dict]:
    gpt3 = al.load_workload(GPT, size="gpt3-175b", scan=True, remat="full", attention="naive")
    rows = []
    for model, wl, hw in (("gpt3-175b", gpt3, "h100-512"), ("gpt3-175b", gpt3, "2xtpu-v5p-256"),
                          ("megatron-145.6b", megatron_145b(), "a100-80gb-1536")):  # fmt: skip
        for schedule in ("gpipe", "1f1b"):
            t0 = time.perf_counter()
            p = al.plan(wl, hw, pipeline=True, schedule=schedule, time_limit_s=limit)
            ch = p.solver["pipeline_choice"]
            w, wo = ch["with"] or {}, ch["without"] or {}
            pipe = p.solver.get("pipeline") or {}
            rows.append({
                "row": "planned", "model": model, "hardware": hw, "schedule": schedule,
                "chosen": "with stages" if pipe else "without",
                "with_mesh": al.core.mesh_text(w["mesh"]) if w else "",
                "with_microbatches": w.get("microbatches"),
                "with_step_s": w.get("step_time_s"), "with_mfu": w.get("mfu"),
                "with_gib": w.get("memory_bytes_per_device", float("nan")) / 2**30,
                "with_fits": w.get("fits"),
                "without_mesh": al.core.mesh_text(wo["mesh"]) if wo else "",
                "without_step_s": wo.get("step_time_s"), "without_mfu": wo.get("mfu"),
                "without_gib": wo.get("memory_bytes_per_device", float("nan")) / 2**30,
                "without_fits": wo.get("fits"),
                "bubble": pipe.get("bubble"), "published_mfu": None,
                "wall_s": time.perf_counter() - t0,
            })  # fmt: skip
            print(rows[-1], flush=True)
    return rows


def published() -> dict:
    L, h, V, s, B, chips, tflops = 80, 12288, 51200, 2048, 2304, 1536, 148e12
    P, T = 8, 8
    D = chips // (P * T)
    M = B // D  # one sequence per replica per microbatch (assumed)
    wl = megatron_145b()
    hw = al.hardware(f"a100-80gb-{chips}")
    g = al.trace(wl)
    st = find_stack(g)
    swl = stage_workload(wl, g, st, P, M)
    sp = al.evaluate(swl, stage_hardware(hw, P), mesh={"data": D, "model": T},
                     rules={"batch": "data", "heads": "model", "d_ff": "model", "vocab": "model"})  # fmt: skip
    p = pipelined_plan(wl, g, hw, sp, st, P, M, "1f1b")
    pr = p.predicted
    megatron = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    step = megatron / (tflops * chips)
    mfu = pr["model_flops"] / (step * 312e12 * chips)
    return {
        "row": "published", "model": "megatron-145.6b", "hardware": hw.name, "schedule": "1f1b",
        "chosen": "as published", "with_mesh": al.core.mesh_text(p.mesh), "with_microbatches": M,
        "with_step_s": pr["step_time_s"], "with_mfu": pr["mfu"],
        "with_gib": pr["memory_bytes_per_device"] / 2**30, "with_fits": bool(pr["fits"]),
        "without_mesh": "", "without_step_s": step, "without_mfu": None, "without_gib": None,
        "without_fits": None, "bubble": pr["pipeline"]["bubble"], "published_mfu": mfu,
        "wall_s": 0.0,
    }  # fmt: skip


def figure(df: pd.DataFrame) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels, a, b = [], [], []
    for r in df.itertuples():
        if r.row == "planned":
            fit = "" if str(r.with_fits) == "True" else "\n(staged: no fit)"
            labels.append(f"{r.model}\n{r.hardware}\n{r.schedule}{fit}")
            a.append(r.with_mfu or 0)
            b.append(r.without_mfu or 0)
        else:
            labels.append(f"{r.model}\n{r.hardware}\npublished layout")
            a.append(r.with_mfu)
            b.append(r.published_mfu)
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], a, 0.4, label="with stages (predicted)")
    ax.bar([i + 0.2 for i in x], b, 0.4, label="without stages (predicted) / published")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylabel("MFU")
    ax.set_title("Planned with and without pipeline stages; Megatron-LM 145.6B priced as published")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "pipeline.png", dpi=120)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--figure":
        figure(pd.read_csv(RESULTS / "pipeline.csv"))
        return
    limit = float(argv[0]) if argv else 60.0
    rows = [published()]
    print(rows[0], flush=True)
    rows += planned(limit)
    df = pd.DataFrame(rows)
    OUT.mkdir(exist_ok=True)
    df.to_csv(OUT / "pipeline.csv", index=False)
    figure(df)
    print(df.to_string())


if __name__ == "__main__":
    OUT = take_out()
    main(sys.argv[1:])
