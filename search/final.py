"""The winner as a :class:`Plan`: ties broken by a fixed order (``canonical``), mesh axes
named after what they split, the layouts priced exactly as ``evaluate`` prices them (and the
best fitting hand layout returned where it is faster), Mesh-TF rules derived with the inputs
they do not lay out."""

from __future__ import annotations

import math
import time

from autolayout.core import Graph, Hardware, MeshError, RuleError, base_name
from autolayout.cost_models import RuleSet, place_mesh, plan_from_costs, price

from .baselines import batch_dim, seq_dims, spatial_dims
from .bound import FIRST_ORDER_PAIRS, LP_PAIRS, lp_bound
from .clock import clock
from .interrupt import interrupted
from .liveness import memory_peak
from .request import Request, build
from .seeds import Candidate, ShapeResult
from .structure import Structure


def _axis_names(g: Graph, r: ShapeResult, layouts, assigns) -> dict[str, str]:
    """Generic mesh axes named after what they split, as Megatron-LM and MaxText name them:
    a weight's experts dim ``expert``; weights and the batch (of an input, or of the
    activations) ``fsdp``; weights and not the batch ``tensor``; the batch only ``data``; a
    conv's spatial dims only (of the inputs, or where no input is split, of the activations)
    ``space``; the sequence dims only (of the tokens, the activations, a position table) ``seq``;
    nothing at all ``replica`` (its devices repeat the work); else (an activation's heads or
    hidden units, no weight) ``tensor``. A second axis of one name is ``tensor2``, ...
    A mesh the user gave keeps its names. Weights are the inputs without the batch dim; a
    dim is experts or sequence by its name, ``#`` and size left out (``seq#2``, the tracer's
    ``seq`` by role, the token inputs' ``enc_seq``). ``layouts`` (every tensor's) and
    ``assigns`` (each op's split) on the request's own axes: the plan's, so that the names
    say what the plan returned splits (not the search's choice a rules plan came from)."""

    req = r.request
    if r.named:
        return {a: a for a in req.machine.mesh}
    batch = None
    try:
        batch = batch_dim(g)
    except RuleError:
        pass
    space = {d for sl in spatial_dims(g) for d in sl}

    def root(d: str) -> str:
        return base_name(d).split("#")[0]

    seqs = {root(d) for d in seq_dims(g)} | {"seq"}

    def kind(d: str | None, weight: bool) -> str:
        if d is None:
            return "param" if weight else "act"
        if d == batch or base_name(d) == batch:
            return "batch"
        if d in space:
            return "space"
        b = root(d)
        if b in ("experts", "expert"):
            return "expert"
        if b in seqs or b.endswith("_seq"):
            return "seq"
        return "param" if weight else "act"

    splits: dict[str, set[str]] = {a: set() for a in req.machine.mesh}
    for t in g.inputs:
        tt = g.tensors[t]
        weight = batch is None or batch not in tt.dims  # a batch input's other dims: activations
        for d, axes in zip(tt.dims, layouts[t], strict=True):
            for a in axes:
                splits[a].add(kind(d, weight))
    if batch is not None:  # the batch split inside the step only (the input read whole and
        # sliced for free) is still a batch split: FSDP's axis shows as fsdp
        for t, lay in layouts.items():
            tt = g.tensors[t]
            if batch in tt.dims:
                for a in lay[tt.dims.index(batch)]:
                    splits[a].add("batch")
    # an axis that splits no weight and no batch (no input at all, or only the tokens'
    # sequence) is named after what it splits inside the step: the volume, the sequence,
    # else the activations' other dims (tensor parallelism without a weight split)
    inner = [a for a, s in splits.items() if s <= {"seq", "act"}]
    if inner:
        for t, lay in layouts.items():
            for d, axes in zip(g.tensors[t].dims, lay, strict=True):
                for a in axes:
                    if a in inner:
                        splits[a].add(kind(d, False))
    quiet = [a for a in inner if not splits[a]]
    if quiet:  # an axis no tensor uses at all holds replicas: named so, not after a role
        touched = {  # an op may split a summed dim on it (partial sums): it divides work
            a for assign in assigns.values() for axes in assign for a in axes
        }
        for a in quiet:
            if a not in touched:
                splits[a].add("replica")
    out: dict[str, str] = {}
    used: set[str] = set()
    for a in req.machine.mesh:
        s = splits[a]
        name = (
            "expert" if "expert" in s
            else ("fsdp" if "batch" in s else "tensor") if "param" in s
            else "data" if "batch" in s
            else "space" if "space" in s
            else "seq" if s == {"seq"}
            else "replica" if s == {"replica"}
            else "tensor"
        )  # fmt: skip
        k, base = 2, name
        while name in used:
            name, k = f"{base}{k}", k + 1
        used.add(name)
        out[a] = name
    return out


