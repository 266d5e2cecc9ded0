"""The search's request: every decision with its candidate strategies and their costs, every
read with its resharding costs, and the memory each choice holds — plain data, no solver.

A *node* is one decision. It is an op (a *leader*), or a tensor nothing in the step writes
(a parameter, the batch, a constant) whose strategies are its layouts. Ops that cannot
change a layout are merged into the node they follow (Alpa's followers): a same-shape
elementwise op with one operand that other ops do not read (``tanh(x)``, ``x * 2``, a
``convert``) writes its result in its operand's layout; a loop's body inputs and outputs
follow the tensors outside (with the stacked axis added or removed). Their costs are
added to the node's.

Ops that are structurally identical — same primitive, shapes, dims' positions, FLOPs and trip
count, and the same around them (three rounds of Weisfeiler–Lehman refinement over the
graph) — share one node when ``share=True``: the middle layers of a 96-layer stack become
one decision, the first and last layers (which see the embedding and the loss) their own.

Every cost here is what :func:`autolayout.cost_models.price` charges for the same choice: the
node's roofline time and the collectives that complete its partial sums, the resharding of
each tensor for readers that want it in another layout (one copy per tensor, layout and trip
count), and the hand-overs at loop boundaries and donated state. ``Request.objective``
prices a choice from this data alone; the tests hold it equal to ``price``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autolayout.core import Graph, Hardware, Layout, Op, hoisted, local_bytes, made_at
from autolayout.cost_models import (
    Group,
    Machine,
    boundary_comms,
    copy_layout,
    layouts_of,
    map_layout,
    op_cost,
    op_signature,
    op_template,
    op_tensors,
    reshard,
    stacked_residuals,
    state_dims,
    step_time,
)

from .clock import Clock, charge
from .structure import Structure


@dataclass
class Strategy:
    assign: tuple[tuple[str, ...], ...]  # mesh axes per op group (an input: per tensor axis)
    outs: tuple[int, ...]  # layout id of each output


@dataclass
class Node:
    kind: str  # "op" | "input"
    members: list[str]
    strategies: list[Strategy]
    forbidden: set[int] = field(default_factory=set)
    wanted: dict[int, list[int]] = field(default_factory=dict)  # input position -> layout ids
    by_assign: dict[tuple, list[int]] = field(default_factory=dict)


@dataclass
class Read:
    """Copies of one tensor (or of identical tensors) in the layouts its readers want; a
    ``boundary`` read is a hand-over (carry, branch, donated state) to another tensor."""

    tensor: str
    src: int
    src_map: list[int]  # layout id per strategy of ``src``
    readers: list[tuple[int, list[int]]]  # (node, wanted layout id per strategy)
    count: float  # copies a step: identical tensors x trips
    boundary: Any = None
    kind: Any = None  # what its copies' costs read beside the layouts (Request.read_cost)


@dataclass
class Request:
    """The decisions of one graph on one mesh; costs are computed when first asked for."""

    structure: Structure
    machine: Machine
    layouts: list[Layout]
    nodes: list[Node]
    reads: list[Read]
    overlap: float
    maps: dict[str, list[int]] = field(default_factory=dict)
    _ids: dict[Layout, int] = field(default_factory=dict)
    _node_cost: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    _follower_cost: dict[tuple, float] = field(default_factory=dict)
    _read_cost: dict[tuple, float] = field(default_factory=dict)
    _copy_ids: dict[tuple, int] = field(default_factory=dict)
    _bytes: dict[tuple, int] = field(default_factory=dict)
    _liveness: Any = None  # memory_peak's layout ids per buffer kind and reader
    _wanted_by: dict[tuple[int, int], dict[int, tuple[int, ...]]] = field(default_factory=dict)
    # CP-SAT's bound on the objective where the whole formulation (every strategy, the memory
    # rows) was solved: no fitting layout on this mesh is faster
    whole_bound: float | None = None

    def wanting(self, n: int, pos: int) -> dict[int, tuple[int, ...]]:
        """Node ``n``'s strategies by the layout they want input ``pos`` in."""
        by = self._wanted_by.get((n, pos))
        if by is None:
            lists: dict[int, list[int]] = {}
            for s, w in enumerate(self.nodes[n].wanted[pos]):
                lists.setdefault(w, []).append(s)
            by = self._wanted_by[(n, pos)] = {w: tuple(v) for w, v in lists.items()}
        return by

    @property
    def graph(self) -> Graph:
        return self.structure.graph

    @functools.cached_property
    def _log_devices(self) -> float:
        return math.log2(max(2, math.prod(self.machine.mesh.values())))

    def layout_id(self, layout: Layout) -> int:
        try:
            i = self._ids.get(layout)  # a tuple of tuples already (the common case)
        except TypeError:  # lists inside
            i = None
        if i is None:
            layout = tuple(tuple(a) for a in layout)
            i = self._ids.get(layout)
            if i is None:
                i = self._ids[layout] = len(self.layouts)
                self.layouts.append(layout)
        return i

    def local_bytes(self, t: str, layout_id: int) -> int:
        tt = self.graph.tensors[t]
        key = (tt.shape, tt.dtype, layout_id)
        v = self._bytes.get(key)
        if v is None:
            v = self._bytes[key] = local_bytes(tt, self.layouts[layout_id], self.machine.mesh)
        return v

    def allowed(self, n: int) -> list[int]:
        node = self.nodes[n]
        return [s for s in range(len(node.strategies)) if s not in node.forbidden]

    # --- costs -------------------------------------------------------------------------
    def node_cost(self, n: int, s: int) -> tuple[float, float]:
        """(compute, own communication) seconds a step of node ``n`` under strategy ``s``:
        every member, with the followers' roofline time."""
        key = (n, s)
        v = self._node_cost.get(key)
        if v is not None:
            return v
        charge(Clock.NODE_COST_S)
        st, g, m = self.structure, self.graph, self.machine
        node = self.nodes[n]
        count = len(node.members)
        compute = comm = 0.0
        if node.kind == "op":
            op = st.ops[node.members[0]]
            groups = st.groups[op.name]
            strat = node.strategies[s]
            lay = {t: self.layouts[node.wanted[j][s]] for j, t in enumerate(op.inputs)}
            lay.update((t, self.layouts[i]) for t, i in zip(op.outputs, strat.outs, strict=True))
            c = op_cost(m, g, op, groups, list(strat.assign), lay, None, st.free, st.fused)
            compute = c.compute_s * op.trip_count * count
            comm = c.comm_s * op.trip_count * count
        for f in st.followers[n]:
            compute += count * self._follower(n, f, s)
        v = self._node_cost[key] = (compute, comm)
        return v

    def _follower(self, n: int, f: str, s: int) -> float:
        st, g, m = self.structure, self.graph, self.machine
        op = st.ops[f]
        t_in = next(t for t in op.inputs if t in st.root and st.root[t].node == n)
        lid = self.maps[t_in][s]
        # whether its result is a residual the backward scan reads (priced as copied in and
        # out of the stack): LLaMA-3-8B's requests had charged a backward convert the forward's
        # passes, 0.3% of the step above what price() says of the same layouts
        stacked = stacked_residuals(g)
        key = (op.primitive, g.tensors[t_in].shape, g.tensors[t_in].dtype, op.flops,
               op.trip_count, f in st.fused, lid, any(t in stacked for t in op.outputs))  # fmt: skip
        v = self._follower_cost.get(key)
        if v is None:
            groups = st.groups[f]
            lay = {t_in: self.layouts[lid], op.outputs[0]: self.layouts[lid]}
            assign = list(follower_assign(g, groups, lay))
            wanted, _, _ = layouts_of(g, op, groups, assign)
            lay = {**wanted, **lay}
            c = op_cost(m, g, op, groups, assign, lay, None, st.free, st.fused)
            v = self._follower_cost[key] = c.compute_s * op.trip_count
        return v

    def read_cost(self, r: Read, a: int, b: int) -> float:
        """Seconds of one copy of ``r``'s tensor from layout ``a`` into ``b`` (for a
        boundary: of handing layout ``a`` over to a tensor laid out ``b``)."""
        if a == b and r.boundary is None:
            return 0.0
        kind = r.kind
        if kind is None:
            tt = self.graph.tensors[r.tensor]
            # a state tensor's (or a scalar's) collectives combine with the others of their
            # kind (Machine.combinable): a weight and an activation of one shape had shared a cost
            kind = r.kind = (tt.shape, tt.dtype, r.boundary, self.machine.combinable(tt))
        key = (kind, a, b)
        v = self._read_cost.get(key)
        if v is None:
            g = self.graph
            tt = g.tensors[r.tensor]
            charge(Clock.READ_COST_S * self._log_devices)
            if r.boundary is None:
                comms = reshard(self.machine, tt, self.layouts[a], self.layouts[b])
            else:
                la, lb = self.layouts[a], self.layouts[b]
                comms = boundary_comms(self.machine, g, r.boundary, la, lb)
            v = self._read_cost[key] = sum(c.time_s for c in comms)
        return v

    # --- a tensor's layout under a choice (one strategy index per node) -------------------
    def layouts_of(
        self, choice: Sequence[int], names: dict[str, str] | None = None
    ) -> dict[str, Layout]:
        """Each tensor's layout under ``choice``; ``names`` renames the mesh axes."""
        root = self.structure.root
        lays = self.layouts if names is None else [_renamed(x, names) for x in self.layouts]
        return {t: lays[m[choice[root[t].node]]] for t, m in self.maps.items()}

    def assigns_of(
        self, choice: Sequence[int], names: dict[str, str] | None = None
    ) -> dict[str, tuple]:
        """Each op's group assignment (followers: their operand's layout); ``names`` renames
        the mesh axes."""
        st, g = self.structure, self.graph
        out = {}
        memo: dict[tuple, tuple] = {}

        def rename(a: tuple) -> tuple:
            if names is None:
                return a
            v = memo.get(a)
            if v is None:
                v = memo[a] = _renamed(a, names)
            return v

        for n, node in enumerate(self.nodes):
            if node.kind == "op":
                a = rename(node.strategies[choice[n]].assign)
                for m in node.members:
                    out[m] = a
        layouts = None
        for op in g.ops:
            if op.name in st.groups and op.name not in out:
                if layouts is None:
                    layouts = self.layouts_of(choice)
                out[op.name] = rename(_follower_assign_of(g, op, st.groups, layouts))
        return out

    # --- prices of a choice, from this data alone ------------------------------------------
    def totals(self, choice: Sequence[int]) -> tuple[float, float]:
        compute = comm = 0.0
        for k in range(len(self.nodes)):
            c, m = self.node_cost(k, choice[k])
            compute += c
            comm += m
        for r in self.reads:
            src = r.src_map[choice[r.src]]
            for w in {self.copy_id(r, src, m[choice[n]]) for n, m in r.readers}:
                comm += r.count * self.read_cost(r, src, w)
        return compute, comm

    def copy_id(self, r: Read, a: int, b: int) -> int:
        """The layout of the copy a read from ``a`` into ``b`` makes (``copy_layout``: the
        whole tensor where XLA gathers it whole, one copy for every such reader)."""
        if a == b or r.boundary is not None:
            return b
        tt = self.graph.tensors[r.tensor]
        key = (tt.shape, a, b)
        v = self._copy_ids.get(key)
        if v is None:
            la, lb = self.layouts[a], self.layouts[b]
            v = self._copy_ids[key] = self.layout_id(copy_layout(self.machine, tt, la, lb))
        return v

    def objective(self, choice: Sequence[int]) -> float:
        """Predicted step time: full-overlap bound + (1 - overlap) x the rest."""
        return step_time(*self.totals(choice), self.overlap)[0]

    def lower_bound(self) -> float:
        """No choice is cheaper: each node at its own best, resharding free (prices every
        strategy)."""
        o = self.overlap
        total = 0.0
        for n in range(len(self.nodes)):
            total += min(
                c + (1.0 - o) * m for c, m in (self.node_cost(n, s) for s in self.allowed(n))
            )
        return total

    def size(self) -> int:
        """Strategy pairs the full formulation would hold (its edge variables)."""
        total = 0
        for r in self.reads:
            a = len(set(r.src_map))
            b = len({w for _, m in r.readers for w in m})
            total += a * b
        return total


