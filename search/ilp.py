"""The integer program that picks one strategy per node (the only module that imports
OR-Tools).

Formulation, for a :class:`~autolayout.search.request.Request` on one mesh:

Variables
  ``x[n,s]``  bool, node ``n`` runs strategy ``s``.
  ``z[r,a,b]`` bool, read ``r``'s tensor, laid out ``a``, is copied into layout ``b``
              (one per pair with a positive resharding cost).
  ``c[k]``    bool, a resharded copy is alive at a memory row's program point.
  ``T``       int, the larger of compute and communication time.

Constraints
  (one-hot)   ``sum_s x[n,s] = 1`` for every node; ``x[n,s] = 0`` for a forbidden
              strategy (a loop would slice a split stacked axis).
  (read)      ``z[r,a,b] >= X(src, a) + X(reader, b) - 1`` for every reader of ``r``, where
              ``X(src, a)`` sums the ``x`` whose strategy lays the tensor out ``a`` and
              ``X(reader, b)`` those whose strategy reads it as ``b`` — Alpa's linearised edge,
              with one ``z`` per copy rather than per reader, so readers that want the same
              layout share one copy (as XLA's CSE does).
  (cover)     per reader and source layout ``a``: ``sum_b z[r,a,b] + X(reader, free(a)) >=
              X(src, a)`` (laid out ``a``, the reader reads a layout ``a`` gives for free or
              one of ``a``'s copies is made), and per read layout ``b`` the same the other way.
              Implied by (read) for integer ``x``; for the LP relaxation they are what makes
              its bound bind: (read) alone lets fractional ``x`` make every copy free.
  (memory)    at each memory row's point ``p``: ``sum bytes(n,s) x[n,s] + sum bytes_k c[k]
              <= limit``, with ``c[k] >= X(before, b) + X(after, b) - 1 - X(src, b)`` for the
              copy's readers at or before ``p`` and at or after ``p``.
  (overlap)   ``T >= C`` and ``T >= M``.

Objective
  minimise ``o * T + (1 - o) * (C + M)``: the step time of
  :func:`autolayout.cost_models.price` (the full-overlap bound plus ``1 - o`` of the rest), with
  ``C = sum compute(n,s) x[n,s]`` and ``M = sum comm(n,s) x[n,s] + sum count_r cost(a,b) z[r,a,b]``.

Times and bytes are scaled to integers (CP-SAT is an integer solver); the objective is
reported back in seconds. Rows are added lazily by the planner: only where a chosen layout
breaks the limit (the liveness peaks that bind).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .interrupt import interrupted, on_interrupt, restore_handlers
from .liveness import MemoryRow
from .request import Request

_K = 1000  # overlap weights in thousandths


@dataclass
class Solution:
    status: str  # OPTIMAL | FEASIBLE | INFEASIBLE | UNKNOWN (timed out, nothing found)
    choice: list[int] | None
    objective_s: float | None  # the solver's objective, in seconds
    bound_s: float | None
    wall_s: float
    variables: int
    constraints: int
    deterministic_s: float = 0.0  # CP-SAT's deterministic time (reproducible work units)


def workers() -> int:
    """CP-SAT search workers: the machine's cores (at least 1, at most 8)."""
    return max(1, min(8, os.cpu_count() or 1))


