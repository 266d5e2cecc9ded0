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

Every cost here is what :func:`autolayout._evaluate.price` charges for the same choice: the
node's roofline time and the collectives that complete its partial sums, the resharding of
each tensor for readers that want it in another layout (one copy per tensor, layout and trip
count), and the hand-overs at loop boundaries and donated state. ``Request.objective``
prices a choice from this data alone; the tests hold it equal to ``price``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autolayout._dim_rules import ELEMENTWISE
from autolayout._evaluate import _step_time
from autolayout._hardware import Hardware
from autolayout._ir import Graph, Op, op_index
from autolayout.cost_models.memory import aliased_outputs, lifetimes, liveness_peak
from autolayout.cost_models.sharding import (
    LOOP_OPS,
    Group,
    Layout,
    Machine,
    boundaries,
    boundary_comms,
    free_tensors,
    fused_ops,
    layouts_of,
    local_bytes,
    map_layout,
    op_cost,
    op_groups,
    op_kind,
    op_signature,
    op_template,
    op_tensors,
    reshard,
)

_FOLLOWERS = frozenset(ELEMENTWISE) | {"name"}
WL_ROUNDS = 3
ARRAY_WALK_OPS = 400  # graphs from this many ops walk memory as arrays (4x slower below 10)


# --- the mesh-independent structure of a graph --------------------------------------------------


@dataclass
class Root:
    """Where a tensor's layout comes from: output ``out`` of node ``node``'s strategy, seen
    through ``shift`` (+k: k stacked axes added in front; -k: removed)."""

    node: int
    out: int
    shift: int = 0


@dataclass
class Structure:
    """What the request needs of a graph that does not depend on the mesh."""

    graph: Graph
    groups: Mapping[str, list[Group]]  # op -> its groups (made on first read)
    leaders: list[list[str]]  # node -> member ops, or [tensor] for an input node
    node_kind: list[str]  # "op" | "input"
    node_of: dict[str, int]  # leader op / input tensor -> node
    root: dict[str, Root]  # every tensor
    followers: dict[int, list[str]]  # node -> follower ops (first member's chain, per member)
    reads: list[tuple[str, list[tuple[str, int, int]]]]  # tensor, [(reader op, position, index)]
    boundaries: list[Any]
    free: set[str]
    fused: set[str]
    donated: list[str]
    lifetimes: list[tuple[str, int, int]]
    index: dict[str, int]
    share: bool
    ops: dict[str, Op]
    liveness: Any = None  # memory_peak's arrays, built on first use
    read_groups: Any = None  # the reads merged, built on first use (see _read_groups)


def _digest(x: Any) -> int:
    """A colour: Python's 64-bit hash of plain data (colours only group ops within one
    analysis, so the per-process salt of ``str`` hashes does not matter); 5x faster than a
    digest of the ``repr`` on 36k ops (measured)."""
    try:
        return hash(x)
    except TypeError:  # a parameter that does not hash
        return hash(repr(x))


def _is_follower(g: Graph, op: Op, readers: dict[str, list[str]], free: set[str]) -> str | None:
    """The operand ``op`` follows, if it is a same-shape elementwise op of one real operand
    that nothing else reads."""
    if op.primitive not in _FOLLOWERS or len(op.outputs) != 1 or op.opaque:
        return None
    real = [t for t in dict.fromkeys(op.inputs) if t not in free and g.tensors[t].size > 1]
    if len(real) != 1:
        return None
    t = real[0]
    if g.tensors[t].shape != g.tensors[op.outputs[0]].shape:
        return None
    if readers.get(t, []) != [op.name]:
        return None
    return t


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping): a 64-bit hash of a 64-bit word."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _segment_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sums (mod 2**64) of ``values[starts[i]:starts[i + 1]]``; empty segments sum to 0."""
    cs = np.zeros(len(values) + 1, dtype=np.uint64)
    np.cumsum(values, out=cs[1:])
    return cs[starts[1:]] - cs[starts[:-1]]