def _renamed(layout: Sequence[tuple[str, ...]], names: dict[str, str]) -> tuple:
    return tuple(tuple(names[a] for a in axes) for axes in layout)


def follower_assign(g: Graph, groups: list[Group], layouts: dict[str, Layout]) -> tuple:
    """The assignment of an op that splits each group as its first laid-out member is."""
    out = []
    for grp in groups:
        t, a = next((t, a) for t, a in grp.members if t in layouts)
        out.append(layouts[t][a])
    return tuple(out)


def _follower_assign_of(g: Graph, op: Op, groups: Mapping, layouts: dict[str, Layout]) -> tuple:
    """:func:`follower_assign` of ``op``, read off its kind's template (no groups made)."""
    tpl = op_template(g, op)
    if tpl is None:
        return follower_assign(g, groups[op.name], layouts)
    ts = op_tensors(op)
    out = []
    for m, _, _ in tpl[0]:
        t, a = next((ts[j], a) for j, a in m if ts[j] in layouts)
        out.append(layouts[t][a])
    return tuple(out)


def _splits(sizes_of: list[list[int]], kinds: list[bool], mesh: dict[str, int]) -> list[tuple]:
    """Every way to give each mesh axis to one group (or none), in mesh order, where the
    group's sizes divide."""
    k = len(sizes_of)
    states: list[tuple[list[tuple[str, ...]], list[int]]] = [([()] * k, [1] * k)]
    for a, n in mesh.items():  # per axis: none first, then each group it divides, in order
        grown = []
        for cur, prod in states:
            grown.append((cur, prod))
            for j in range(k):
                p = prod[j] * n
                if kinds[j] and all(s % p == 0 for s in sizes_of[j]):
                    c, q = cur.copy(), prod.copy()
                    c[j], q[j] = cur[j] + (a,), p
                    grown.append((c, q))
        states = grown
    return [tuple(cur) for cur, _ in states]