# A standard layout (DP, FSDP, Megatron...) within this fraction of the search's best step
# time is chosen over a search result with exceptions to its rules: a plan an engineer reads
# in a few lines and trusts, for at most 1% of predicted time (the cost model's own error
# on published runs is larger: docs/decisions.md, Measured).
SIMPLER_WITHIN = 0.01
OWN_RULES = "its rules"  # the search's derived rules, priced without its exceptions


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
    names = _axis_names(g, r, r.request.layouts_of(c.choice), r.request.assigns_of(c.choice))
    mesh = {names[a]: n for a, n in r.mesh.items()}
    rules = [(d, tuple(names[a] for a in axes)) for d, axes in dict(c.rules).items()]
    step, rules, layouts, priced, assigns = _rules_exactly(g, hw, mesh, rules, st)
    return step, r, name, mesh, rules, layouts, priced, names, assigns


def _renamed(g: Graph, hw: Hardware, st: Structure, r: ShapeResult, mesh, rules, layouts,
             assigns, names):  # fmt: skip
    """A rules plan's axes named after what it splits, where that differs from the names of
    the choice it came from (the search's choice split the batch inside the step, its rules
    do not: an axis of weights alone is ``tensor``, not ``fsdp``): ``(names, mesh, the plan
    priced again with them)``, else None. The same devices in the same order, so the same
    costs; priced again so that every name in its report is the new one."""
    raw = {v: k for k, v in names.items()}

    def back(x):
        return tuple(tuple(raw[a] for a in axes) for axes in x)

    again = _axis_names(g, r, {t: back(lay) for t, lay in layouts.items()},
                        {op: back(x) for op, x in assigns.items()})  # fmt: skip
    if again == names:
        return None
    m = {again[raw[a]]: n for a, n in mesh.items()}
    rs = [(d, tuple(again[raw[a]] for a in axes)) for d, axes in rules]
    return again, m, _rules_exactly(g, hw, m, rs, st)


def _rules_exactly(g: Graph, hw: Hardware, mesh: dict[str, int], rules, st: Structure):
    """The search's derived rules applied to every tensor, as ``al.evaluate`` prices them:
    (step time, rules, layouts, priced, each priced op's split)."""
    rs = RuleSet(g, mesh, rules)
    layouts = {t: rs.layout(tt) for t, tt in g.tensors.items()}
    assigns: dict[str, list] = {}

    def assign(op, groups):
        a = assigns[op.name] = rs.assign(g, groups)
        return a

    priced = price(g, hw, mesh, layouts, assign, donated=st.donated)
    return priced["predicted"]["step_time_s"], rs.rules, layouts, priced, assigns


def _priced_alike(hand, win: ShapeResult, mesh, layouts, assigns) -> dict | None:
    """The hand layout's exact price where it is the search's plan's too (``price`` is a
    function of the mesh, every tensor's layout and every op's split: where the search kept
    that hand layout's seed, its rules give each the seed's), else ``None``: a 96-layer plan
    found by hand layouts alone is priced once, not twice (0.4 s)."""
    if hand is None or hand[1] is not win or list(hand[3].items()) != list(mesh.items()):
        return None
    if hand[5] != layouts:
        return None
    for op, a in hand[8].items():
        b = assigns.get(op)
        if b is None or list(map(tuple, a)) != list(map(tuple, b)):
            return None
    return hand[6]


