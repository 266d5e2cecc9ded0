"""``al.plan``: the layout and mesh shape with the least predicted step time that fits.

Per mesh shape (:mod:`.meshes`):

1. **Seeds.** Mesh-TF rule sets (dim -> mesh axes) priced from the request: no rules, the
   hand layouts that fit the shape (DP, FSDP, Megatron, 2-D, Megatron+FSDP, spatial), expert
   parallelism where there are experts, and a greedy descent that adds or removes one (dim,
   mesh axis) at a time while the step time falls (a layout that does not fit in memory
   counts as slower than any that does).
2. **ILP** (:mod:`.ilp`). Where the whole formulation is small (``full_limit`` strategy
   pairs) one CP-SAT model over every strategy of every node, exact: ``OPTIMAL`` means no
   layout in the search space is faster. Elsewhere a neighbourhood search: CP-SAT over, per
   node, the incumbent's strategy, every strategy that moves one mesh axis to another group,
   and the seeds' strategies; repeated while it improves. The result is then ``FEASIBLE``.
3. **Memory rows** are added where a solution breaks the limit (at its liveness peak) and
   the model solved again, until the solution fits or the model is infeasible.

Shapes are refined best seed first; a shape whose lower bound (``Request.lower_bound``, where
the request is small) is no better than the best found is ``PRUNED``, and one whose best
seed is more than ``prune`` times the best refined step time is recorded with its seed and
not refined (where its lower bound is not known). Every shape tried is kept in
``plan.solver["mesh_shapes_tried"]``. The plan is ``OPTIMAL`` only where its shape's whole
ILP is, and every other shape's too or its bound rules it out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autolayout._errors import RuleError
from autolayout._evaluate import (
    RuleSet,
    check_mesh,
    donated_inputs,
    plan_from_costs,
    price,
)
from autolayout._hardware import Hardware, hardware
from autolayout._ir import Graph
from autolayout._plan import Plan, mesh_text
from autolayout._trace import gc_paused
from autolayout._workload import Workload

from . import ilp
from .baselines import batch_dim, layouts_on, spatial_dims
from .meshes import mesh_shapes
from .request import Request, Structure, analyse, build, memory_peak, memory_row

FULL_LIMIT = 4000  # strategy pairs up to which the whole formulation goes to the solver
MAX_ROUNDS = 6  # neighbourhood rounds per shape
MAX_ROWS = 12  # memory rows added per solve
GREEDY_STEPS = 6  # rule toggles the greedy descent takes at most
GREEDY_DIMS = 8  # the dims (most input bytes first) it toggles
ROUND_S = 2.0  # CP-SAT time per neighbourhood round at most
FULL_S = 10.0  # CP-SAT time for a whole (small) formulation at most
REFINE = 3  # shapes refined by the ILP (best seeds first)
LEAST_MEMORY_S = 1.0  # time left below which nothing-fits skips the least-memory search
FINAL_SHARE = 0.5  # of the time limit kept for pricing the winner exactly, at most
# the time kept for the final pricing, from the analysis's: pricing the winner, the report's
# rows and the collection after the pause take 1.1-1.4x it (GPT-3 96 layers), a fixed part
# (a 1-layer step's 0.1 s), and a fitting hand layout priced exactly besides 0.5x more
FINAL_FACTOR, FINAL_FIXED_S, FINAL_HAND_FACTOR = 1.4, 0.1, 0.5
SEED_SHARE = 0.5  # of the time left that pricing the hand layouts on every shape may take
SWEEP_SHARE = 0.5  # of the time left for the greedy descent on every shape, when nothing fits


@dataclass
class Candidate:
    """One layout on one mesh shape: a strategy per node and what it costs."""

    choice: list[int]
    step_time_s: float
    memory_bytes: int
    source: str  # "rules:..." | "ilp" | hand layout name

    def fits(self, limit: int) -> bool:
        return self.memory_bytes <= limit


@dataclass
class ShapeResult:
    mesh: dict[str, int]
    best: Candidate | None
    status: str  # OPTIMAL | FEASIBLE | TIMEOUT | INFEASIBLE | SKIPPED
    wall_s: float
    variables: int = 0
    constraints: int = 0
    seeds: dict[str, float] = field(default_factory=dict)
    least_memory: int | None = None
    request: Request | None = None
    note: str = ""
    hand: dict[str, Candidate] = field(default_factory=dict)  # the hand-layout seeds
    lower_bound: float | None = None  # no layout on this shape is faster (where computed)
    greedy: dict[str, Candidate] | None = None  # seeds with the greedy descent, once made
    named: bool = False  # the user's mesh: its axis names are kept


# --- the clock ------------------------------------------------------------------------------


class _Clock:
    """Wall time, or (deterministic) a count of work: each CP-SAT solve's deterministic time
    and its model's size, and a fixed charge per priced candidate and per mesh shape, so
    deadlines fall at the same point of the search on any machine and any load."""

    PRICE_S = 0.02  # a priced rule-set candidate
    SHAPE_S = 0.2  # a request built for a mesh shape
    # an ILP's variable or constraint, built in Python: CP-SAT's deterministic time leaves
    # out the model's building, which was most of the wall time (GPT-3 shapes, 2 layers,
    # least-memory models of 150k elements: 3-4 s built, 0.1-0.5 s deterministic; a 20 s
    # limit ran 57-120 s); measured 1.4e-5-2e-5 s an element on the 2-core machine
    ELEMENT_S = 2e-5

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic
        self.virtual = 0.0
        # deterministic: past this wall time every deadline has passed (the limit holds),
        # and ``walled`` says the plan may differ between runs
        self.wall_end = math.inf
        self.walled = False
        self.phases: dict[str, float] = {}  # wall seconds per phase of the plan
        self._mark = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Adds the wall time since the last mark to ``phase``."""
        t = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + t - self._mark
        self._mark = t

    def now(self) -> float:
        if not self.deterministic:
            return time.perf_counter()
        if time.perf_counter() > self.wall_end:
            self.walled = True
            return self.virtual + 1e9  # beyond any deadline
        return self.virtual

    def charge(self, seconds: float) -> None:
        self.virtual += seconds


