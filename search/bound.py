"""A lower bound on the step time of every layout of a request, from the LP relaxation of the
whole formulation with its resharding (memory left out), solved by HiGHS's dual simplex.

The per-op bound (``Request.lower_bound``: every node at its cheapest strategy, resharding
free) is loose where the cheapest strategies of neighbours disagree (my_transformer on cpu-8:
8-10% below its plans). The LP relaxation keeps the reads: a tensor laid out ``a`` read by a
node in layout ``b`` pays the copy ``a -> copy_id(a, b)`` (one per tensor, source layout and
copy, as ``Request.totals`` charges), and the cover rows of ``search/ilp.py`` (a source laid out
``a`` is read free or one of its copies is made; a reader wanting ``b`` reads a free source or
a copy into it) make the fractional copies cost what they do.

The bound is not the LP's objective as reported but the Lagrangian of its duals,
``b^T y + sum_j min(0, r_j) u_j`` over the reduced costs ``r`` and the variables' upper bounds
``u``: valid for any multipliers, so a solver's tolerances can only lower it. The step's
``T >= C, T >= M`` (overlap) takes ``u`` = every cost summed, which no layout exceeds.

The solve is capped in simplex iterations (deterministic: the same request gives the same
bound on any machine); past the cap there is no LP bound and the caller keeps the per-op one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .clock import charge
from .request import Request

LP_PAIRS = 60_000  # strategy pairs up to which the LP is built (GPT-3 6.7B's 2-D shapes: 51k)
# HiGHS's dual simplex, per iteration and row: 9e-9 s (GPT-3 6.7B on a 2-D v4 shape, 57k rows,
# 1.1k iterations in 0.53 s) to 2.5e-8 s (my_transformer on cpu-8 2x4, 104k rows, 14k
# iterations in 37 s): the larger charged
ROW_ITERATION_S = 2.5e-8
# building it, per variable and row: 5.5e-6 s (my_transformer 1-D, 11k) to 1.1e-5 s (GPT-3
# 6.7B 2-D, 95k)
LP_ELEMENT_S = 1.2e-5


@dataclass
class LPBound:
    bound_s: float  # no layout on the request's mesh is faster (memory aside)
    iterations: int
    rows: int
    variables: int
    wall_s: float


class _Rows:
    """A sparse ``A x <= b`` built row by row."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.b: list[float] = []

    def add(self, plus: list[int], minus: list[int], rhs: float) -> None:
        k = len(self.b)
        self.r.extend([k] * (len(plus) + len(minus)))
        self.c.extend(plus)
        self.c.extend(minus)
        self.v.extend([1.0] * len(plus))
        self.v.extend([-1.0] * len(minus))
        self.b.append(rhs)

    def matrix(self, n: int) -> Any:
        from scipy.sparse import csr_matrix  # heavy: scipy is imported by the first LP (0.3 s)

        return csr_matrix((self.v, (self.r, self.c)), shape=(len(self.b), n))


