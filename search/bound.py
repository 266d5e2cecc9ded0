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

Up to :data:`LP_PAIRS` strategy pairs the LP is solved exactly by HiGHS's dual simplex, capped
in iterations; past them (to :data:`FIRST_ORDER_PAIRS`) by PDLP, OR-Tools' first-order
primal-dual method (one thread), capped in iterations too: its duals are approximate, and the
Lagrangian makes any of them a valid bound (my_transformer on cpu-8 2x4, 69k pairs: the exact
LP's 0.4521 s by dual simplex in 36 s; PDLP's 0.4504 in 1200 iterations, 1.8 s). Caps in
iterations are deterministic: the same request and work give the same bound on any machine;
past the cap there is no LP bound (dual simplex) and the caller keeps the per-op one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .clock import active, charge, now
from .request import Request

LP_PAIRS = 60_000  # strategy pairs up to which dual simplex solves it (GPT-3 6.7B's 2-D: 51k)
# past that, PDLP's to this many (LLaMA-3-8B on h100-64 8x8: 78k; its matrix ~10 nonzeros a pair)
FIRST_ORDER_PAIRS = 400_000
# HiGHS's dual simplex, per iteration and row: 9e-9 s (GPT-3 6.7B on a 2-D v4 shape, 57k rows,
# 1.1k iterations in 0.53 s) to 2.5e-8 s (my_transformer on cpu-8 2x4, 104k rows, 14k
# iterations in 37 s): the larger charged
ROW_ITERATION_S = 2.5e-8
# PDLP, per iteration and nonzero: 2.3e-9 s (my_transformer cpu-8 2x4, 658k nonzeros, 800
# iterations in 1.2 s) to 2.6e-9 s (LLaMA-3-8B h100-64 8x8, 582k, 2000 in 3.0 s)
NONZERO_ITERATION_S = 3e-9
# PDLP ends at this relative gap (its own estimate, not the Lagrangian's) or at its cap: at
# 3e-4, LLaMA-3-8B 8x8 0.3177 s in 2300 iterations (the exact LP 0.3188), my_transformer 2x4
# 0.4504 in 1200 (0.4521); at 1e-3 0.3146 and 0.4444; to 1e-6, 12k iterations (20 s)
FIRST_ORDER_GAP = 3e-4
FIRST_ORDER_ITERATIONS = 200  # fewer than this: no bound worth its work (both: below per-op)
# building it, per variable and row, its nodes' costs priced (charged apart, by the request):
# 2.5e-6 s (my_transformer cpu-8 1-D, 12k) to 3.2e-6 s (LLaMA-3-8B h100-64 8x8, 148k)
LP_ELEMENT_S = 4e-6


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


def lp_bound(req: Request, work_s: float, largest: int = LP_PAIRS) -> LPBound | None:
    """The LP relaxation's bound on ``req`` (see the module's docstring), or ``None`` where
    it has more than ``largest`` strategy pairs, where building and solving it would take
    more than ``work_s`` reference seconds (charged to the plan's clock) or the solver did
    not finish."""
    # inside a plan, its clock's reading (work, where it counts work); outside one, none: the
    # build's own charge alone, so that the cap is the same on an idle and a busy machine
    t0, start = time.perf_counter(), now() if active() is not None else None
    size = req.size()
    if size > min(largest, FIRST_ORDER_PAIRS) or LP_ELEMENT_S * 2 * size > work_s:
        return None
    f = Formulation(req)
    cand, X, rows = f.cand, f.X, f.rows  # noqa: N806 - the formulation's
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
                        z[(a, w)] = f.new(r.count * req.read_cost(r, a, w))
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
    lp = f.lp()
    if lp is None:  # every node fixed: nothing to relax
        return None
    cost, a_ub, b_ub, a_eq, b_eq, bounds = lp
    built = LP_ELEMENT_S * (len(cost) + len(b_ub))
    charge(built)
    left = work_s - (now() - start if start is not None else built)  # (first pricings too)
    solve = _dual_simplex if size <= LP_PAIRS else _first_order
    duals = solve(cost, a_ub, b_ub, a_eq, b_eq, bounds, left)
    if duals is None:
        return None
    y_ub, y_eq, iterations = duals
    nrows = len(b_ub) + len(b_eq)
    return LPBound(f.bound_s(y_ub, y_eq), iterations, nrows, len(cost), time.perf_counter() - t0)