_CLOCK = _Clock()


def _now() -> float:
    return _CLOCK.now()


def _solve(req: Request, **kw) -> ilp.Solution:
    if _CLOCK.deterministic:
        kw["wall_limit_s"] = max(0.05, _CLOCK.wall_end - time.perf_counter())
    sol = ilp.solve(req, deterministic=_CLOCK.deterministic, **kw)
    if _CLOCK.deterministic and time.perf_counter() >= _CLOCK.wall_end:
        _CLOCK.walled = True  # the backstop, not the work, ended this solve
    _CLOCK.charge(sol.deterministic_s + _Clock.ELEMENT_S * (sol.variables + sol.constraints))
    return sol


# --- rule sets as choices ---------------------------------------------------------------------


def choice_of_rules(req: Request, rs: RuleSet) -> list[int]:
    """The request's strategy per node closest to what ``rs`` does (``al.evaluate``)."""
    st, g = req.structure, req.graph
    choice = []
    for n, node in enumerate(req.nodes):
        first = node.members[0]
        if node.kind == "input":
            lay = rs.layout(g.tensors[first])
            idx = node.by_assign.get(lay, [0])
        else:
            op = st.ops[first]
            assign = tuple(rs.assign(g, st.groups[first]))
            idx = node.by_assign.get(assign, [])
            want = tuple(req.layout_id(rs.layout(g.tensors[t])) for t in op.outputs)
            idx = sorted(idx, key=lambda s: node.strategies[s].outs != want)
        idx = [s for s in idx if s not in node.forbidden] or req.allowed(n)
        choice.append(idx[0])
    return choice


def _score(c: Candidate, limit: int) -> tuple[int, float]:
    """Fitting layouts first, then by step time (a layout that does not fit: by memory)."""
    return (0, c.step_time_s) if c.fits(limit) else (1, float(c.memory_bytes))


def _candidate(req: Request, choice: list[int], source: str) -> Candidate:
    _CLOCK.charge(_Clock.PRICE_S)
    mem, _ = memory_peak(req, choice)
    return Candidate(list(choice), req.objective(choice), mem, source)


def _better(req: Request, choice: list[int], than: Candidate | None, limit: int, source: str):
    """``choice`` as a candidate if it beats ``than`` (memory walked only when it might)."""
    if than is None:
        return _candidate(req, choice, source)
    t = req.objective(choice)
    if than.fits(limit) and t >= than.step_time_s:
        return None
    c = _candidate(req, choice, source)
    return c if _score(c, limit) < _score(than, limit) else None


def _expert_choice(req: Request, base: list[int]) -> list[int] | None:
    """``base`` (DP or FSDP) with expert parallelism: the experts dim split on the trailing
    mesh axes whose product divides it — in the expert weights and in the ops over experts
    but not over tokens (the expert MLP), where the batch keeps the other axes — so what the
    dispatch einsum makes on the batch split moves to the experts split by an all-to-all,
    and back for the combine. Rules cannot
    say this (one tensor holds both dims on one axis), so it is a seed of strategies."""
    g, mesh = req.graph, req.machine.mesh
    n = g.dims.get("experts", 0)
    experts: tuple[str, ...] = ()  # the trailing axes: the batch keeps its leading ones, so
    for a in reversed(list(mesh)):  # moving the rest to the experts is one all-to-all
        if n % (math.prod(mesh[x] for x in experts) * mesh[a]):
            break
        experts = (a, *experts)
    if not experts:
        return None
    rest = tuple(a for a in mesh if a not in experts)
    st = req.structure
    tokens = set()  # the batch inputs' other dims (seq): ops over them are on the token side
    for t in g.inputs:
        tt = g.tensors[t]
        if (tt.path or "").startswith("batch"):
            tokens.update(d for d in tt.dims if d is not None)
    try:
        tokens.discard(batch_dim(g))
    except RuleError:
        pass
    choice = list(base)
    for k, node in enumerate(req.nodes):
        first = node.members[0]
        if node.kind == "input":
            t = g.tensors[first]
            if "experts" not in t.dims:
                continue
            cur = node.strategies[base[k]].assign
            want = tuple(
                experts if d == "experts" else tuple(a for a in axes if a not in experts)
                for d, axes in zip(t.dims, cur, strict=True)
            )
        else:
            groups = st.groups[first]
            if not any(grp.dim == "experts" for grp in groups):
                continue
            if any(grp.dim in tokens for grp in groups):
                continue  # the gate, dispatch and combine stay on the batch split
            want = tuple(
                experts if grp.dim == "experts" else rest if grp.dim == "batch" else ()
                for grp in groups
            )
        idx = [s for s in node.by_assign.get(want, []) if s not in node.forbidden]
        if idx:
            choice[k] = idx[0]
    return choice