def lp_bound(req: Request, work_s: float) -> LPBound | None:
    """The LP relaxation's bound on ``req`` (see the module's docstring), or ``None`` where
    building and solving it would take more than ``work_s`` reference seconds (charged to
    the plan's clock) or the solver did not finish."""
    t0 = time.perf_counter()
    size = req.size()
    if size > LP_PAIRS or LP_ELEMENT_S * 2 * size > work_s:
        return None
    nodes = req.nodes
    cand = [req.allowed(n) for n in range(len(nodes))]
    costs = [[req.node_cost(n, s) for s in cand[n]] for n in range(len(nodes))]
    o = req.overlap
    comp: list[float] = []  # per variable: compute seconds, communication seconds
    comm: list[float] = []
    var: list[dict[int, int] | None] = []  # per node: strategy -> variable (None: fixed)
    fixed_c = fixed_m = 0.0
    eq = _Rows()
    for n in range(len(nodes)):
        if len(cand[n]) == 1:
            var.append(None)
            fixed_c += costs[n][0][0]
            fixed_m += costs[n][0][1]
            continue
        ids = {}
        for s, (c, m) in zip(cand[n], costs[n], strict=True):
            ids[s] = len(comp)
            comp.append(c)
            comm.append(m)
        var.append(ids)
        eq.add(list(ids.values()), [], 1.0)

    def X(n: int, strategies) -> tuple[list[int], float]:  # noqa: N802 - the formulation's
        """The variables of node ``n``'s ``strategies``, and the constant (a fixed node)."""
        ids = var[n]
        if ids is None:
            return [], float(cand[n][0] in strategies)
        return [ids[s] for s in strategies if s in ids], 0.0

    rows = _Rows()
    for r in req.reads:
        src: dict[int, list[int]] = {}
        for s in cand[r.src]:
            src.setdefault(r.src_map[s], []).append(s)
        wants = []  # per reader: its strategies by the layout they read
        for n, mp in r.readers:
            by: dict[int, list[int]] = {}
            for s in cand[n]:
                by.setdefault(mp[s], []).append(s)
            wants.append((n, by))
        z: dict[tuple[int, int], int] = {}  # (source layout, copy) -> variable
        for a, sa in src.items():
            ya, ka = X(r.src, sa)
            for n, by in wants:
                free: list[int] = []
                made: dict[int, list[int]] = {}  # copy -> the reader's strategies that make it
                for b, ss in by.items():
                    w = req.copy_id(r, a, b)
                    if r.count * req.read_cost(r, a, w) > 0:
                        made.setdefault(w, []).extend(ss)
                    else:
                        free.extend(ss)
                for w, ss in made.items():
                    if (a, w) not in z:
                        z[(a, w)] = len(comp)
                        comp.append(0.0)
                        comm.append(r.count * req.read_cost(r, a, w))
                    yb, kb = X(n, ss)  # laid out a, read through copy w: z >= ya + yb - 1
                    rows.add(ya + yb, [z[(a, w)]], 1.0 - ka - kb)
                if made:  # cover: laid out a, read free or through one of a's copies
                    yf, kf = X(n, free)
                    rows.add(ya, [z[(a, w)] for w in made] + yf, kf - ka)
        for n, by in wants:  # cover: read as b, from a free source or through a copy into b
            for b, ss in by.items():
                zs, free_src = [], []
                for a, sa in src.items():
                    w = req.copy_id(r, a, b)
                    if (a, w) in z and r.count * req.read_cost(r, a, w) > 0:
                        zs.append(z[(a, w)])
                    else:
                        free_src.extend(sa)
                if zs:
                    yb, kb = X(n, ss)
                    yf, kf = X(r.src, free_src)
                    rows.add(yb, zs + yf, kf - kb)
    t_var = len(comp)  # T: the larger of compute and communication
    # seconds scaled so the costliest choice is ~1: HiGHS's tolerances are absolute (1e-7),
    # and a tiny model's costs are picoseconds
    scale = max(max(comp, default=0.0), max(comm, default=0.0), fixed_c, fixed_m) or 1.0
    cc, cm = np.array(comp + [0.0]) / scale, np.array(comm + [0.0]) / scale
    fixed_c, fixed_m = fixed_c / scale, fixed_m / scale
    for vec, const in ((cc, fixed_c), (cm, fixed_m)):  # C - T <= -fixed, M - T <= -fixed
        nz = np.flatnonzero(vec)
        k = len(rows.b)
        rows.r.extend([k] * (len(nz) + 1))
        rows.c.extend(nz.tolist() + [t_var])
        rows.v.extend(vec[nz].tolist() + [-1.0])
        rows.b.append(-const)
    nv = t_var + 1
    cost = (1.0 - o) * (cc + cm)
    cost[t_var] = o
    if not eq.b:  # every node fixed: nothing to relax
        return None
    a_ub, a_eq = rows.matrix(nv), eq.matrix(nv)
    b_ub, b_eq = np.array(rows.b), np.array(eq.b)
    charge(LP_ELEMENT_S * (nv + len(rows.b)))
    left = work_s - LP_ELEMENT_S * (nv + len(rows.b))
    nrows = len(rows.b) + len(eq.b)
    cap = min(int(left / (ROW_ITERATION_S * nrows)), 2**31 - 1)  # HiGHS's ints are 32-bit
    if cap < 1:
        return None
    bounds = np.zeros((nv, 2))
    bounds[:, 1] = 1.0
    bounds[t_var, 1] = np.inf
    from scipy.optimize import linprog  # heavy: imported by the first LP, as above

    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                  method="highs-ds", options={"maxiter": cap, "presolve": True})  # fmt: skip
    iterations = int(getattr(res, "nit", 0) or 0)
    charge(ROW_ITERATION_S * nrows * min(cap, max(iterations, 1)))
    if res.status != 0 or res.ineqlin is None or res.ineqlin.marginals is None:
        return None
    y_ub = np.minimum(res.ineqlin.marginals, 0.0)  # <= rows: multipliers <= 0 in scipy's sign
    y_eq = res.eqlin.marginals
    reduced = cost - a_ub.T @ y_ub - a_eq.T @ y_eq
    top = float(cc.sum() + cm.sum() + fixed_c + fixed_m)  # T never exceeds every cost summed
    value = float(b_ub @ y_ub + b_eq @ y_eq + np.minimum(reduced[:t_var], 0.0).sum())
    value += min(0.0, float(reduced[t_var])) * top + (1.0 - o) * (fixed_c + fixed_m)
    return LPBound(value * scale, iterations, nrows, nv, time.perf_counter() - t0)
