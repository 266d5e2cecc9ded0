"""Where a plan's gap comes from: the search, or the bound (issue 37).

On one fixed mesh shape, the plan ``al.plan`` answers (its step time, its bound and gap)
beside CP-SAT given the shape's whole request (every strategy of every node, resharding
priced, no memory rows: the plans found fit) for ``--sat-s`` wall seconds on the machine's
cores, and the LP relaxation's bound (``search/bound.py``) solved to the end. Where CP-SAT
finds a plan well under the search's, the search is the gap; where it finds none and proves
no more than the LP, the bound is.

    python experiments/whole_ilp.py --sat-s 240 --out experiments/results
    python experiments/whole_ilp.py --plot --out experiments/results  # the PNG again

Writes ``whole_ilp.csv`` (a row a case) and ``whole_ilp.png`` (each case's step times: the
search's plan, CP-SAT's, and the bounds) into ``--out`` (default a fresh
``results/runs/<time>/``). CP-SAT runs on the wall clock: its answer depends on the machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.cost_models import donated_inputs, price  # noqa: E402
from autolayout.search import bound, ilp  # noqa: E402
from autolayout.search import request as rq  # noqa: E402
from autolayout.search import structure as st_mod  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
# (label, model file, options, hardware, mesh): the README's my_transformer on this machine's
# 8 CPU devices (the plan prints ~10%), and the LLaMA-3-8B shape of the autoparallel
# benchmark (50.8%)
CASES = [
    ("my_transformer cpu-8 2x4", "my_transformer.py", {}, "cpu-8", (2, 4)),
    ("llama3-8b h100-64 8x8", "gpt.py", {"size": "llama3-8b", "scan": True, "batch": 16},
     "h100-64", (8, 8)),
]  # fmt: skip


def run_case(label, model, options, hw_name, shape, sat_s: float) -> dict:
    hw = al.hardware(hw_name)
    wl = al.load_workload(str(MODELS / model), target=hw, **options)
    mesh = dict(zip("ab", shape, strict=True))
    t = time.perf_counter()
    plan = al.plan(wl, hw, mesh=mesh)
    row = {"case": label, "plan_s": time.perf_counter() - t,
           "search_step_s": plan.predicted["step_time_s"],
           "search_bound_s": plan.solver.get("lower_bound_s"),
           "search_bound_kind": plan.solver.get("bound_kind", "")}  # fmt: skip
    g = plan.graph
    st = st_mod.analyse(g, share=True, donated=donated_inputs(wl, g))
    req = rq.build(st, hw, mesh)
    row["strategy_pairs"] = req.size()
    t = time.perf_counter()
    sol = ilp.solve(req, time_limit_s=sat_s, deterministic=False)
    row.update(sat_s=time.perf_counter() - t, sat_status=sol.status, sat_bound_s=sol.bound_s)
    if sol.choice is not None:
        lays, asg = req.layouts_of(sol.choice), req.assigns_of(sol.choice)
        for name, tt in g.tensors.items():
            lays.setdefault(name, ((),) * len(tt.shape))
        priced = price(g, hw, mesh, lays, asg, donated=st.donated)["predicted"]
        row.update(sat_step_s=priced["step_time_s"],
                   sat_memory_gib=priced["memory_bytes_per_device"] / 2**30,
                   sat_fits=priced["memory_bytes_per_device"] <= hw.hbm_limit_bytes)  # fmt: skip
    saved = bound.LP_PAIRS
    bound.LP_PAIRS = 10**9  # solved to the end, whatever its size
    try:
        t = time.perf_counter()
        lp = bound.lp_bound(req, 1e6)
        row.update(lp_s=time.perf_counter() - t, lp_bound_s=lp.bound_s if lp else None)
    finally:
        bound.LP_PAIRS = saved
    best = max(x for x in (row["search_bound_s"], row["sat_bound_s"], row["lp_bound_s"]) if x)
    row["best_bound_s"] = best
    row["search_gap_to_best_bound"] = row["search_step_s"] / best - 1
    if row.get("sat_step_s"):
        row["search_over_sat"] = row["search_step_s"] / row["sat_step_s"] - 1
    return row


XMAX = 1.1  # a longer bar is cut there, its value written beside it


def plot(df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3))
    cols = [("search_step_s", "the search's plan"), ("sat_step_s", "CP-SAT's plan"),
            ("lp_bound_s", "LP bound"), ("sat_bound_s", "CP-SAT's bound")]  # fmt: skip
    for i, (_, r) in enumerate(df.iterrows()):
        base = r["search_step_s"]
        for j, (c, name) in enumerate(cols):
            if pd.notna(r.get(c)):
                y, v = i + 0.2 * j - 0.3, r[c] / base
                ax.barh(y, min(v, XMAX), height=0.18, color=f"C{j}",
                        label=name if i == 0 else None)  # fmt: skip
                ax.text(min(v, XMAX) + 0.004, y, f"{v:.3f}", va="center", fontsize=6)
    ax.set_yticks(range(len(df)), df["case"], fontsize=8)
    ax.set_xlabel(f"step time / the search's plan (bars cut at {XMAX})")
    ax.set_xlim(0.7, XMAX + 0.04)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    out = take_out()
    ap = argparse.ArgumentParser()
    ap.add_argument("--sat-s", type=float, default=240.0, help="CP-SAT's wall seconds a case")
    ap.add_argument("--plot", action="store_true", help="redraw the PNG from the committed CSV")
    o = ap.parse_args()
    if o.plot:
        plot(pd.read_csv(RESULTS / "whole_ilp.csv"), out / "whole_ilp.png")
        return
    rows = []
    for case in CASES:
        rows.append(run_case(*case, o.sat_s))
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "whole_ilp.csv", index=False)
    plot(df, out / "whole_ilp.png")
    print(df.to_string())


if __name__ == "__main__":
    main()