def _rule_dims(g: Graph) -> list[str]:
    """Dims the seeds may split: those the inputs carry, largest first."""
    by: dict[str, int] = {}
    for t in g.inputs:
        tt = g.tensors[t]
        for d, s in zip(tt.dims, tt.shape, strict=True):
            if d is not None and s > 1:
                by[d] = by.get(d, 0) + tt.nbytes
    return sorted(by, key=lambda d: -by[d])


def seeds(
    req: Request, limit: int, deadline: float, *, greedy: bool = True, start=None
) -> dict[str, Candidate]:
    """Rule-set layouts on this mesh: none, the hand layouts mapped onto it, and (``greedy``)
    a descent from the best of them that toggles one (dim, mesh axis) at a time."""
    g, mesh = req.graph, req.machine.mesh
    out: dict[str, Candidate] = {}

    def rules_choice(rules) -> list[int] | None:
        try:
            rs = RuleSet(g, mesh, rules)
        except RuleError:
            return None
        return choice_of_rules(req, rs)

    hand: dict[str, list] = {"replicated": []}
    try:
        hand.update(layouts_on(g, mesh))
    except RuleError:
        pass
    for name, rules in hand.items():
        choice = rules_choice(rules)
        if choice is not None:
            out[name] = _candidate(req, choice, name)
            out[name].rules = dict(rules)  # type: ignore[attr-defined]
    for base in ("dp", "fsdp"):  # expert parallelism, where there are experts
        if base in out and "experts" in g.dims:
            choice = _expert_choice(req, out[base].choice)
            if choice is not None:
                c = out[f"expert_{base}"] = _candidate(req, choice, f"expert_{base}")
                c.rules = dict(out[base].rules)  # type: ignore[attr-defined]
                c.exact = False  # type: ignore[attr-defined]  # not a rule set
    if not greedy or not out:
        return out
    names = list(mesh)
    dims = _rule_dims(g)[:GREEDY_DIMS]
    best = min(out.values(), key=lambda c: _score(c, limit))
    rules: dict[str, tuple[str, ...]] = dict(best.rules)  # type: ignore[attr-defined]
    moved = False
    for _ in range(GREEDY_STEPS):
        if _now() > deadline:
            break
        trial_best = None
        for a in names:
            for d in dims:
                cur = rules.get(d, ())
                new = (
                    tuple(x for x in cur if x != a)
                    if a in cur
                    else tuple(x for x in names if x in cur or x == a)
                )
                trial = dict(rules)
                if new:
                    trial[d] = new
                else:
                    trial.pop(d, None)
                choice = rules_choice(list(trial.items()))
                if choice is None:
                    continue
                bar = trial_best[1] if trial_best is not None else best
                c = _better(req, choice, bar, limit, "rules")
                if c is not None:
                    trial_best = (trial, c)
        if trial_best is None:
            break
        (rules, best), moved = trial_best, True
    if moved:
        best.source = "rules:" + ",".join(f"{d}={'x'.join(x)}" for d, x in rules.items())
        out["greedy"] = best
    return out


# --- the ILP with memory rows -------------------------------------------------------------


def _with_rows(req: Request, rows: list, solve, deadline: float | None = None):
    """Solves (``solve(rows, seconds)``), then again with a memory row at the peak of each
    solution, while the rows change: yields ``(solution, peak bytes)`` each round (peak
    ``None`` when the solver found nothing)."""
    for _ in range(MAX_ROWS):
        left = None if deadline is None else deadline - _now()
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
) -> tuple[ilp.Solution | None, Candidate | None]:
    """Solves, adding a memory row at the peak of each solution that does not fit, until
    ``deadline`` (each solve ``time_limit_s`` at most)."""

    def solve(rows, left):
        t = time_limit_s if left is None else max(0.05, min(time_limit_s, left))
        return _solve(
            req, candidates=candidates, rows=rows, limit_bytes=limit, time_limit_s=t, hint=hint
        )

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
    """The ILP from ``start``: the whole model where small, else neighbourhood rounds."""
    t_end = _now() + time_limit_s
    rows = [memory_row(req, memory_peak(req, start.choice)[1])]
    best = start
    if req.size() <= full_limit:
        sol, cand = _solve_fitting(
            req, limit, None, best.choice, min(time_limit_s, FULL_S), rows, t_end
        )
        status = sol.status if sol is not None else "UNKNOWN"
        if cand is not None and _score(cand, limit) <= _score(best, limit):
            best = cand
        if status == "FEASIBLE":
            status = "TIMEOUT"
        if status == "UNKNOWN":
            status = "TIMEOUT" if best.fits(limit) else "INFEASIBLE"
        return best, status, sol.variables if sol else 0, sol.constraints if sol else 0
    status, nvars, ncons = "FEASIBLE", 0, 0
    for _ in range(MAX_ROUNDS):
        left = t_end - _now()
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
        return _solve(req, rows=rows, time_limit_s=left, objective="memory", hint=best.choice)

    for sol, mem in _with_rows(req, rows, solve, _now() + time_limit_s):
        if mem is not None and mem < best.memory_bytes:
            best = Candidate(sol.choice, req.objective(sol.choice), mem, "least-memory")
    return best


