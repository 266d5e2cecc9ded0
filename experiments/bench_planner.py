"""Benchmark: wall time of ``al.plan`` for GPT-3-175B-shaped steps on tpu-v4-1024.

    python experiments/bench_planner.py 30   # 30 s time limit; writes experiments/results/bench_planner.{csv,json,png}
    python experiments/bench_planner.py --plot  # redraws the PNG from the CSV

For 1, 2, 8, 24, 48 and 96 unrolled layers, with structurally identical layers sharing one
decision (``share=True``) and without, it records the whole planning time (trace + request
+ every mesh shape + solve), its parts, and the size of the model the solver saw (nodes,
variables, constraints of the chosen shape's last ILP).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout._plan import mesh_text  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"
HW = "tpu-v4-1024"


def main(layer_counts=(1, 2, 8, 24, 48, 96), time_limit_s: float = 120.0) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    rows = []
    for share in (True, False):
        for layers in layer_counts:
            wl = al.load_workload(
                ROOT / "models" / "gpt.py", size="gpt3-175b", layers=layers, remat="full"
            )
            t0 = time.perf_counter()
            p = al.plan(wl, HW, time_limit_s=time_limit_s, share=share)
            wall = time.perf_counter() - t0
            s = p.solver
            row = {
                "layers": layers,
                "share": share,
                "wall_s": wall,
                "trace_s": s["trace_s"],
                "search_s": wall - s["trace_s"],
                "ops": s["ops"],
                "nodes": s["nodes"],
                "variables": s["variables"],
                "constraints": s["constraints"],
                "mesh_shapes": len(s["mesh_shapes_tried"]),
                "status": p.status,
                "mesh": mesh_text(p.mesh),
                "step_time_s": p.predicted["step_time_s"],
                "fits": bool(p.predicted["fits"]),
                "time_limit_s": time_limit_s,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "bench_planner.csv", index=False)
    (OUT / "bench_planner.json").write_text(json.dumps(rows, indent=1))
    plot(df)
    return df


def plot(df: pd.DataFrame) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.axhline(df.time_limit_s.iloc[0], color="grey", ls=":", label="al.plan time limit")
    a.axhline(5.0, color="red", ls=":", label="goal for 96 layers (5 s)")
    for share, style in ((True, "o-"), (False, "s--")):
        d = df[df.share == share]
        label = "shared layers" if share else "one decision per op"
        a.plot(d.layers, d.wall_s, style, label=f"{label}: total")
        a.plot(d.layers, d.search_s, style, alpha=0.5, label=f"{label}: search (no trace)")
        b.plot(d.layers, d.nodes, style, label=label)
    a.set_xlabel("unrolled layers (GPT-3 175B shapes)")
    a.set_ylabel("al.plan wall time (s)")
    a.set_title(f"Planning time on {HW}")
    a.legend(fontsize=7)
    b.set_xlabel("unrolled layers")
    b.set_ylabel("decisions (nodes) in the request")
    b.set_title("Model size")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "bench_planner.png", dpi=120)


if __name__ == "__main__":
    if sys.argv[1:] == ["--plot"]:  # redraw from the committed CSV
        plot(pd.read_csv(OUT / "bench_planner.csv"))
    else:
        main(time_limit_s=float(sys.argv[1]) if len(sys.argv) > 1 else 120.0)