def canonical(req: Request, choice: list[int]) -> list[int]:
    """``choice`` with ties broken by a fixed order: a node moves to a strategy of lower
    position where its own price and its reads' cost neither more compute nor more
    communication, and the peak memory does not grow; then a batch input to its most split
    layout on the same terms. Equal-cost layouts are many (a weight kept whole or split where
    nothing else changes) and the search, on wall-clock time and several workers, lands on a
    different one on each run; this makes it one where the search ends inside its limits
    (where a limit binds, ``deterministic=True`` does)."""
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

    def move(n: int, candidates) -> None:
        """Node ``n`` to the first of ``candidates`` where its own price and its reads'
        cost no more compute nor communication and the peak memory does not grow."""
        nonlocal peak
        now = choice[n]
        c0, m0 = local(n)
        tol_c, tol_m = 1e-12 * (abs(c0) + 1e-30), 1e-12 * (abs(m0) + 1e-30)
        for s in candidates:
            choice[n] = s
            c, m = local(n)
            if c <= c0 + tol_c and m <= m0 + tol_m:
                p = memory_peak(req, choice)[0]
                if p <= peak:
                    peak = p
                    return
            choice[n] = now

    for n in range(len(req.nodes)):
        move(n, [s for s in sorted(req.allowed(n)) if s < choice[n]])
    # a step input that is not state (the batch) to its most split layout that costs no
    # more: a batch read whole by a step that splits it costs nothing more on the devices,
    # but every device (every host) is fed the whole batch (two strangers' models had
    # planned their batch whole for that tie: ``batch -> data`` only inside the step)
    donated, mesh = set(req.structure.donated), req.machine.mesh
    for n, node in enumerate(req.nodes):
        if node.kind == "input" and node.members[0] not in donated:
            ways = [math.prod(mesh[a] for axes in req.layouts[st.outs[0]] for a in axes)
                    for st in node.strategies]  # fmt: skip
            more = [s for s in req.allowed(n) if ways[s] > ways[choice[n]]]
            move(n, sorted(more, key=lambda s: (-ways[s], s)))
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
    names = _axis_names(g, win, req.layouts_of(choice), req.assigns_of(choice))
    layouts, assigns = req.layouts_of(choice, names), req.assigns_of(choice, names)
    mesh = {names[a]: n for a, n in win.mesh.items()}
    for t in g.tensors:
        if t not in layouts:
            layouts[t] = ((),) * len(g.tensors[t].shape)
    hand = None
    if check_hand and status != "INFEASIBLE":
        hand = _hand_exactly(g, hw, results, limit, st)
    priced = _priced_alike(hand, win, mesh, layouts, assigns)
    if priced is None:
        priced = price(g, hw, mesh, layouts, assigns, donated=st.donated)
    rules, exceptions = derive_rules(g, mesh, layouts)
    if check_hand and status != "INFEASIBLE" and exceptions and rules:
        mine = _rules_exactly(g, hw, mesh, rules, st)  # the search's own rules, on every tensor
        if hand is None or mine[0] < hand[0]:
            hand = (mine[0], win, OWN_RULES, mesh, mine[1], mine[2], mine[3], names, mine[4])
    source = "search"
    if hand is not None:
        mem, hand_mem = (x["predicted"]["memory_bytes_per_device"] for x in (priced, hand[6]))
        searched = priced["predicted"]["step_time_s"]
        faster = hand[0] < searched * (1 - 1e-9)
        simpler = bool(exceptions) and hand[0] <= searched * (1 + SIMPLER_WITHIN)
        # as fast and leaner: the search kept whole what the hand layout splits for free
        leaner = hand[0] <= searched * (1 + 1e-9) and hand_mem < mem
        if hand_mem <= limit and (faster or simpler or leaner or mem > limit):
            _, win, name, mesh, rules, layouts, priced, names, assigns = hand
            again = _renamed(g, hw, st, win, mesh, rules, layouts, assigns, names)
            if again is not None:
                names, mesh, (_, rules, layouts, priced, assigns) = again
            if name == OWN_RULES:
                win.best = Candidate(win.best.choice, hand[0], hand_mem, "search rules")
                what = "the search's rules without their exceptions"
            else:
                win.best = Candidate(win.hand[name].choice, hand[0], hand_mem, name)
                what = f"hand layout {name!r}"
            if faster or mem > limit:
                source = f"{what}: its rules, priced exactly, beat the search's best"
            elif simpler:
                source = (
                    f"{what}: within {SIMPLER_WITHIN:.0%} of the search's best ({searched:.4g} s, "
                    f"{len(exceptions)} exceptions to its rules) and plain rules"
                )
            else:
                source = (
                    f"{what}: as fast as the search's best and less memory "
                    f"({hand_mem / 2**30:.3g} GiB against {mem / 2**30:.3g})"
                )
            exceptions = []
            if faster or simpler or mem > limit:
                status = "FEASIBLE"
    merged = None
    # axes that split only together: one axis (not after a Ctrl-C: it prices the plan again)
    if not win.named and status != "INFEASIBLE" and not interrupted():
        joint = _joint_axes(mesh, layouts, rules, assigns if source == "search" else None)
        if joint:
            merged = _merge(g, hw, st, mesh, joint, layouts, assigns, rules, priced,
                            source == "search")  # fmt: skip
    if merged is not None:
        mesh, layouts, rules, priced, _ = merged
        if source == "search":
            rules, exceptions = derive_rules(g, mesh, layouts)
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
    # no bound after a Ctrl-C: it prices every strategy of every node (an answer is due)
    on = win if merged is None else _shape_result(results, mesh, st, hw)
    bound, bound_s, bound_kind = (None, 0.0, "") if interrupted() else _bound(on)
    priced["predicted"]["memory_limit_bytes"] = limit
    priced["predicted"]["fits"] = priced["predicted"]["memory_bytes_per_device"] <= limit
    solver = {
        "status": status,
        "wall_s": time.perf_counter() - t0,
        "trace_s": t_trace,
        "deterministic": clock().deterministic,
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
    if merged is not None:  # the plan on the mesh shape of the merged axes
        solver["merged_axes"] = {a: list(axes) for a, axes in merged[4].items() if len(axes) > 1}
    if bound is not None:
        step = priced["predicted"]["step_time_s"]
        solver["lower_bound_s"] = bound  # no layout on this mesh is faster (memory aside)
        solver["gap"] = max(0.0, step / bound - 1.0) if bound > 0 else 0.0
        solver["bound_s"] = bound_s
        solver["bound_kind"] = bound_kind
    p = plan_from_costs(workload, g, hw, mesh, rules, layouts, priced, status, solver)
    p.request = on.request  # for tighten_bound, at the end of the call
    return p


def _joint_axes(mesh: dict[str, int], layouts, rules, assigns) -> tuple[str, str] | None:
    """Two neighbouring mesh axes ``(a, b)`` that split only together, ``a`` then ``b``, in
    every tensor's layout, rule and op's split (``assigns``, where given): the plan is one
    of the mesh with them as one axis (devices are row-major over the mesh, so the same
    devices in the same order), which an engineer writes (``fsdp=512``, not ``fsdp=32 x
    fsdp2=16``) and whose smaller request the bounds can solve. ``None`` where none do."""
    names = list(mesh)
    entries = [axes for lay in layouts.values() for axes in lay]
    entries += [axes for _, axes in rules]
    if assigns is not None:
        entries += [axes for a in assigns.values() for axes in a]
    for a, b in zip(names, names[1:], strict=False):
        if all((a in axes) == (b in axes) and (a not in axes or axes[axes.index(a) + 1 :][:1] == (b,))
               for axes in map(tuple, entries)):  # fmt: skip
            return a, b
    return None


def _merge(g, hw, st, mesh, joint, layouts, assigns, rules, priced, searched):
    """The plan with ``joint`` axes made one (again while two more split only together),
    priced again: ``(mesh, layouts, rules, priced, parts)`` where it costs what it did
    (``tests/test_collective_groups.py``: a group of axes costs what its one axis costs),
    else ``None``; ``parts``: each axis of the new mesh, the axes of the old it stands for."""
    parts = {a: (a,) for a in mesh}
    m, lays, rs, asg = dict(mesh), layouts, list(rules), assigns
    while joint is not None:
        a, b = joint

        def one(axes: tuple, a=a, b=b) -> tuple:
            return tuple(x for x in axes if x != b)

        m = {k: v * (m[b] if k == a else 1) for k, v in m.items() if k != b}
        parts[a] = parts[a] + parts.pop(b)
        lays = {t: tuple(one(axes) for axes in lay) for t, lay in lays.items()}
        rs = [(d, one(tuple(axes))) for d, axes in rs]
        if asg is not None:
            asg = {op: tuple(one(axes) for axes in x) for op, x in asg.items()}
        joint = _joint_axes(m, lays, rs, asg if searched else None)
    try:
        place_mesh(hw, m)
    except MeshError:
        return None
    if searched:
        again = price(g, hw, m, lays, asg, donated=st.donated)
    else:
        _, rs, lays, again, _ = _rules_exactly(g, hw, m, rs, st)
    before, after = priced["predicted"], again["predicted"]
    if after["step_time_s"] > before["step_time_s"] * (1 + 1e-6) or (
        after["memory_bytes_per_device"] > before["memory_bytes_per_device"] * (1 + 1e-6)
    ):
        return None
    return m, lays, rs, again, parts


def _shape_result(results, mesh: dict[str, int], st: Structure, hw: Hardware) -> ShapeResult:
    """The search's result for the shape of ``mesh`` (its request, bounds), or a new one
    with its request built."""
    raw = dict(zip("abcdefgh", mesh.values(), strict=False))
    for r in results:
        if r.request is not None and list(r.mesh.values()) == list(raw.values()):
            return r
    return ShapeResult(raw, None, "SKIPPED", 0.0, request=build(st, hw, raw))


BOUND_NODES = 5000  # decisions up to which the per-op bound is priced (0.1 s at 332 nodes)
LP_SHARE = 0.1  # of the call's time limit, the work the winner's LP bound may take


def _bound(win: ShapeResult) -> tuple[float | None, float, str]:
    """A lower bound on the step time of any layout on the winning mesh shape, the best of:
    CP-SAT's bound where the whole formulation was solved (every strategy, resharding and the
    memory rows: no *fitting* layout is faster); the LP relaxation with resharding, memory
    free (:func:`.bound.lp_bound`, where it solves in ``LP_SHARE`` of the time limit); every
    op at its cheapest strategy with resharding and memory free (``Request.lower_bound``:
    weak where resharding decides). Returns the bound (None where there is no request), the
    seconds it took and which it is."""
    req = win.request
    if req is None:
        return None, 0.0, ""
    t = time.perf_counter()
    if win.lower_bound is None and len(req.nodes) <= BOUND_NODES:
        win.lower_bound = req.lower_bound()
    per_op = win.lower_bound or 0.0  # the LP's too, where it pruned on it (lp_bound below)
    lp = win.lp_bound  # solved already where the shape's pruning tried it
    if lp is None and len(req.nodes) <= BOUND_NODES:
        solved = lp_bound(req, LP_SHARE * clock().limit_s)
        lp = solved.bound_s if solved is not None else None
    # the strongest first: a tie (a lower bound the LP raised) is named by the LP
    kinds = [(req.whole_bound or 0.0, "the ILP's bound over every fitting layout"),
             (lp or 0.0, LP_KIND),
             (per_op, "every op at its cheapest split, resharding and memory free")]  # fmt: skip
    bound, kind = max(kinds, key=lambda k: k[0])
    if bound <= 0:  # too many decisions to price every strategy (26k: ~9 s), no ILP bound
        return None, time.perf_counter() - t, ""
    return bound, time.perf_counter() - t, kind


LP_KIND = "the LP relaxation over every layout, resharding priced and memory free"


def tighten_bound(p, gap: float, work_s: float) -> None:
    """At the end of an ``al.plan`` call: where the plan is further than ``gap`` from its
    bound and that bound is not the LP's, the LP relaxation again with ``work_s`` of work (the
    budget the search left; past dual simplex's pairs, PDLP: ``search/bound.py``), and the
    plan's bound and gap from it where it binds more. Drops the plan's request either way."""
    req, p.request = p.request, None
    s = p.solver
    if req is None or "lower_bound_s" not in s or s["gap"] <= gap or s["bound_kind"] == LP_KIND:
        return
    if req.size() <= LP_PAIRS and work_s <= LP_SHARE * clock().limit_s:
        return  # :func:`_bound` ran this dual simplex with this work already: the same answer
    t = time.perf_counter()
    lp = lp_bound(req, work_s, largest=FIRST_ORDER_PAIRS)
    s["bound_s"] += time.perf_counter() - t
    if lp is not None and lp.bound_s > s["lower_bound_s"]:
        s["lower_bound_s"], s["bound_kind"] = lp.bound_s, LP_KIND
        s["gap"] = max(0.0, p.predicted["step_time_s"] / lp.bound_s - 1.0)


def _merged_sizes(g: Graph, rules: list) -> list:
    """Rules as Mesh-TF writes them: where every size of one name (``depth(32)``,
    ``depth(16)``, ...: a name the user gave axes of several sizes) has a rule to the same mesh
    axes, one rule for the name, in the place of its first size's."""
    axes_of = dict(rules)
    out, done = [], set()
    for d, axes in rules:
        base = base_name(d)
        sizes = g.named(base) if base != d else ()
        if sizes and all(axes_of.get(s) == axes for s in sizes):
            if base not in done:
                out.append((base, axes))
                done.add(base)
            continue
        out.append((d, axes))
    return out


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
    rules = _with_fallbacks(g, mesh, layouts, _merged_sizes(g, rules))
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


FALLBACKS = 8  # further rules tried, the most bytes first


def _with_fallbacks(g: Graph, mesh: dict[str, int], layouts, rules: list) -> list:
    """``rules`` with the further rules (a dim's fallback, Flax's ``logical_axis_rules``) that
    make the inputs' layouts exceptions to them the least, each where it does most: Mixtral's
    dense weights split ``d_model`` over ``fsdpxexpert`` and its experts' weights over
    ``fsdp`` (``experts`` took ``expert``): with ``d_model -> fsdpxexpert`` after
    ``experts -> expert`` and ``d_model -> fsdp`` after it, no exceptions, not 585."""

    kinds: dict[tuple, list] = {}  # inputs alike (every layer's wq): (a tensor, its layout, bytes)
    for t in g.inputs:
        tt = g.tensors[t]
        want = tuple(tuple(a) for a in layouts[t])
        kind = kinds.setdefault((tt.dims, tt.shape, want), [tt, want, 0])
        kind[2] += tt.nbytes

    def missed(rs: list) -> tuple[int, dict]:
        """Bytes of the inputs ``rs`` do not lay out, and (dim, axes) those hold, by bytes."""
        try:
            got = RuleSet(g, mesh, rs)
        except RuleError:
            return math.inf, {}
        total, votes = 0, {}
        for tt, want, nbytes in kinds.values():
            have = got.layout(tt)
            if have != want:
                total += nbytes
                for d, a, b in zip(tt.dims, want, have, strict=True):
                    if d is not None and a and a != b:
                        votes[(d, a)] = votes.get((d, a), 0) + nbytes
        return total, votes

    best, votes = missed(rules)
    tried: set = set()
    for _ in range(FALLBACKS):
        if not best or not votes:
            break
        cand = max((c for c in votes if c not in tried and c not in rules),
                   key=votes.__getitem__, default=None)  # fmt: skip
        if cand is None:
            break
        tried.add(cand)
        # it at each place; or there as its dim's first rule, the dim's rules its fallbacks
        same = [r for r in rules if r[0] == cand[0]]
        rest = [r for r in rules if r[0] != cand[0]]
        trials = [rules[:k] + [cand] + rules[k:] for k in range(len(rules) + 1)]
        trials += (
            [rest[:k] + [cand, *same] + rest[k:] for k in range(len(rest) + 1)] if same else []
        )
        scored = [(missed(r), k) for k, r in enumerate(trials)]
        (cost, new_votes), k = min(scored, key=lambda x: (x[0][0], x[1]))
        if cost < best:
            rules, best, votes = trials[k], cost, new_votes
    return rules