# --- the plan ----------------------------------------------------------------------------------


def _axis_names(g: Graph, r: ShapeResult, choice: list[int]) -> dict[str, str]:
    """Generic mesh axes named after what they split: the batch only ``data``, the batch and
    weights ``fsdp``, a conv's spatial dims only (of the inputs, or where no input is split,
    of the activations) ``space``, else ``model``. A mesh the user gave keeps its names."""
    req = r.request
    if r.named:
        return {a: a for a in req.machine.mesh}
    batch = None
    try:
        batch = batch_dim(g)
    except RuleError:
        pass
    space = {d for sl in spatial_dims(g) for d in sl}
    layouts = req.layouts_of(choice)
    splits: dict[str, set[str]] = {a: set() for a in req.machine.mesh}
    for t in g.inputs:
        tt = g.tensors[t]
        for d, axes in zip(tt.dims, layouts[t], strict=True):
            for a in axes:
                splits[a].add("batch" if d == batch else "space" if d in space else "param")
    quiet = [a for a, s in splits.items() if not s]
    if quiet and space:  # an axis no input uses may split the volume inside the step
        for t, lay in layouts.items():
            for d, axes in zip(g.tensors[t].dims, lay, strict=True):
                for a in axes:
                    if a in quiet and d in space:
                        splits[a].add("space")
    if quiet:  # an axis no tensor uses at all is marked, not named after a role
        touched = {a for lay in layouts.values() for axes in lay for a in axes}
        for a in quiet:
            if a not in touched:
                splits[a].add("unused")
    out: dict[str, str] = {}
    used: set[str] = set()
    for a in req.machine.mesh:
        s = splits[a]
        name = (
            "data" if s == {"batch"}
            else "fsdp" if s == {"batch", "param"}
            else "space" if s == {"space"}
            else "unused" if s == {"unused"}
            else "model"
        )  # fmt: skip
        # an axis that splits no input splits activations only: model parallelism too
        k, base = 2, name
        while name in used:
            name, k = f"{base}{k}", k + 1
        used.add(name)
        out[a] = name
    return out


def plan(
    workload: Workload,
    hw: Hardware | str,
    *,
    mesh: Mapping[str, int] | None = None,
    memory_limit: int | None = None,
    time_limit_s: float = 60.0,
    share: bool = True,
    graph: Graph | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    prune: float = 1.5,
    full_limit: int = FULL_LIMIT,
    refine_shapes: int = REFINE,
    objective: str = "time",
    deterministic: bool = False,
) -> Plan:
    """Searches layouts and mesh shapes for the least predicted step time that fits in
    memory (``memory_limit`` bytes per device; default the profile's HBM x headroom).

    ``objective="memory"`` is Mesh-TF's auto_mtf objective instead: the least peak memory
    per device (ties: the faster), whether or not it fits.

    ``deterministic``: the same plan on every run and machine load. ``time_limit_s`` then
    counts work, not wall time (CP-SAT's deterministic time, one worker, a fixed seed, and a
    fixed charge per candidate priced), and tracing is not counted; the wall clock still
    holds the limit: where it comes first, ``plan.solver["deterministic"]`` is False and
    ``plan.solver["stopped"]`` says so.
    """
    if objective not in ("time", "memory"):
        raise ValueError(f"objective must be 'time' or 'memory', got {objective!r}")
    global _CLOCK
    saved, _CLOCK = _CLOCK, _Clock(deterministic)
    try:
        with gc_paused():
            p = _plan(workload, hw, mesh, memory_limit, time_limit_s, share, graph, progress,
                      prune, full_limit, refine_shapes, objective)  # fmt: skip
        _CLOCK.mark("final")  # pricing the winner exactly, the report's tables
        p.solver["phases_s"] = dict(_CLOCK.phases)
        if _CLOCK.walled:
            p.solver["deterministic"] = False
            p.solver["stopped"] = (
                "the wall-clock limit came before the work limit: this plan may differ "
                "between runs (a larger --time-limit gives a reproducible one)"
            )
        return p
    finally:
        _CLOCK = saved