class Formulation:
    """An LP relaxation of a request's layouts, as rows are added: a variable per strategy of
    every node with a choice (its strategies sum to 1), fixed nodes as constants, others the
    caller adds (:meth:`new`: a copy, priced as communication) and ``<=`` rows (``rows``);
    :meth:`lp` adds the step time ``T >= C, T >= M`` (overlap) and makes the matrices."""

    def __init__(self, req: Request) -> None:
        self.req = req
        self.cand = [req.allowed(n) for n in range(len(req.nodes))]
        self.comp: list[float] = []  # per variable: compute seconds, communication seconds
        self.comm: list[float] = []
        self.var: list[dict[int, int] | None] = []  # per node: strategy -> variable (None: fixed)
        self.fixed_c = self.fixed_m = 0.0
        self.eq, self.rows = _Rows(), _Rows()
        for n, strategies in enumerate(self.cand):
            costs = [req.node_cost(n, s) for s in strategies]
            if len(strategies) == 1:
                self.var.append(None)
                self.fixed_c += costs[0][0]
                self.fixed_m += costs[0][1]
                continue
            ids = {}
            for s, (c, m) in zip(strategies, costs, strict=True):
                ids[s] = len(self.comp)
                self.comp.append(c)
                self.comm.append(m)
            self.var.append(ids)
            self.eq.add(list(ids.values()), [], 1.0)

    def X(self, n: int, strategies) -> tuple[list[int], float]:  # noqa: N802 - the formulation's
        """The variables of node ``n``'s ``strategies``, and the constant (a fixed node)."""
        ids = self.var[n]
        if ids is None:
            return [], float(self.cand[n][0] in strategies)
        return [ids[s] for s in strategies if s in ids], 0.0

    def new(self, comm_s: float = 0.0) -> int:
        """A further variable in [0, 1], ``comm_s`` seconds of communication at 1."""
        self.comp.append(0.0)
        self.comm.append(comm_s)
        return len(self.comp) - 1

    def lp(self):
        """``(cost, a_ub, b_ub, a_eq, b_eq, bounds)`` in seconds scaled so that the costliest
        choice is ~1 (HiGHS's tolerances are absolute, 1e-7, and a tiny model's costs are
        picoseconds), ``T`` last; ``None`` where every node is fixed."""
        if not self.eq.b:
            return None
        rows, t_var, o = self.rows, len(self.comp), self.req.overlap
        self.scale = scale = max(max(self.comp, default=0.0), max(self.comm, default=0.0),
                                 self.fixed_c, self.fixed_m) or 1.0  # fmt: skip
        cc, cm = np.array(self.comp + [0.0]) / scale, np.array(self.comm + [0.0]) / scale
        fixed_c, fixed_m = self.fixed_c / scale, self.fixed_m / scale
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
        self.constant = (1.0 - o) * (fixed_c + fixed_m)
        bounds = np.zeros((nv, 2))
        bounds[:, 1] = 1.0
        # T never exceeds every cost summed (bounded for PDLP too: its own gap then prices T
        # as the bound does)
        bounds[t_var, 1] = float(cc.sum() + cm.sum() + fixed_c + fixed_m)
        self._lp = (cost, rows.matrix(nv), np.array(rows.b), self.eq.matrix(nv),
                    np.array(self.eq.b), bounds)  # fmt: skip
        return self._lp

    def bound_s(self, y_ub, y_eq) -> float:
        """The Lagrangian of multipliers ``y`` (seconds): ``b^T y + sum_j min(0, r_j) u_j``
        over the reduced costs ``r`` and the variables' upper bounds ``u``, valid for any."""
        cost, a_ub, b_ub, a_eq, b_eq, bounds = self._lp
        y_ub = np.minimum(y_ub, 0.0)  # <= rows: multipliers <= 0 (scipy's sign, PDLP's too)
        reduced = cost - a_ub.T @ y_ub - a_eq.T @ y_eq
        value = float(b_ub @ y_ub + b_eq @ y_eq + (np.minimum(reduced, 0.0) * bounds[:, 1]).sum())
        return (value + self.constant) * self.scale