def _colours(g, sources, producer, readers, follow_shift, free, fused, follows):
    """Weisfeiler-Lehman colours of the ops and source tensors: by their structure, then
    ``WL_ROUNDS`` times by their inputs' colours (in order, seen through the loop boundaries'
    shifts) and their outputs' readers' colours (per output, as a multiset), as 64-bit hashes
    in numpy (36k ops: 3 rounds in milliseconds). Keys: op names, ``"T" + tensor`` for sources."""
    keys: list[str] = []
    first: list[int] = []
    for t in sources:
        tt = g.tensors[t]
        keys.append("T" + t)
        first.append(_digest(("in", tt.shape, tt.dtype, tt.role, (tt.path or "").split("/")[0])))
    ops = [op for op in g.ops if op.primitive not in LOOP_OPS]
    loops = [op for op in g.ops if op.primitive in LOOP_OPS]
    for op in loops:  # a loop is its own colour; its body's ops are coloured as any
        keys.append(op.name)
        first.append(_digest(("loop", op.name)))
    # op_kind -> the digest of the structure below (ops of a kind share it)
    alike: dict[int, int] = {}
    for op in ops:
        kind = op_kind(g, op)
        part = alike.get(kind) if kind is not None else None
        if part is None:  # primitive, parameters, shapes and groups by position, digested
            ts = op_tensors(op)
            pos = {t: k for k, t in enumerate(ts)}
            if kind is None:
                by_pos = tuple((x.kind, tuple((pos[t], a) for t, a in x.members))
                               for x in op_groups(g, op))  # fmt: skip
            else:
                by_pos = tuple((k, m) for m, k, _ in op_template(g, op)[0])
            part = _digest((op.primitive, op.params, tuple((g.tensors[t].shape, g.tensors[t].dtype) for t in ts),
                            tuple(pos[t] for t in op.inputs), by_pos))  # fmt: skip
            if kind is not None:
                alike[kind] = part
        keys.append(op.name)
        first.append(_digest((part, tuple(t in free for t in op.outputs + op.inputs), op.flops,
                              op.trip_count, op.name in fused, op.opaque, op.name in follows)))  # fmt: skip
    at = {k: i for i, k in enumerate(keys)}
    n_src, base = len(sources), len(sources) + len(loops)

    def ref(t: str) -> tuple[int, tuple[int, ...]]:
        """Where an input's colour comes from: its producer (or source), and the loop
        boundaries' shifts on the way (innermost last)."""
        shifts = []
        b = follow_shift.get(t)
        while b is not None:
            shifts.append(b.shift)
            t = b.src
            b = follow_shift.get(t)
        return at[producer.get(t) or "T" + t], tuple(shifts)

    in_src, in_pos, in_start, shifted = [], [], [0], []
    out_rd, out_pos, out_start = [], [], [0]
    for op in ops:
        for k, t in enumerate(op.inputs):
            if t in follow_shift:
                i, sh = ref(t)
                shifted.append((len(in_src), sh))
            else:
                i = at[producer.get(t) or "T" + t]
            in_src.append(i)
            in_pos.append(k)
        in_start.append(len(in_src))
        for k, t in enumerate(op.outputs):
            for r in readers.get(t, ()):
                out_rd.append(at[r])
                out_pos.append(k)
        out_start.append(len(out_rd))
    src_rd, src_start = [], [0]
    for t in sources:
        src_rd += [at[r] for r in readers.get(t, ())]
        src_start.append(len(src_rd))

    def arr(x: list[int]) -> np.ndarray:
        return np.asarray(x, dtype=np.int64)

    in_src_a, in_start_a, out_rd_a = arr(in_src), arr(in_start), arr(out_rd)
    out_start_a, src_rd_a, src_start_a = arr(out_start), arr(src_rd), arr(src_start)
    salt = _mix(np.arange(1, 2 * max([0, *in_pos, *out_pos]) + 5, dtype=np.uint64))
    in_salt, out_salt = salt[arr(in_pos) * 2], salt[arr(out_pos) * 2 + 1]
    tag_in, tag_out = salt[-1], salt[-2]
    c = np.asarray(first, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        for _ in range(WL_ROUNDS):
            cin = c[in_src_a]
            for e, sh in shifted:  # a loop body's input: its outer tensor's colour, shifted
                x = cin[e : e + 1]
                for s in reversed(sh):
                    x = _mix(x ^ np.uint64(s & 0xFFFFFFFF))
                cin[e] = x[0]
            ins = _segment_sums(_mix(cin ^ in_salt), in_start_a)
            outs = _segment_sums(_mix(c[out_rd_a] ^ out_salt), out_start_a)
            srcs = _segment_sums(_mix(c[src_rd_a]), src_start_a)
            new = c.copy()
            new[base:] = _mix(c[base:] ^ _mix(ins ^ tag_in) ^ _mix(_mix(outs ^ tag_out) + c[base:]))
            new[:n_src] = _mix(c[:n_src] ^ _mix(srcs ^ tag_out))
            c = new
    return dict(zip(keys, c.view(np.int64).tolist(), strict=True))


class _Groups(Mapping):
    """Each op's groups (not a loop's), made when first read (:func:`op_groups`): most ops
    are read only through their kind's template."""

    def __init__(self, g: Graph, ops: dict[str, Op]) -> None:
        self.graph, self.ops = g, ops

    def __getitem__(self, name: str) -> list[Group]:
        op = self.ops[name]
        if op.primitive in LOOP_OPS:
            raise KeyError(name)
        return op_groups(self.graph, op)

    def __contains__(self, name: object) -> bool:
        op = self.ops.get(name)  # type: ignore[call-overload]
        return op is not None and op.primitive not in LOOP_OPS

    def __iter__(self):
        return (op.name for op in self.graph.ops if op.primitive not in LOOP_OPS)

    def __len__(self) -> int:
        return sum(op.primitive not in LOOP_OPS for op in self.graph.ops)


def _group_kinds(g: Graph, op: Op) -> list[str]:
    tpl = op_template(g, op)
    if tpl is None:
        return [grp.kind for grp in op_groups(g, op)]
    return [kind for _, kind, _ in tpl[0]]


def analyse(
    g: Graph, *, share: bool = True, donated: Sequence[str] = (), merge: bool = True
) -> Structure:
    """Leaders, followers, shared nodes, reads and lifetimes of ``g`` (mesh-independent);
    ``merge=False`` keeps every op a decision of its own (no followers)."""
    free = free_tensors(g)
    fused = fused_ops(g)
    index = op_index(g)
    ops = {op.name: op for op in g.ops}
    readers: dict[str, list[str]] = {}
    for op in g.ops:
        for t in dict.fromkeys(op.inputs):
            readers.setdefault(t, []).append(op.name)
    producer = {t: op.name for op in g.ops for t in op.outputs}
    aliased = aliased_outputs(g, donated)
    bounds = boundaries(g, aliased)
    follow_shift = {b.dst: b for b in bounds if b.kind in ("enter", "exit")}

    groups = _Groups(g, ops)
    follows: dict[str, str] = {}  # follower op -> the tensor it follows
    for op in g.ops:
        if op.primitive in LOOP_OPS:
            continue
        t = _is_follower(g, op, readers, free) if merge else None
        if t is not None and all(kind == "pass" for kind in _group_kinds(g, op)):
            follows[op.name] = t

    sources = [t for t in g.tensors if t not in producer and t not in follow_shift]
    colour = (
        _colours(g, sources, producer, readers, follow_shift, free, fused, follows) if share else {}
    )

    # nodes: leader ops and source tensors, merged by colour when sharing
    chain: dict[str, list[str]] = {}  # leader/source key -> follower ops, program order
    root_key: dict[str, str] = {}  # follower op -> its leader key

    # key_of_tensor and root_of loop instead of recursing: a closure that calls itself is a
    # reference cycle, which keeps what it reads (here the whole analysis) until a collection
    def key_of_tensor(t: str) -> str:
        b = follow_shift.get(t)
        while b is not None:
            t = b.src
            b = follow_shift.get(t)
        p = producer.get(t)
        if p is None:
            return "T" + t
        return root_key.get(p, p)

    for op in g.ops:
        if op.name in follows:
            k = key_of_tensor(follows[op.name])
            root_key[op.name] = k
            chain.setdefault(k, []).append(op.name)
    leaders: list[list[str]] = []
    node_kind: list[str] = []
    node_of: dict[str, int] = {}
    by_colour: dict[Any, int] = {}
    keys = ["T" + t for t in sources] + [
        op.name for op in g.ops if op.primitive not in LOOP_OPS and op.name not in follows
    ]
    for k in keys:
        if share:  # the colour, with its followers' (in order) where it has a chain
            ch = chain.get(k)
            cid = (colour[k], tuple([colour[f] for f in ch])) if ch else colour[k]
        else:
            cid = k
        n = by_colour.get(cid)
        if n is None:
            n = by_colour[cid] = len(leaders)
            leaders.append([])
            node_kind.append("input" if k.startswith("T") else "op")
        leaders[n].append(k[1:] if k.startswith("T") else k)
        node_of[k[1:] if k.startswith("T") else k] = n
    followers = {}
    for n, members in enumerate(leaders):
        first = members[0] if node_kind[n] == "op" else "T" + members[0]
        followers[n] = chain.get(first, [])

    root: dict[str, Root] = {}

    def root_of(t: str) -> Root:
        chain: list[tuple[str, int | None]] = []  # on the way: a boundary's shift, or None
        while t not in root:
            b = follow_shift.get(t)
            if b is not None:
                chain.append((t, b.shift))
                t = b.src
                continue
            p = producer.get(t)
            if p in follows:
                chain.append((t, None))
                t = follows[p]
                continue
            root[t] = (
                Root(node_of[t], 0) if p is None else Root(node_of[p], ops[p].outputs.index(t))
            )
        r = root[t]
        for u, shift in reversed(chain):
            if shift is not None:
                r = Root(r.node, r.out, r.shift + shift)
            root[u] = r
        return r

    for t in g.tensors:
        if t in producer or t in follow_shift or t in node_of:
            if t in producer and ops[producer[t]].primitive in LOOP_OPS and t not in follow_shift:
                continue  # a loop output nothing follows (not read)
            root_of(t)
    reads = []
    for t, rs in readers.items():
        if t in free:
            continue
        lead = [(r, index[r]) for r in rs if r not in follows and ops[r].primitive not in LOOP_OPS]
        if lead:
            reads.append((t, [(r, ops[r].inputs.index(t), i) for r, i in lead]))
    return Structure(
        graph=g, groups=groups, leaders=leaders, node_kind=node_kind, node_of=node_of,
        root=root, followers=followers, reads=reads,
        boundaries=[b for b in bounds if b.kind not in ("enter", "exit")],
        free=free, fused=fused, donated=list(donated), lifetimes=lifetimes(g, donated),
        index=index, share=share, ops=ops,
    )  # fmt: skip


# --- the request on one mesh ------------------------------------------------------------------


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
    _bytes: dict[tuple, int] = field(default_factory=dict)
    _liveness: Any = None  # memory_peak's layout ids per buffer kind and reader
    _wanted_by: dict[tuple[int, int], dict[int, tuple[int, ...]]] = field(default_factory=dict)

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
        key = (op.primitive, g.tensors[t_in].shape, g.tensors[t_in].dtype, op.flops,
               op.trip_count, f in st.fused, lid)  # fmt: skip
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
        g = self.graph
        tt = g.tensors[r.tensor]
        key = (tt.shape, tt.dtype, a, b, r.boundary)
        v = self._read_cost.get(key)
        if v is None:
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
            for w in {m[choice[n]] for n, m in r.readers}:
                comm += r.count * self.read_cost(r, src, w)
        return compute, comm

    def objective(self, choice: Sequence[int]) -> float:
        """Predicted step time: full-overlap bound + (1 - overlap) x the rest."""
        return _step_time(*self.totals(choice), self.overlap)[0]

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
    req = Request(st, Machine(hw, mesh), [], [], [], hw.efficiency.overlap)
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
        by_trip: dict[int, list[tuple[int, int]]] = {}
        for r, pos, _ in rs:
            by_trip.setdefault(st.ops[r].trip_count, []).append((st.node_of[r], pos))
        r0 = st.root[t]
        tt = g.tensors[t]
        for trips, lst in by_trip.items():
            key = ("read", r0.node, r0.out, r0.shift, tuple(sorted(lst)), trips, tt.shape, tt.dtype)
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


# --- memory --------------------------------------------------------------------------------


@dataclass
class MemoryRow:
    """Bytes per device at one program point: ``terms[node][strategy]`` plus the copies
    alive there: ``(bytes, src node, src strategies already in that layout, readers before,
    readers after)``, each reader a ``(node, strategies wanting the layout)``."""

    point: int
    terms: dict[int, list[int]]
    copies: list[tuple[int, int, tuple[int, ...], tuple, tuple]]


def memory_row(req: Request, point: int) -> MemoryRow:
    st, g, mesh = req.structure, req.graph, req.machine.mesh
    terms: dict[int, list[int]] = {}
    bmemo: dict[tuple, list[int]] = {}

    def add(t: str) -> None:
        r = st.root[t]
        mp = req.maps[t]
        tt = g.tensors[t]
        key = (tt.shape, tt.dtype, id(mp))
        vec = bmemo.get(key)
        if vec is None:
            vec = bmemo[key] = [local_bytes(tt, req.layouts[i], mesh) for i in mp]
        row = terms.setdefault(r.node, [0] * len(vec))
        for s, v in enumerate(vec):
            row[s] += v

    for t in g.inputs:
        add(t)
    for t, a, b in st.lifetimes:
        if a <= point <= b:
            add(t)
    copies = []
    for t, rs in st.reads:
        before = [(st.node_of[r], pos) for r, pos, i in rs if i <= point]
        after = [(st.node_of[r], pos) for r, pos, i in rs if i >= point]
        if not before or not after:
            continue
        r0 = st.root[t]
        mp = req.maps[t]
        before, after = list(dict.fromkeys(before)), list(dict.fromkeys(after))
        by_b = [(n, req.wanting(n, pos)) for n, pos in before]
        by_a = [(n, req.wanting(n, pos)) for n, pos in after]
        wants = {w for _, by in by_b + by_a for w in by}
        for w in wants:
            bw = tuple((n, by.get(w, ())) for n, by in by_b)
            aw = tuple((n, by.get(w, ())) for n, by in by_a)
            if not any(s for _, s in bw) or not any(s for _, s in aw):
                continue
            same = tuple(s for s, x in enumerate(mp) if x == w)
            nbytes = local_bytes(g.tensors[t], req.layouts[w], mesh)
            copies.append((nbytes, r0.node, same, bw, aw))
    return MemoryRow(point, terms, copies)


class _Liveness:
    """:func:`memory_peak`'s walk as arrays, built once per graph: the step's buffers
    (lifetimes, inputs) and reads grouped by where their layout comes from (a root and a
    shape), so a choice is priced by one Python pass over those groups and a few numpy
    passes over the buffers."""

    def __init__(self, st: Structure) -> None:
        g, root = st.graph, st.root
        kinds: dict[tuple, int] = {}
        self.kind_node: list[int] = []
        self.kind_tensor: list[str] = []  # a tensor of the kind (its map, shape and dtype)

        def kind(t: str) -> int:
            r, tt = root[t], g.tensors[t]
            key = (r.node, r.out, r.shift, tt.shape, tt.dtype)
            k = kinds.get(key)
            if k is None:
                k = kinds[key] = len(self.kind_node)
                self.kind_node.append(r.node)
                self.kind_tensor.append(t)
            return k

        self.inputs = np.array([kind(t) for t in g.inputs], dtype=np.int64)
        lives = st.lifetimes
        self.live_kind = np.array([kind(t) for t, _, _ in lives], dtype=np.int64)
        self.live_first = np.array([a for _, a, _ in lives], dtype=np.int64)
        self.live_end = np.array([b + 1 for _, _, b in lives], dtype=np.int64)
        # reads: (tensor, its kind, the reader's wanted layouts, the reader's index)
        wants: dict[tuple[int, int], int] = {}
        self.wants: list[tuple[int, int]] = []  # (reader node, input position)
        shapes: dict[tuple, int] = {}
        self.shape_tensor: list[str] = []  # a tensor per (shape, dtype) read
        read_shape = []
        r_tensor, r_kind, r_want, r_at = [], [], [], []
        for ti, (t, rs) in enumerate(st.reads):
            tt = g.tensors[t]
            sc = shapes.get((tt.shape, tt.dtype))
            if sc is None:
                sc = shapes[(tt.shape, tt.dtype)] = len(self.shape_tensor)
                self.shape_tensor.append(t)
            read_shape.append(sc)
            k = kind(t)
            for r, pos, i in rs:
                key = (st.node_of[r], pos)
                w = wants.get(key)
                if w is None:
                    w = wants[key] = len(self.wants)
                    self.wants.append(key)
                r_tensor.append(ti)
                r_kind.append(k)
                r_want.append(w)
                r_at.append(i)
        self.r_tensor = np.array(r_tensor, dtype=np.int64)
        self.r_shape = np.array(read_shape, dtype=np.int64)[self.r_tensor]
        self.r_kind = np.array(r_kind, dtype=np.int64)
        self.r_want = np.array(r_want, dtype=np.int64)
        self.r_at = np.array(r_at, dtype=np.int64)
        self.n = len(g.ops)

    def peak(self, req: Request, choice: Sequence[int]) -> tuple[int, int]:
        if req._liveness is None:  # this request's layout ids per kind and per reader
            maps = req.maps
            req._liveness = (
                [maps[t] for t in self.kind_tensor],
                [req.nodes[n].wanted[pos] for n, pos in self.wants],
            )
        kind_map, want_vec = req._liveness
        lb = req.local_bytes
        lid = [mp[choice[n]] for mp, n in zip(kind_map, self.kind_node, strict=True)]
        kbytes = np.array(
            [lb(t, i) for t, i in zip(self.kind_tensor, lid, strict=True)], dtype=np.float64
        )
        lid = np.array(lid, dtype=np.int64)
        resident = int(kbytes[self.inputs].sum()) if len(self.inputs) else 0
        size = self.n + 2
        b = kbytes[self.live_kind]
        delta = np.bincount(self.live_first, b, size) - np.bincount(self.live_end, b, size)
        if len(self.r_at):
            wsel = np.array(
                [v[choice[n]] for v, (n, _) in zip(want_vec, self.wants, strict=True)],
                dtype=np.int64,
            )
            w = wsel[self.r_want]
            moved = w != lid[self.r_kind]
            if moved.any():
                span = len(req.layouts) + 1
                w, at = w[moved], self.r_at[moved]
                # one copy per (tensor, layout): alive from its first reader to its last
                uniq, inv = np.unique(self.r_tensor[moved] * span + w, return_inverse=True)
                first = np.full(len(uniq), self.n, dtype=np.int64)
                last = np.zeros(len(uniq), dtype=np.int64)
                np.minimum.at(first, inv, at)
                np.maximum.at(last, inv, at)
                # its bytes by (shape, dtype, layout)
                sk, sinv = np.unique(self.r_shape[moved] * span + w, return_inverse=True)
                st_ = self.shape_tensor
                sb = np.array([lb(st_[u // span], u % span) for u in sk.tolist()], np.float64)
                cb = np.zeros(len(uniq), dtype=np.float64)
                cb[inv] = sb[sinv]
                delta += np.bincount(first, cb, size) - np.bincount(last + 1, cb, size)
        live = np.cumsum(delta[: self.n])
        if not len(live):
            return resident, 0
        i = int(np.argmax(live))
        top = int(round(live[i]))
        if top <= 0:
            return resident, 0
        return resident + top, i


def memory_peak(req: Request, choice: Sequence[int]) -> tuple[int, int]:
    """(peak bytes per device, program point of the peak) of a choice: the liveness walk of
    :func:`autolayout.cost_models.memory.liveness_peak` over the request's layouts (the
    readers of a tensor that want one layout other than its own share one copy, alive from
    the first of them to the last)."""
    st = req.structure
    if len(st.graph.ops) < ARRAY_WALK_OPS:  # numpy's per-call overhead would dominate
        return memory_peak_walk(req, choice)
    if st.liveness is None:
        st.liveness = _Liveness(st)
    return st.liveness.peak(req, choice)


def memory_peak_walk(req: Request, choice: Sequence[int]) -> tuple[int, int]:
    """:func:`memory_peak` by :func:`liveness_peak` itself (the tests hold the two equal)."""
    st, g = req.structure, req.graph
    root, maps = st.root, req.maps

    def nbytes(t: str) -> int:
        return req.local_bytes(t, maps[t][choice[root[t].node]])

    copies = []
    for t, rs in st.reads:
        spans: dict[int, list[int]] = {}
        src = maps[t][choice[root[t].node]]
        for r, pos, i in rs:
            k = st.node_of[r]
            w = req.nodes[k].wanted[pos][choice[k]]
            if w != src:
                sp = spans.get(w)
                if sp is None:
                    spans[w] = [i, i]
                else:
                    sp[0], sp[1] = min(sp[0], i), max(sp[1], i)
        copies += [(a, b, req.local_bytes(t, w)) for w, (a, b) in spans.items()]
    mem = liveness_peak(g, nbytes, copies=copies, lives=st.lifetimes)
    return mem.peak_bytes, st.index[mem.peak_op] if mem.peak_op is not None else 0