def _plan(workload, hw, mesh, memory_limit, time_limit_s, share, graph, progress, prune,
          full_limit, refine_shapes, objective) -> Plan:  # fmt: skip
    t0 = time.perf_counter()
    hw = hardware(hw) if isinstance(hw, str) else hw
    if graph is None:
        from autolayout._trace import trace

        graph = trace(workload)
    t_trace = time.perf_counter() - t0
    _CLOCK.mark("trace")
    limit = int(memory_limit if memory_limit is not None else hw.hbm_limit_bytes)
    donated = donated_inputs(workload, graph)
    ta = time.perf_counter()
    st = analyse(graph, share=share, donated=donated)
    _CLOCK.mark("analyse")
    shapes = [check_mesh(hw, mesh)] if mesh is not None else mesh_shapes(hw)
    deadline = (_now() if _CLOCK.deterministic else t0) + time_limit_s
    # time for the final exact pricing, walks like analyse's, and for pricing a fitting hand
    # layout exactly while one may fit
    analyse_s, cap = time.perf_counter() - ta, FINAL_SHARE * time_limit_s
    final = min(FINAL_FIXED_S + FINAL_FACTOR * analyse_s, cap)
    hand_s = min(FINAL_HAND_FACTOR * analyse_s, cap - final)
    if _CLOCK.deterministic:  # work sets the deadlines; the wall clock is a backstop
        _CLOCK.wall_end = t0 + time_limit_s - final - hand_s
        hand_s = 0.0
    else:
        deadline -= final + hand_s
    slots: list[ShapeResult | None] = [None] * len(shapes)
    # 1. the hand layouts on every shape, in half the time left at most (the rest refines)
    seed_deadline = _now() + SEED_SHARE * (deadline - _now())
    for k, i in enumerate(seed_order(shapes)):
        shape = shapes[i]
        ts = time.perf_counter()
        if _now() > seed_deadline and k:
            note = f"time limit (seeding takes {SEED_SHARE:.0%} of the time limit at most)"
            slots[i] = ShapeResult(dict(shape), None, "SKIPPED", 0.0, note=note)
            continue
        req = build(st, hw, shape)
        _CLOCK.charge(_Clock.SHAPE_S)
        sd = seeds(req, limit, deadline, greedy=False)
        best = min(sd.values(), key=lambda c: _score(c, limit)) if sd else None
        r = ShapeResult(dict(shape), best, "SEEDED", time.perf_counter() - ts, request=req,
                        named=mesh is not None)  # fmt: skip
        r.seeds = {name: c.step_time_s for name, c in sd.items()}
        r.hand = dict(sd)
        slots[i] = r
        if progress:
            progress({"stage": "seed", "mesh": dict(shape), "done": k + 1, "of": len(shapes)})
    results: list[ShapeResult] = slots  # type: ignore[assignment]  # in enumeration order
    _CLOCK.mark("seed")
    if not any(c.fits(limit) for r in results for c in (r.hand or {}).values()):
        deadline += hand_s  # no hand layout to price exactly at the end (_hand_exactly)
    if objective == "memory":
        return _least_memory_plan(workload, graph, hw, results, limit, deadline, t0, t_trace, st,
                                  refine_shapes, progress)  # fmt: skip
    # 2. greedy rules and the ILP on the shapes with the best seeds
    order = sorted((r for r in results if r.best is not None), key=lambda r: _score(r.best, limit))
    if order and not any(r.best.fits(limit) for r in order):
        order = _sweep(order, limit, deadline)
    best_time = math.inf
    refined = 0  # shapes refined so far (a pruned one takes no turn)
    for k, r in enumerate(order):
        ts = time.perf_counter()
        if _now() < deadline and _pruned(r, best_time, full_limit):
            continue
        if refined >= refine_shapes:
            r.status, r.note = "SEEDED", f"not among the {refine_shapes} best seeded shapes"
            continue
        if r.lower_bound is None and r.best.fits(limit) and r.best.step_time_s > prune * best_time:
            r.status, r.note = "SEEDED", f"best seed {r.best.step_time_s / best_time:.2f}x the best"
            continue
        left = deadline - _now()
        if left <= 0.1:
            r.status, r.note = "SEEDED", "time limit"
            continue
        turns = min(len(order) - k, refine_shapes - refined)  # this one and those to come
        refined += 1
        if r.greedy is None:  # made already where the sweep reached the shape
            r.greedy = seeds(r.request, limit, _now() + left / turns / 3)
            r.seeds.update({name: c.step_time_s for name, c in r.greedy.items()})
        sd = r.greedy
        start = min(sd.values(), key=lambda c: _score(c, limit))
        best, status, nv, nc = refine(
            r.request, limit, start, list(sd.values()), (deadline - _now()) / turns, full_limit
        )
        r.best, r.status, r.variables, r.constraints = best, status, nv, nc
        r.wall_s += time.perf_counter() - ts
        if best.fits(limit):
            best_time = min(best_time, best.step_time_s)
        if progress:
            progress({"stage": "solve", "mesh": r.mesh, "done": refined,
                      "of": min(len(order), refine_shapes), "step_time_s": best.step_time_s})  # fmt: skip
    _CLOCK.mark("refine")
    feasible = [r for r in results if r.best is not None and r.best.fits(limit)]
    if feasible:
        win = min(feasible, key=lambda r: r.best.step_time_s)
        status = win.status if win.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT") else "FEASIBLE"
        # optimal on its shape; optimal overall where every other shape was solved exactly
        # or its lower bound rules it out (not where one was only seeded, or skipped)
        if status == "OPTIMAL" and any(
            r is not win and r.status not in ("OPTIMAL", "PRUNED") for r in results
        ):
            status = "FEASIBLE"
    else:
        # nothing fits: report the layout that needs the least memory, and how much
        win = min((r for r in results if r.best is not None), key=lambda r: r.best.memory_bytes)
        left = deadline - _now()
        if left >= LEAST_MEMORY_S:  # the ILP's model alone takes seconds to build on 25k nodes
            win.best = least_memory(win.request, win.best, time_limit_s=left)
        else:
            win.note = "time limit: least memory of the layouts tried (no least-memory search)"
        win.least_memory = win.best.memory_bytes
        status = "INFEASIBLE"
        _CLOCK.mark("least_memory")
    stopped = ""
    if status == "TIMEOUT" and _now() < deadline - 0.05:  # TIMEOUT is the time limit alone
        status = "FEASIBLE"
        stopped = (
            "the search on the winning shape ended before its proof (its share of the time "
            "limit, or its rounds), with time left: best found, not proven optimal"
        )
    p = _to_plan(workload, graph, hw, win, results, status, limit, t0, t_trace, st)
    if stopped:
        p.solver["stopped"] = stopped
    return p


