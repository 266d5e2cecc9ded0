"""A tighter LP for the bound (issue 37): the local polytope of the read edges.

``search/bound.py``'s LP prices a copy ``z >= y_src(a) + y_reader(b) - 1`` with cover rows. The
local polytope (the standard LP of pairwise MAP problems) has a variable ``mu[a, b]`` per read
edge and (source layout, reader's wanted layout) pair, whose sums equal each end's strategies'
(``sum_b mu[a, b] = y_src(a)``, ``sum_a mu[a, b] = y_reader(b)``), and charges each copy at least
its pairs (``z[a, w] >= sum of mu[a, b] over the b read through w``, one copy shared by every
reader of it, as the ILP charges). It is at least as tight, and larger.

For each case of ``whole_ilp.py`` (the README's my_transformer on cpu-8 2x4; LLaMA-3-8B on
h100-64 8x8): the plan ``al.plan`` answers on that mesh, the bound.py LP solved to the end
(dual simplex), the local polytope solved to the end by HiGHS's interior point, and by
PDLP capped at ``--pdlp-iterations`` (each a valid bound: the Lagrangian of its duals).

    python experiments/local_polytope.py --out experiments/results

Writes ``local_polytope.csv`` and ``local_polytope.png`` into ``--out`` (default a fresh
``results/runs/<time>/``). Wall seconds depend on the machine and its load.
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
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from _out import take_out  # noqa: E402
from scipy.optimize import linprog  # noqa: E402
from whole_ilp import CASES, MODELS  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.cost_models import donated_inputs  # noqa: E402
from autolayout.search import bound  # noqa: E402
from autolayout.search import request as rq  # noqa: E402
from autolayout.search import structure as st_mod  # noqa: E402


def local_polytope(req) -> bound.Formulation:
    """The local polytope LP of ``req`` (its matrices: ``.lp()``)."""
    f = bound.Formulation(req)
    for r in req.reads:
        src: dict[int, list[int]] = {}
        for s in f.cand[r.src]:
            src.setdefault(r.src_map[s], []).append(s)
        z: dict[tuple[int, int], int] = {}
        for n, mp in r.readers:
            by: dict[int, list[int]] = {}
            for s in f.cand[n]:
                by.setdefault(mp[s], []).append(s)
            mu = {(a, b): f.new() for a in src for b in by}
            for a, sa in src.items():  # sum_b mu[a, b] = y_src(a)
                ya, ka = f.X(r.src, sa)
                f.eq.add([mu[(a, b)] for b in by], ya, ka)
            for b, sb in by.items():  # sum_a mu[a, b] = y_reader(b)
                yb, kb = f.X(n, sb)
                f.eq.add([mu[(a, b)] for a in src], yb, kb)
            for a in src:
                per_copy: dict[int, list[int]] = {}
                for b in by:
                    w = req.copy_id(r, a, b)
                    if r.count * req.read_cost(r, a, w) > 0:
                        per_copy.setdefault(w, []).append(mu[(a, b)])
                for w, mus in per_copy.items():  # a copy at least its pairs
                    if (a, w) not in z:
                        z[(a, w)] = f.new(r.count * req.read_cost(r, a, w))
                    f.rows.add(mus, [z[(a, w)]], 0.0)
    return f


def run_case(label, model, options, hw_name, shape, iterations: int) -> dict:
    hw = al.hardware(hw_name)
    wl = al.load_workload(str(MODELS / model), target=hw, **options)
    mesh = dict(zip("ab", shape, strict=True))
    plan = al.plan(wl, hw, mesh=mesh)
    g = al.trace(wl)
    st = st_mod.analyse_on(g, hw, donated=donated_inputs(wl, g))
    req = rq.build(st, hw, mesh)
    row = {"case": label, "plan_step_s": plan.predicted["step_time_s"],
           "per_op_bound_s": req.lower_bound(), "pairs": req.size()}  # fmt: skip
    saved = bound.LP_PAIRS
    try:
        bound.LP_PAIRS = 10**9  # dual simplex to the end, whatever the size
        t = time.perf_counter()
        lp = bound.lp_bound(req, 1e6, largest=10**9)
        row.update(lp_bound_s=lp.bound_s, lp_s=time.perf_counter() - t)
    finally:
        bound.LP_PAIRS = saved
    t = time.perf_counter()
    f = local_polytope(req)
    cost, a_ub, b_ub, a_eq, b_eq, bounds = f.lp()
    row.update(local_variables=len(cost), local_nonzeros=a_ub.nnz + a_eq.nnz,
               local_build_s=time.perf_counter() - t)  # fmt: skip
    t = time.perf_counter()
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                  method="highs-ipm")  # fmt: skip
    row["local_ipm_s"] = time.perf_counter() - t
    if res.status == 0:
        row["local_bound_s"] = f.bound_s(res.ineqlin.marginals, res.eqlin.marginals)
    t = time.perf_counter()
    duals = bound._first_order(cost, a_ub, b_ub, a_eq, b_eq, bounds,
                               iterations * bound.NONZERO_ITERATION_S * (a_ub.nnz + a_eq.nnz))  # fmt: skip
    row["local_pdlp_s"] = time.perf_counter() - t
    if duals is not None:
        y_ub, y_eq, row["local_pdlp_iterations"] = duals
        row["local_pdlp_bound_s"] = f.bound_s(y_ub, y_eq)
    step = row["plan_step_s"]
    for k in ("per_op_bound_s", "lp_bound_s", "local_bound_s", "local_pdlp_bound_s"):
        if row.get(k):
            row[k.replace("bound_s", "gap")] = step / row[k] - 1.0
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return row


def plot(df: pd.DataFrame, path: Path) -> None:
    kinds = [("per_op_bound_s", "per-op bound"), ("lp_bound_s", "bound.py's LP"),
             ("local_bound_s", "local polytope (IPM)"),
             ("local_pdlp_bound_s", "local polytope (PDLP, capped)")]  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 3.5))
    x = np.arange(len(df))
    for k, (col, name) in enumerate(kinds):
        ax.bar(x + (k - 1.5) * 0.2, df[col] / df["plan_step_s"], 0.2, label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1 / 1.05, color="k", lw=0.8, ls="--", label="5% below the plan")
    ax.set_xticks(x, df["case"])
    ax.set_ylabel("bound / plan's step time")
    ax.set_ylim(0.5, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    out = take_out()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pdlp-iterations", type=int, default=4000)
    args = ap.parse_args()
    df = pd.DataFrame([run_case(*c, args.pdlp_iterations) for c in CASES])
    df.to_csv(out / "local_polytope.csv", index=False)
    plot(df, out / "local_polytope.png")
    print("written to", out)


if __name__ == "__main__":
    main()