def input_layouts(shape: tuple[int, ...], mesh: dict[str, int]) -> list[Layout]:
    """Every layout of a tensor: each mesh axis on one axis it divides, or none."""
    return _splits([[s] if s > 1 else [1, 0] for s in shape], [s > 1 for s in shape], mesh)


def _completions(
    g: Graph, op: Op, produced: dict[str, Layout], partial: tuple[str, ...], mesh: dict[str, int]
) -> list[tuple[Layout, ...]]:
    """Output layouts a strategy can finish in: each partial mesh axis all-reduced, or
    reduce-scattered onto an output axis it divides (one output only)."""
    base = tuple(produced[t] for t in op.outputs)
    if not partial or len(op.outputs) != 1:
        return [base]
    t = g.tensors[op.outputs[0]]
    options = [[None] + [i for i, s in enumerate(t.shape) if s > 1] for _ in partial]
    out = []
    for pick in itertools.product(*options):
        cur = [tuple(x) for x in base[0]]
        ok = True
        for a, i in zip(partial, pick, strict=True):
            if i is None:
                continue
            cur[i] = cur[i] + (a,)
            if t.shape[i] % math.prod(mesh[x] for x in cur[i]):
                ok = False
                break
        if ok:
            out.append((tuple(cur),))
    return out