def _pruned(r: ShapeResult, best_time: float, full_limit: int) -> bool:
    """Marks ``r`` PRUNED when no layout on its shape can beat ``best_time``: its request's
    lower bound (every node at its cheapest strategy, resharding free) is at least that.
    Computed where the request is small enough for the whole ILP (whose node costs it
    shares); the bound ignores resharding and memory, so it rules out few shapes of a large
    model, and pricing every strategy there takes seconds."""
    req = r.request
    if req is None or not math.isfinite(best_time) or req.size() > full_limit:
        return False
    if r.lower_bound is None:
        r.lower_bound = req.lower_bound()
    if r.lower_bound < best_time:
        return False
    r.status = "PRUNED"
    r.note = f"lower bound {r.lower_bound:.4g} s >= the best found {best_time:.4g} s"
    return True


def seed_order(shapes: Sequence[Mapping[str, int]]) -> list[int]:
    """The order mesh shapes are seeded in (indices into ``shapes``): two axes first, then
    one, then three; within each, the balanced ones (largest axis over smallest) first, then
    those with the smaller last axis (the hand layouts' model axis: 32 x 16 before 16 x 32).

    A short time limit seeds only the first few (GPT-3 at 96 layers on tpu-v4-1024 at 5 s:
    one). A 2-D shape's seeds hold the 1-D layouts too (DP, FSDP and Megatron over both
    axes) besides 2-D and Megatron+FSDP, and a large model's best shape is a balanced 2-D
    one (GPT-3 24-96 layers: 32 x 16), which 1-D first left unseeded at 96 layers (the
    5 s plan reported 357 GiB where 32 x 16 needs 58)."""
    rank = {2: 0, 1: 1}
    return sorted(
        range(len(shapes)),
        key=lambda i: (
            rank.get(len(shapes[i]), len(shapes[i])),
            max(shapes[i].values()) / min(shapes[i].values()),
            list(shapes[i].values())[-1],
            i,
        ),
    )


def _sweep(order: list[ShapeResult], limit: int, deadline: float) -> list[ShapeResult]:
    """Nothing the hand layouts give fits on any shape: the shapes ranked by what the greedy
    descent from them reaches, in ``SWEEP_SHARE`` of the time left. A hand seed's memory says
    little about that (GPT-3 24 layers on tpu-v4-1024: a 101.6 GiB seed descends to 31.3 GiB,
    a 56.0 GiB one to 44.3), so refining the best hand seeds reported 44.3 GiB as the least.
    Shapes whose hand seeds agree in memory and time (32x16, 2x16x16, 4x8x16, ...: they
    descend alike) go after one of each; a shape not reached keeps its hand seed."""
    end = _now() + SWEEP_SHARE * (deadline - _now())
    seen: set[tuple] = set()
    first, rest = [], []
    for r in order:
        key = (r.best.memory_bytes, r.best.step_time_s)
        (rest if key in seen else first).append(r)
        seen.add(key)
    for r in first + rest:
        if _now() > end:
            break
        sd = r.greedy = seeds(r.request, limit, end)
        r.seeds.update({name: c.step_time_s for name, c in sd.items()})
        best = min(sd.values(), key=lambda c: _score(c, limit))
        if _score(best, limit) < _score(r.best, limit):
            r.best = best
    return sorted(order, key=lambda r: _score(r.best, limit))


