"""Seeds: Mesh-TF rule sets (dim -> mesh axes) as choices of the request, priced: no rules,
the hand layouts that fit a shape, expert parallelism where there are experts, and a greedy
descent that adds or removes one (dim, mesh axis) at a time while the step time falls. And
the planner's records of what it found: a ``Candidate`` per layout, a ``ShapeResult`` per
mesh shape."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autolayout.core import Graph, RuleError, base_name
from autolayout.cost_models import RuleSet

from .baselines import batch_dim, layouts_on
from .clock import Clock, charge, now
from .liveness import memory_peak
from .request import Request

GREEDY_STEPS = 6  # rule toggles the greedy descent takes at most
GREEDY_DIMS = 8  # the dims (most input bytes first) it toggles


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
    lp_tried: bool = False  # its LP bound was tried (search/bound.py), whatever it gave
    lp_bound: float | None = None  # that LP bound, where it solved
    greedy: dict[str, Candidate] | None = None  # seeds with the greedy descent, once made
    named: bool = False  # the user's mesh: its axis names are kept


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
    charge(Clock.PRICE_NODE_S * len(req.nodes))
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
        batch = batch_dim(g)
        tokens = {d for d in tokens if d != batch and base_name(d) != batch}
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
                experts
                if grp.dim == "experts"
                else rest
                if grp.dim and base_name(grp.dim) == "batch"
                else ()
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
        if now() > deadline:
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