def build(st: Structure, hw: Hardware, mesh: dict[str, int]) -> Request:
    """The request of ``st``'s graph on ``mesh``: strategies and reads (costs on demand)."""
    g = st.graph
    req = Request(st, Machine(hw, mesh, state_dims(g, st.donated)), [], [], [],
                  hw.efficiency.overlap)  # fmt: skip
    lid = req.layout_id
    alike: dict[tuple, Node] = {}
    for n, members in enumerate(st.leaders):
        first = members[0]
        if st.node_kind[n] == "input":
            t = g.tensors[first]
            strategies = [Strategy(lay, (lid(lay),)) for lay in input_layouts(t.shape, mesh)]
            node = Node("input", members, strategies)
        else:
            op = st.ops[first]
            groups = st.groups[first]
            # nodes alike in their op's shapes and groups (a layer's four projections, the
            # optimizer's per-parameter updates) have the same strategies: built once
            key = op_signature(g, op, groups)
            made = alike.get(key)
            if made is None:
                node = Node("op", members, [], wanted={j: [] for j in range(len(op.inputs))})
                sizes = [[g.tensors[t].shape[a] for t, a in grp.members] for grp in groups]
                kinds = [grp.kind != "fixed" for grp in groups]
                for assign in _splits(sizes, kinds, mesh):
                    wanted, produced, partial = layouts_of(g, op, groups, list(assign))
                    wid = [lid(wanted[t]) for t in op.inputs]
                    for outs in _completions(g, op, produced, partial, mesh):
                        node.by_assign.setdefault(assign, []).append(len(node.strategies))
                        node.strategies.append(Strategy(assign, tuple(lid(x) for x in outs)))
                        for j in range(len(op.inputs)):
                            node.wanted[j].append(wid[j])
                alike[key] = node
            else:  # strategies, wanted layouts and the index by assignment are read-only
                node = Node("op", members, made.strategies, wanted=made.wanted,
                            by_assign=made.by_assign)  # fmt: skip
        if node.kind == "input":
            node.by_assign = {s.assign: [k] for k, s in enumerate(node.strategies)}
        req.nodes.append(node)

    # every tensor's layout per strategy of its root; stacked axes a loop slices stay whole
    shifted: dict[tuple[int, int, int], list[int]] = {}
    for t, r in st.root.items():
        key = (r.node, r.out, r.shift)
        mp = shifted.get(key)
        if mp is None and r.shift == 0:
            mp = shifted[key] = [strat.outs[r.out] for strat in req.nodes[r.node].strategies]
        elif mp is None:
            mp = []
            node = req.nodes[r.node]
            for s, strat in enumerate(node.strategies):
                lay = map_layout(req.layouts[strat.outs[r.out]], r.shift)
                if lay is None:
                    node.forbidden.add(s)
                    mp.append(strat.outs[r.out])
                else:
                    mp.append(lid(lay))
            shifted[key] = mp
        req.maps[t] = mp

    # reads: one copy per tensor, wanted layout and trip count; identical ones merged
    if st.read_groups is None:
        st.read_groups = _read_groups(st)
    merged = []
    for t, readers, count, b in st.read_groups:
        src = st.root[t].node
        if b is None:
            ws = [(n, req.nodes[n].wanted[pos]) for n, pos in readers]
            merged.append(Read(t, src, req.maps[t], ws, count))
        else:
            merged.append(Read(t, src, req.maps[t], [(readers, req.maps[b.dst])], count, b))
    req.reads = merged
    return req