def _dual_simplex(cost, a_ub, b_ub, a_eq, b_eq, bounds, work_s: float):
    """HiGHS's dual simplex (scipy), capped at what ``work_s`` buys: ``(duals of the <= rows,
    of the = rows, iterations)``, or ``None`` where it did not finish."""
    nrows = len(b_ub) + len(b_eq)
    cap = min(int(work_s / (ROW_ITERATION_S * nrows)), 2**31 - 1)  # HiGHS's ints are 32-bit
    if cap < 1:
        return None
    from scipy.optimize import linprog  # heavy: imported by the first LP, as above

    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds,
                  method="highs-ds", options={"maxiter": cap, "presolve": True})  # fmt: skip
    iterations = int(getattr(res, "nit", 0) or 0)
    charge(ROW_ITERATION_S * nrows * min(cap, max(iterations, 1)))
    if res.status != 0 or res.ineqlin is None or res.ineqlin.marginals is None:
        return None
    return res.ineqlin.marginals, res.eqlin.marginals, iterations


def _first_order(cost, a_ub, b_ub, a_eq, b_eq, bounds, work_s: float):
    """PDLP (OR-Tools, one thread) for the iterations ``work_s`` buys, or to a relative gap
    of :data:`FIRST_ORDER_GAP`: ``(duals of the <= rows, of the = rows, iterations)``,
    ``None`` where the work buys fewer than :data:`FIRST_ORDER_ITERATIONS`. Restarted every
    major iteration (LLaMA-3-8B 8x8 within 0.4% of the exact LP in 2000 iterations, where
    PDLP's default restarts took 4400 to 2%)."""
    from ortools.pdlp import solvers_pb2  # heavy: OR-Tools, imported by the first solve
    from ortools.pdlp.python import pdlp  # heavy: as above
    from scipy.sparse import vstack  # heavy: scipy, as the LP's

    a = vstack([a_ub, a_eq]).tocsc()
    cap = min(int(work_s / (NONZERO_ITERATION_S * max(a.nnz, 1))), 2**31 - 1)
    if cap < FIRST_ORDER_ITERATIONS:
        return None
    # its tolerances are absolute and relative: the costs scaled to 1 at most, and the duals
    # back (where a fixed node set the LP's scale, the choices' costs were far below it)
    k = 1.0 / (float(np.abs(cost).max()) or 1.0)
    qp = pdlp.QuadraticProgram()
    qp.objective_vector = cost * k
    qp.constraint_matrix = a
    qp.constraint_lower_bounds = np.concatenate([np.full(len(b_ub), -np.inf), b_eq])
    qp.constraint_upper_bounds = np.concatenate([b_ub, b_eq])
    qp.variable_lower_bounds = bounds[:, 0]
    qp.variable_upper_bounds = bounds[:, 1]
    params = solvers_pb2.PrimalDualHybridGradientParams()
    params.num_threads = 1
    params.restart_strategy = params.EVERY_MAJOR_ITERATION
    params.termination_criteria.iteration_limit = cap
    optimal = params.termination_criteria.simple_optimality_criteria
    # relative only: the optimum can be far below the costs of the choices it avoids (a
    # copy's 0.5 against a plan's 1e-6), where an absolute 1e-6 ends it at half the bound
    optimal.eps_optimal_relative, optimal.eps_optimal_absolute = FIRST_ORDER_GAP, 0.0
    res = pdlp.primal_dual_hybrid_gradient(qp, params)
    iterations = int(res.solve_log.iteration_count)
    charge(NONZERO_ITERATION_S * a.nnz * max(iterations, 1))
    y = np.asarray(res.dual_solution) / k
    if len(y) != len(b_ub) + len(b_eq) or not np.isfinite(y).all():
        return None
    return y[: len(b_ub)], y[len(b_ub) :], iterations