def _least_memory_plan(workload, g, hw, results, limit, deadline, t0, t_trace, st, refine_shapes,
                       progress) -> Plan:  # fmt: skip
    """``objective="memory"``: on the shapes whose seeds need least memory, the ILP that
    minimises the peak memory row (rows added lazily)."""
    seeded = [r for r in results if r.best is not None]
    for r in seeded:  # the seed needing least memory (ties: the faster)
        r.best = min(r.hand.values(), key=lambda c: (c.memory_bytes, c.step_time_s))
    order = sorted(seeded, key=lambda r: (r.best.memory_bytes, r.best.step_time_s))
    for k, r in enumerate(order[:refine_shapes]):
        left = deadline - _now()
        ts = time.perf_counter()
        if left <= 0.1:
            r.note = "time limit"
            continue
        r.best = least_memory(
            r.request, r.best, time_limit_s=left / (min(len(order), refine_shapes) - k)
        )
        r.status = "FEASIBLE"
        r.wall_s += time.perf_counter() - ts
        if progress:
            progress({"stage": "solve", "mesh": r.mesh, "done": k + 1,
                      "of": min(len(order), refine_shapes), "step_time_s": r.best.step_time_s})  # fmt: skip
    win = min(order, key=lambda r: (r.best.memory_bytes, r.best.step_time_s))
    plan = _to_plan(workload, g, hw, win, results, "FEASIBLE", limit, t0, t_trace, st,
                    check_hand=False)  # fmt: skip
    plan.solver["objective"] = "memory"
    if not plan.predicted["fits"]:
        plan.status = "INFEASIBLE"
        plan.solver["status"] = "INFEASIBLE"
        plan.solver["least_memory_bytes"] = plan.predicted["memory_bytes_per_device"]
    return plan


def _hand_exactly(g: Graph, hw: Hardware, results, limit: int, st: Structure):
    """The best fitting hand-layout seed, priced as ``al.evaluate`` prices its rules (every
    tensor laid out by the rules, none chosen): (step time, shape result, name, mesh, rules,
    layouts, priced, axis names), or None. The request's strategies approximate a rule set (an output the
    rules lay out unlike its op's split), so the plan is never worse than this."""
    best = None
    for r in results:
        for name, c in (r.hand or {}).items():
            if (
                getattr(c, "exact", True)
                and c.fits(limit)
                and (best is None or c.step_time_s < best[0].step_time_s)
            ):
                best = (c, r, name)
    if best is None:
        return None
    c, r, name = best
    names = _axis_names(g, r, c.choice)
    mesh = {names[a]: n for a, n in r.mesh.items()}
    rules = [(d, tuple(names[a] for a in axes)) for d, axes in dict(c.rules).items()]
    rs = RuleSet(g, mesh, rules)
    layouts = {t: rs.layout(tt) for t, tt in g.tensors.items()}
    priced = price(g, hw, mesh, layouts, lambda op, groups: rs.assign(g, groups),
                   donated=st.donated)  # fmt: skip
    return priced["predicted"]["step_time_s"], r, name, mesh, rs.rules, layouts, priced, names


def canonical(req: Request, choice: list[int]) -> list[int]:
    """``choice`` with ties broken by a fixed order: a node moves to a strategy of lower
    position where its own price and its reads' cost neither more compute nor more
    communication, and the peak memory does not grow. Equal-cost layouts are many (a weight kept
    whole or split where nothing else changes) and the search, on wall-clock time and
    several workers, lands on a different one on each run; this makes it one where the
    search ends inside its limits (where a limit binds, ``deterministic=True`` does)."""
    reads_of: dict[int, list] = {}
    for r in req.reads:
        for n in {r.src, *(n for n, _ in r.readers)}:
            reads_of.setdefault(n, []).append(r)

    def local(n: int) -> tuple[float, float]:
        c, m = req.node_cost(n, choice[n])
        for r in reads_of.get(n, ()):
            src = r.src_map[choice[r.src]]
            for w in {mp[choice[k]] for k, mp in r.readers}:
                m += r.count * req.read_cost(r, src, w)
        return c, m

    choice = list(choice)
    peak = memory_peak(req, choice)[0]
    for n in range(len(req.nodes)):
        now = choice[n]
        c0, m0 = local(n)
        tol_c, tol_m = 1e-12 * (abs(c0) + 1e-30), 1e-12 * (abs(m0) + 1e-30)
        for s in sorted(req.allowed(n)):
            if s >= now:
                break
            choice[n] = s
            c, m = local(n)
            if c <= c0 + tol_c and m <= m0 + tol_m:
                p = memory_peak(req, choice)[0]
                if p <= peak:
                    peak = p
                    break
            choice[n] = now
    return choice


