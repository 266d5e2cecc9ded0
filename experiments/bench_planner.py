"""Benchmark: wall time of ``al.plan`` for GPT-3-175B-shaped steps on tpu-v4-1024.

    python experiments/bench_planner.py 30 5 --out experiments/results  # limits 30 s and 5 s
    python experiments/bench_planner.py --plot  # redraws the PNG from the committed CSV

For 1, 2, 8, 24, 48 and 96 unrolled layers, with structurally identical layers sharing one
decision (``share=True``) and without, it records the whole planning time (trace + request
+ every mesh shape + solve), its phases (``plan.solver["phases_s"]``), how many mesh shapes
were seeded in the time, the plan found, the size of the model the solver saw (nodes,
variables, constraints of the chosen shape's last ILP), and ``reference_s``: a fixed
pure-Python workload timed just before the row, for how fast the (shared) machine was. Each time limit is one series; the
short one shows the fixed costs (trace, analysis, final pricing) the limit cannot cut.
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
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.core import mesh_text  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
HW = "tpu-v4-1024"
PHASES = ("trace", "analyse", "seed", "refine", "least_memory", "final")


def main(layer_counts=(1, 2, 8, 24, 48, 96), time_limits=(30.0, 5.0)) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    rows = []
    for time_limit_s in time_limits:
        for share in (True, False):
            for layers in layer_counts:
                rows.append(run(layers, share, time_limit_s))
                print(json.dumps(rows[-1]), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "bench_planner.csv", index=False)
    (OUT / "bench_planner.json").write_text(json.dumps(rows, indent=1))
    plot(df)
    return df


def reference_s() -> float:
    """Seconds of a fixed pure-Python workload (dicts, tuples, hashes: what the planner
    does), timed before each run: this shared machine's speed varies by up to 2x over a
    day, and this says how fast it was when a row was measured."""
    t0 = time.perf_counter()
    d: dict = {}
    for i in range(300_000):
        k = (i % 997, (i * 7) % 1013, f"t{i % 50}")
        d[k] = d.get(k, 0) + hash(k) % 7
    return time.perf_counter() - t0


def run(layers: int, share: bool, time_limit_s: float) -> dict:
    wl = al.load_workload(ROOT / "models" / "gpt.py", size="gpt3-175b", layers=layers, remat="full",
                          attention="naive")  # fmt: skip  # the graph the timings were taken on
    ref = reference_s()
    t0 = time.perf_counter()
    p = al.plan(wl, HW, time_limit_s=time_limit_s, share=share)
    wall = time.perf_counter() - t0
    s = p.solver
    tried = s["mesh_shapes_tried"]
    phases = s.get("phases_s", {})
    return {
        "layers": layers,
        "share": share,
        "time_limit_s": time_limit_s,
        "wall_s": wall,
        "trace_s": s["trace_s"],
        "search_s": wall - s["trace_s"],
        **{f"{k}_s": phases.get(k, 0.0) for k in PHASES},
        "ops": s["ops"],
        "nodes": s["nodes"],
        "variables": s["variables"],
        "constraints": s["constraints"],
        "mesh_shapes": len(tried),
        "shapes_seeded": sum(r["status"] != "SKIPPED" for r in tried),
        "status": p.status,
        "mesh": mesh_text(p.mesh),
        "step_time_s": p.predicted["step_time_s"],
        "memory_gib": p.predicted["memory_bytes_per_device"] / 2**30,
        "fits": bool(p.predicted["fits"]),
        "lower_bound_s": s.get("lower_bound_s"),  # no layout on the chosen mesh is faster
        "gap": s.get("gap"),  # step time / bound - 1
        "bound_kind": s.get("bound_kind", ""),
        "bound_s": s.get("bound_s"),  # seconds the bound took (in wall_s)
        "reference_s": ref,
    }


def plot(df: pd.DataFrame) -> None:
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    a.axhline(5.0, color="red", ls=":", label="goal for 96 layers (5 s)")
    for limit, colour in zip(
        sorted(df.time_limit_s.unique(), reverse=True), ("C0", "C1", "C2"), strict=False
    ):
        a.axhline(limit, color=colour, ls=":", alpha=0.5)
        for share, style in ((True, "o-"), (False, "s--")):
            d = df[(df.share == share) & (df.time_limit_s == limit)]
            label = "shared layers" if share else "one decision per op"
            a.plot(d.layers, d.wall_s, style, color=colour, label=f"{label}, limit {limit:g} s")
    a.set_xlabel("unrolled layers (GPT-3 175B shapes)")
    a.set_ylabel("al.plan wall time (s)")
    a.set_title(f"Planning time on {HW}")
    a.legend(fontsize=7)
    short = df[df.share & (df.time_limit_s == df.time_limit_s.min())]
    bottom = None
    for k in PHASES:
        v = short[f"{k}_s"].to_numpy()
        b.bar([str(x) for x in short.layers], v, bottom=bottom, label=k)
        bottom = v if bottom is None else bottom + v
    b.set_xlabel("unrolled layers (shared)")
    b.set_ylabel("seconds")
    b.set_title(f"Where the time goes (limit {short.time_limit_s.min():g} s)")
    b.legend(fontsize=7)
    for share, style in ((True, "o-"), (False, "s--")):
        d = df[(df.share == share) & (df.time_limit_s == df.time_limit_s.max())]
        c.plot(d.layers, d.nodes, style, label="shared layers" if share else "one decision per op")
    c.set_xlabel("unrolled layers")
    c.set_ylabel("decisions (nodes) in the request")
    c.set_yscale("log")
    c.set_title("Model size")
    c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "bench_planner.png", dpi=120)


if __name__ == "__main__":
    OUT = take_out()
    if sys.argv[1:] == ["--plot"]:  # redraw from the committed CSV
        plot(pd.read_csv(RESULTS / "bench_planner.csv"))
    else:
        main(time_limits=tuple(float(x) for x in sys.argv[1:]) or (30.0, 5.0))