def solve(
    req: Request,
    *,
    candidates: Sequence[Sequence[int]] | None = None,
    rows: Sequence[MemoryRow] = (),
    limit_bytes: int | None = None,
    time_limit_s: float = 60.0,
    hint: Sequence[int] | None = None,
    objective: str = "time",
    deterministic: bool = False,
    wall_limit_s: float | None = None,
    element_s: float = 0.0,
    sat_unit: Callable[[int], float] = lambda size: 1.0,
    relative_gap: float = 0.0,
) -> Solution:
    """Solves the request over ``candidates`` (per node, the strategies it may take; all
    allowed ones when ``None``); ``objective="memory"`` minimises the largest memory row.
    ``deterministic``: one worker, seed 0, and ``time_limit_s`` of CP-SAT's deterministic
    time instead of wall time, so the same request gives the same answer on any load.
    Otherwise ``time_limit_s`` is wall time and covers building the model too (its Python
    side takes seconds on 25k nodes): past it, status UNKNOWN and no choice.
    ``wall_limit_s``: a wall-clock backstop for the solve itself (deterministic; otherwise
    the earlier of it and ``time_limit_s``).
    ``element_s`` (deterministic): what the caller charges for building each variable and
    constraint, taken out of ``time_limit_s`` (as wall time covers the building); ``sat_unit``:
    what it charges per unit of CP-SAT's deterministic time, given the model's variables and
    constraints. ``relative_gap``: the solve ends, OPTIMAL, as soon as its objective is within
    that fraction of its bound (CP-SAT's ``relative_gap_limit``; 0: proven exactly)."""
    t0 = time.perf_counter()
    limit = wall_limit_s if deterministic else min(time_limit_s, wall_limit_s or math.inf)
    deadline = None if limit is None else t0 + max(0.05, float(limit))

    def late() -> bool:
        """Whether the wall-clock limit has passed, or a Ctrl-C/SIGTERM came: checked at
        every node, read and pair (~0.1 us; checked once per 64 nodes, a signal waited their
        pricing, seconds on a loaded machine)."""
        return interrupted() or (deadline is not None and time.perf_counter() > deadline)

    def gave_up() -> Solution:
        return Solution("UNKNOWN", None, None, None, time.perf_counter() - t0, 0, 0, 0.0)

    # OR-Tools takes 0.3 s to import: a command that solves no ILP (validate, run, report, a
    # 96-layer plan priced by hand layouts) starts without it
    from ortools.sat.python import cp_model  # heavy: imported by the first solve

    model = cp_model.CpModel()
    nodes = req.nodes
    cand = [list(c) for c in candidates] if candidates is not None else None
    if cand is None:
        cand = [req.allowed(n) for n in range(len(nodes))]
    cset = [set(c) for c in cand]
    costs = []
    for n in range(len(nodes)):
        if late():
            return gave_up()
        costs.append([req.node_cost(n, s) for s in cand[n]])
    pairs = []  # (read, a, b, seconds a step, src strategies, [(reader, strategies)])
    groups = []  # per read: its source's layouts and each reader's (for the cover rows)
    for r in req.reads:
        if late():
            return gave_up()
        src: dict[int, list[int]] = {}
        for s in cand[r.src]:
            src.setdefault(r.src_map[s], []).append(s)
        want: list[tuple[int, dict[int, list[int]]]] = []
        for n, mp in r.readers:
            bl: dict[int, list[int]] = {}
            for s in cand[n]:
                bl.setdefault(mp[s], []).append(s)
            want.append((n, bl))
        targets = {b for _, bl in want for b in bl}
        groups.append((r, src, want))
        for a, sa in src.items():
            for b in targets:
                v = req.read_cost(r, a, b) * r.count
                if v > 0:
                    pairs.append((r, a, b, v, sa, [(n, bl[b]) for n, bl in want if b in bl]))
    if deterministic and element_s:  # the model would take more than the limit to build
        size = sum(len(c) for c in cand if len(c) > 1) + sum(1 + len(p[5]) for p in pairs)
        if element_s * size > time_limit_s:
            # charged as a quarter of an element a pair priced: 4-6 us each against an
            # element's 14-20 us built (tiny GPT and my_transformer on cpu-8)
            spent = time.perf_counter() - t0
            return Solution("UNKNOWN", None, None, None, spent, len(pairs) // 4, 0, 0.0)
    # one scale for every time: the costliest choice fits in ~1e9 units
    hi = sum(max(c + m for c, m in cs) for cs in costs) + sum(p[3] for p in pairs)
    unit = hi / 1e9 if hi > 0 else 1.0

    def q(seconds: float) -> int:
        return round(seconds / unit)

    x: list[dict[int, Any]] = []
    for k in range(len(nodes)):
        if late():
            return gave_up()
        if not cand[k]:
            raise ValueError(f"node {nodes[k].members[0]} has no allowed strategy")
        if len(cand[k]) == 1:
            x.append({cand[k][0]: 1})
            continue
        row = {s: model.new_bool_var(f"x{k}_{s}") for s in cand[k]}
        model.add_exactly_one(list(row.values()))
        x.append(row)

    def X(n: int, strategies) -> Any:  # noqa: N802 - the formulation's name
        terms = [x[n][s] for s in strategies if s in cset[n]]
        return sum(terms) if terms else 0

    comp_terms, comm_terms = [], []
    for k in range(len(nodes)):
        for s, (c, m) in zip(cand[k], costs[k], strict=True):
            v = x[k][s]
            if q(c):
                comp_terms.append((v, q(c)))
            if q(m):
                comm_terms.append((v, q(m)))
    copies: dict[tuple[int, int, int], Any] = {}  # (read, a, b) -> its z
    for i, (_r, a, b, v, sa, wants) in enumerate(pairs):
        if late():
            return gave_up()
        w = q(v)
        if not w:
            continue
        z = copies[id(_r), a, b] = model.new_bool_var(f"z{i}_{a}_{b}")
        ya = X(_r.src, sa)
        for n, ss in wants:
            model.add(z >= ya + X(n, ss) - 1)
        comm_terms.append((z, w))
    for r, src, want in groups:  # the cover rows (see the module's docstring)
        if late():
            return gave_up()
        for n, bl in want:
            for a, sa in src.items():
                zs = [copies[k] for b in bl if (k := (id(r), a, b)) in copies]
                if zs:  # laid out a: read as a free layout, or one of a's copies is made
                    free = [t for b, ss in bl.items() if (id(r), a, b) not in copies for t in ss]
                    model.add(sum(zs) + X(n, free) >= X(r.src, sa))
            for b, ss in bl.items():
                zs = [copies[k] for a in src if (k := (id(r), a, b)) in copies]
                if zs:  # read as b: from a source laid out free for it, or a copy into b
                    free = [t for a, sa in src.items() if (id(r), a, b) not in copies for t in sa]
                    model.add(sum(zs) + X(r.src, free) >= X(n, ss))

    def linear(terms):
        return sum(c * v for v, c in terms) if terms else 0

    C, M = linear(comp_terms), linear(comm_terms)  # noqa: N806
    bound = sum(c for _, c in comp_terms) + sum(c for _, c in comm_terms) + 1
    T = model.new_int_var(0, bound, "T")  # noqa: N806
    model.add(T >= C)
    model.add(T >= M)
    o = round(req.overlap * _K)

    peak = None
    if objective == "memory":
        peak = model.new_int_var(0, 1 << 50, "peak")
    for j, row in enumerate(rows):
        if late():
            return gave_up()
        terms = []
        for n, vec in row.terms.items():
            for s, v in x[n].items():
                if vec[s]:
                    terms.append((v, vec[s]))
        for k, (nbytes, src, same, before, after) in enumerate(row.copies):
            if late():
                return gave_up()
            c = model.new_bool_var(f"c{j}_{k}")
            ys = X(src, same)
            for n1, s1 in before:
                for n2, s2 in after:
                    a1, a2 = X(n1, s1), X(n2, s2)
                    if not (isinstance(a1, int) and a1 == 0) and not (
                        isinstance(a2, int) and a2 == 0
                    ):
                        model.add(c >= a1 + a2 - 1 - ys)
            terms.append((c, nbytes))
        total = linear(terms)
        if objective == "memory":
            model.add(peak >= total)
        elif limit_bytes is not None:
            model.add(total <= int(limit_bytes))
    if objective == "memory":
        model.minimize(peak)
    else:
        model.minimize(o * T + (_K - o) * (C + M))
    if hint is not None:
        for k, s in enumerate(hint):
            for s2, v in x[k].items():
                if not isinstance(v, int):
                    model.add_hint(v, s2 == s)

    solver = cp_model.CpSolver()
    if deterministic:  # one worker, a fixed seed, a budget of deterministic time
        solver.parameters.num_workers = 1
        solver.parameters.random_seed = 0
        size = len(model.proto.variables) + len(model.proto.constraints)
        solver.parameters.max_deterministic_time = max(
            0.01, (time_limit_s - element_s * size) / sat_unit(size)
        )
        net = 60.0 * max(1.0, float(time_limit_s))  # a net, or the caller's wall-clock limit
        if deadline is not None:
            net = min(net, max(0.05, deadline - time.perf_counter()))
        solver.parameters.max_time_in_seconds = net
    else:
        if late():
            return gave_up()
        solver.parameters.max_time_in_seconds = max(0.05, deadline - time.perf_counter())
        solver.parameters.num_workers = workers()
        # the same answer to the same model wherever the solve ends inside its time: a fixed
        # seed and CP-SAT's deterministic parallel search (its workers interleaved)
        solver.parameters.random_seed = 0
        solver.parameters.interleave_search = True
    # our handlers stop the solve (a Ctrl-C CP-SAT caught would end it unseen, and it leaves
    # SIG_DFL behind at the C level: the next Ctrl-C killed the process without a word)
    solver.parameters.catch_sigint_signal = False
    # the LP relaxation of every constraint, cuts included, at every node: with the cover
    # rows it proves what level 1 left open (mlp on cpu-8 data=4 x model=2: OPTIMAL in 2 units
    # of deterministic time; level 1, or level 2 without the cover rows, kept the per-op
    # bound, 3.7x below, after 20)
    solver.parameters.linearization_level = 2
    # the objective is in ~1e9 x _K units, so CP-SAT's max(1, |O|) is |O|: a plain fraction
    solver.parameters.relative_gap_limit = max(0.0, float(relative_gap))
    if interrupted():
        return gave_up()
    try:
        with on_interrupt(solver.stop_search):
            code = solver.solve(model)
    finally:
        restore_handlers()
    dtime = float(solver.response_proto.deterministic_time)
    status = solver.status_name(code)  # OPTIMAL | FEASIBLE | INFEASIBLE | MODEL_INVALID | UNKNOWN
    proto = model.proto
    nvars, ncons = len(proto.variables), len(proto.constraints)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return Solution(status, None, None, None, time.perf_counter() - t0, nvars, ncons, dtime)
    choice = [
        next(s for s, v in row.items() if (v == 1 if isinstance(v, int) else solver.value(v)))
        for row in x
    ]
    scale = unit / _K if objective != "memory" else 1.0
    return Solution(
        status,
        choice,
        solver.objective_value * scale,
        solver.best_objective_bound * scale,
        time.perf_counter() - t0,
        nvars,
        ncons,
        dtime,
    )