def _to_plan(workload, g, hw, win: ShapeResult, results, status, limit, t0, t_trace,
             st: Structure, check_hand: bool = True):  # fmt: skip
    req = win.request
    choice = win.best.choice
    if win.best.source == "ilp" and status != "INFEASIBLE":  # seeds are canonical as written
        choice = canonical(req, choice)
    if choice != win.best.choice:
        mem = memory_peak(req, choice)[0]
        win.best = Candidate(choice, req.objective(choice), mem, win.best.source)
    names = _axis_names(g, win, choice)
    layouts, assigns = req.layouts_of(choice, names), req.assigns_of(choice, names)
    mesh = {names[a]: n for a, n in win.mesh.items()}
    for t in g.tensors:
        if t not in layouts:
            layouts[t] = ((),) * len(g.tensors[t].shape)
    priced = price(g, hw, mesh, layouts, assigns, donated=st.donated)
    rules, exceptions = derive_rules(g, mesh, layouts)
    hand = None
    if check_hand and status != "INFEASIBLE":
        hand = _hand_exactly(g, hw, results, limit, st)
    source = "search"
    if hand is not None:
        mem, hand_mem = (x["predicted"]["memory_bytes_per_device"] for x in (priced, hand[6]))
        faster = hand[0] < priced["predicted"]["step_time_s"] * (1 - 1e-9)
        if hand_mem <= limit and (faster or mem > limit):
            _, win, name, mesh, rules, layouts, priced, names = hand
            c = win.hand[name]
            win.best = Candidate(c.choice, hand[0], hand_mem, name)
            exceptions = []
            source = f"hand layout {name!r}: its rules, priced exactly, beat the search's best"
            status = "FEASIBLE"
    tried = []
    for r in results:
        row = {"mesh": {names.get(a, a) if r is win else a: n for a, n in r.mesh.items()},
               "status": r.status, "wall_s": r.wall_s, "variables": r.variables,
               "constraints": r.constraints, "seeds": r.seeds, "note": r.note}  # fmt: skip
        if r.lower_bound is not None:
            row["lower_bound_s"] = r.lower_bound
        if r.best is not None:
            row["step_time_s"] = r.best.step_time_s
            row["memory_bytes_per_device"] = r.best.memory_bytes
            row["fits"] = r.best.fits(limit)
        row["chosen"] = r is win
        tried.append(row)
    solver_source = source
    priced["predicted"]["memory_limit_bytes"] = limit
    priced["predicted"]["fits"] = priced["predicted"]["memory_bytes_per_device"] <= limit
    solver = {
        "status": status,
        "wall_s": time.perf_counter() - t0,
        "trace_s": t_trace,
        "deterministic": _CLOCK.deterministic,
        "variables": win.variables,
        "constraints": win.constraints,
        "nodes": len(win.request.nodes),
        "ops": len(g.ops),
        "shared": st.share,
        "objective_s": win.best.step_time_s,
        "mesh_shapes_tried": tried,
        "exceptions": [[p, [list(a) for a in lay]] for p, lay in exceptions],
        "source": solver_source,
    }
    if win.least_memory is not None:
        solver["least_memory_bytes"] = win.least_memory
    return plan_from_costs(workload, g, hw, mesh, rules, layouts, priced, status, solver)


def derive_rules(g: Graph, mesh: dict[str, int], layouts) -> tuple[list, list]:
    """Mesh-TF rules that reproduce the inputs' layouts, and the inputs they do not.

    A dim's rule is the mesh axes most of its bytes (over the inputs) are split on, rules
    ordered by those bytes; an input whose layout the rules (applied in order, as
    ``al.evaluate`` does) do not give is an exception ``(path, layout)``.
    """
    votes: dict[str, dict[tuple[str, ...], int]] = {}
    for t in g.inputs:
        tt = g.tensors[t]
        for d, axes in zip(tt.dims, layouts[t], strict=True):
            if d is not None:
                v = votes.setdefault(d, {})
                v[tuple(axes)] = v.get(tuple(axes), 0) + tt.nbytes
    rules = []
    for d, v in votes.items():
        axes = max(v, key=lambda a: (v[a], -len(a)))
        if axes:
            rules.append((d, axes))
    rules.sort(key=lambda r: -sum(votes[r[0]].values()))
    try:
        rs = RuleSet(g, mesh, rules)
    except RuleError:
        rs = None
    exceptions = []
    for t in g.inputs:
        tt = g.tensors[t]
        if rs is None or rs.layout(tt) != tuple(layouts[t]):
            exceptions.append((tt.path or t, tuple(tuple(a) for a in layouts[t])))
    return rules, exceptions


def compare(
    workload: Workload,
    hw: Hardware | str,
    *,
    time_limit_s: float = 60.0,
    graph: Graph | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    auto: Plan | None = None,
):
    """One row per layout: the planner's and each standard one (``search.baselines``), all
    priced by the same cost model. Columns: layout, mesh, status, step_time_s, compute_s,
    comm_s, exposed_comm_share, memory_gib, fits, mfu."""
    import pandas as pd

    from autolayout._evaluate import evaluate

    from .baselines import standard_layouts

    hw = hardware(hw) if isinstance(hw, str) else hw
    if graph is None:
        from autolayout._trace import trace

        graph = trace(workload)
    if auto is None:
        auto = plan(workload, hw, time_limit_s=time_limit_s, graph=graph, progress=progress)
    plans = {"auto": auto}
    for name, (mesh, rules) in standard_layouts(graph, hw.num_devices).items():
        plans[name] = evaluate(workload, hw, mesh=mesh, rules=rules, graph=graph)
    rows = []
    for name, p in plans.items():
        s = p.predicted
        rows.append(
            {
                "layout": name,
                "mesh": mesh_text(p.mesh),
                "status": p.status,
                "step_time_s": s["step_time_s"],
                "compute_s": s["compute_s"],
                "comm_s": s["comm_s"],
                "exposed_comm_share": s["exposed_comm_s"] / s["step_time_s"]
                if s["step_time_s"] > 0
                else 0.0,
                "memory_gib": s["memory_bytes_per_device"] / 2**30,
                "fits": bool(s["fits"]),
                "mfu": s["mfu"],
            }
        )
    return pd.DataFrame(rows)
