"""The ILP from a seed: the whole formulation where it is small, else neighbourhood rounds
(per node the incumbent's strategy, every strategy one mesh-axis move away, and the seeds'),
with memory rows added at the peak of each solution that breaks the limit."""

from __future__ import annotations

import math
from collections.abc import Sequence

from . import ilp
from .clock import Clock, clock, now
from .liveness import memory_peak, memory_row
from .request import Request
from .seeds import Candidate, _score

FULL_LIMIT = 4000  # strategy pairs up to which the whole formulation goes to the solver
MAX_ROUNDS = 6  # neighbourhood rounds per shape
MAX_ROWS = 12  # memory rows added per solve
ROUND_S = 2.0  # CP-SAT time per neighbourhood round at most
FULL_S = 10.0  # CP-SAT time for a whole (small) formulation at most


def charged_solve(req: Request, **kw) -> ilp.Solution:
    """``ilp.solve`` under the plan's clock: its wall-clock stop, its work charged."""
    c = clock()
    kw["wall_limit_s"] = max(0.05, c.wall_left()) if math.isfinite(c.wall_end) else None
    if c.deterministic:
        kw["element_s"] = Clock.ELEMENT_S  # charged below: the model's building is in the limit
        kw["sat_unit"] = Clock.sat_unit
    sol = ilp.solve(req, deterministic=c.deterministic, **kw)
    if c.wall_left() <= 0:
        c.walled = True  # the stop, not the work, ended this solve
    c.charge(Clock.sat_work(sol.deterministic_s, sol.variables + sol.constraints))
    return sol


def _with_rows(req: Request, rows: list, solve, deadline: float | None = None):
    """Solves (``solve(rows, seconds)``), then again with a memory row at the peak of each
    solution, while the rows change: yields ``(solution, peak bytes)`` each round (peak
    ``None`` when the solver found nothing)."""
    for _ in range(MAX_ROWS):
        left = None if deadline is None else deadline - now()
        if left is not None and left <= 0.05:
            return
        sol = solve(rows, left)
        if sol.choice is None:
            yield sol, None
            return
        mem, at = memory_peak(req, sol.choice)
        yield sol, mem
        if any(r.point == at for r in rows):  # a row at this peak is there already: stop
            return
        rows.append(memory_row(req, at))


def _solve_fitting(
    req: Request,
    limit: int,
    candidates,
    hint: list[int],
    time_limit_s: float,
    rows: list,
    deadline: float | None = None,
    relative_gap: float = 0.0,
) -> tuple[ilp.Solution | None, Candidate | None]:
    """Solves, adding a memory row at the peak of each solution that does not fit, until
    ``deadline`` (each solve ``time_limit_s`` at most; each ends within ``relative_gap`` of
    its bound)."""

    def solve(rows, left):
        t = time_limit_s if left is None else max(0.05, min(time_limit_s, left))
        return charged_solve(req, candidates=candidates, rows=rows, limit_bytes=limit,
                             time_limit_s=t, hint=hint, relative_gap=relative_gap)  # fmt: skip

    sol = None
    for sol, mem in _with_rows(req, rows, solve, deadline):
        if mem is not None and mem <= limit:
            return sol, Candidate(sol.choice, req.objective(sol.choice), mem, "ilp")
    return sol, None


def _neighbours(req: Request, n: int, s: int) -> set[int]:
    """Strategies of node ``n`` that move one mesh axis of strategy ``s`` elsewhere."""
    node = req.nodes[n]
    assign = node.strategies[s].assign
    out = set(node.by_assign.get(assign, [s]))
    for a in req.machine.mesh:
        base = [tuple(x for x in axes if x != a) for axes in assign]
        options = [tuple(base)]
        for k in range(len(base)):
            if a not in assign[k]:
                order = [x for x in req.machine.mesh if x in base[k] or x == a]
                options.append(tuple(base[:k]) + (tuple(order),) + tuple(base[k + 1 :]))
        for opt in options:
            out.update(node.by_assign.get(opt, ()))
    return {x for x in out if x not in node.forbidden}


def refine(
    req: Request,
    limit: int,
    start: Candidate,
    seeds_: Sequence[Candidate],
    time_limit_s: float,
    full_limit: int = FULL_LIMIT,
) -> tuple[Candidate, str, int, int]:
    """The ILP from ``start``: the whole model where small (ended within the call's gap
    of its bound: ``clock().gap``), else neighbourhood rounds (each solved exactly: a
    round's bound is its neighbourhood's, not the shape's)."""
    t_end = now() + time_limit_s
    rows = [memory_row(req, memory_peak(req, start.choice)[1])]
    best = start
    if req.size() <= full_limit:
        sol, cand = _solve_fitting(
            req, limit, None, best.choice, min(time_limit_s, FULL_S), rows, t_end, clock().gap
        )
        status = sol.status if sol is not None else "UNKNOWN"
        if sol is not None and sol.bound_s is not None and status in ("OPTIMAL", "FEASIBLE"):
            req.whole_bound = sol.bound_s
        if cand is not None and _score(cand, limit) <= _score(best, limit):
            best = cand
        if status == "FEASIBLE":
            status = "TIMEOUT"
        if status == "UNKNOWN":
            status = "TIMEOUT" if best.fits(limit) else "INFEASIBLE"
        return best, status, sol.variables if sol else 0, sol.constraints if sol else 0
    status, nvars, ncons = "FEASIBLE", 0, 0
    for _ in range(MAX_ROUNDS):
        left = t_end - now()
        if left <= 0.05:
            status = "TIMEOUT"
            break
        cands = []
        for n in range(len(req.nodes)):
            c = _neighbours(req, n, best.choice[n])
            c.update(sd.choice[n] for sd in seeds_ if sd.choice[n] not in req.nodes[n].forbidden)
            cands.append(sorted(c))
        sol, cand = _solve_fitting(req, limit, cands, best.choice, min(left, ROUND_S), rows, t_end)
        if sol is None:
            status = "TIMEOUT"
            break
        nvars, ncons = max(nvars, sol.variables), max(ncons, sol.constraints)
        if cand is None or _score(cand, limit) >= _score(best, limit):
            if cand is None and sol.status == "UNKNOWN":
                status = "TIMEOUT"
            break
        improved = (best.step_time_s - cand.step_time_s) / max(best.step_time_s, 1e-30)
        best = cand
        if improved < 1e-6:
            break
    return best, status, nvars, ncons


def least_memory(req: Request, start: Candidate, time_limit_s: float = 10.0) -> Candidate:
    """The layout of least peak memory per device in the search space (rows added lazily),
    from ``start``."""
    rows = [memory_row(req, memory_peak(req, start.choice)[1])]
    best = start

    def solve(rows, left):
        return charged_solve(
            req, rows=rows, time_limit_s=left, objective="memory", hint=best.choice
        )

    for sol, mem in _with_rows(req, rows, solve, now() + time_limit_s):
        if mem is not None and mem < best.memory_bytes:
            best = Candidate(sol.choice, req.objective(sol.choice), mem, "least-memory")
    return best