def _read_groups(st: Structure) -> list[tuple[str, Any, float, Any]]:
    """The structure's reads merged (mesh-independent): per tensor and trip count one copy
    for each layout its readers want, identical tensors (same root, shape and readers)
    merged, as ``(tensor, [(reader node, input position)], copies a step, None)``; and the
    hand-overs that are decisions of their own (carries, cond branches, donated state) as
    ``(src tensor, dst node, hand-overs a step, boundary)``."""
    g = st.graph
    merged: dict[tuple, list] = {}
    for t, rs in st.reads:
        by_trip: dict[tuple[int, str | None], list[tuple[int, int]]] = {}
        made = made_at(g)[t]  # a loop's invariant is copied outside the loop, one a loop
        for r, pos, i in rs:
            trips = (min(st.ops[r].trip_count, made), hoisted(g, i, t)[2])
            by_trip.setdefault(trips, []).append((st.node_of[r], pos))
        r0 = st.root[t]
        tt = g.tensors[t]
        for (trips, loop), lst in by_trip.items():
            key = ("read", r0.node, r0.out, r0.shift, tuple(sorted(lst)), trips, loop, tt.shape,
                   tt.dtype)  # fmt: skip
            if key in merged:
                merged[key][2] += trips
                continue
            merged[key] = [t, list(dict.fromkeys(lst)), float(trips), None]
    for b in st.boundaries:
        rs, rd = st.root[b.src], st.root[b.dst]
        key = ("boundary", rs.node, rs.out, rs.shift, rd.node, rd.out, rd.shift, b.shift,
               b.trips, g.tensors[b.src].shape, g.tensors[b.dst].shape)  # fmt: skip
        if key in merged:
            merged[key][2] += b.trips
            continue
        merged[key] = [b.src, rd.node, float(b.trips), dataclasses.replace(b, trips=1, owner="")]
    return [tuple(v) for v in merged.values()]
