"""The mesh-independent structure of a graph for the search: which ops lead a decision and
which follow another's layout, which are structurally identical (Weisfeiler-Lehman colours)
and share one decision, which tensors are read in another layout and by whom. Computed once
per graph (``analyse``); ``request.build`` lays it on each mesh shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autolayout.core import ELEMENTWISE, Efficiency, Graph, Hardware, Op, op_index
from autolayout.cost_models import (
    LOOP_OPS,
    Group,
    aliased_outputs,
    boundaries,
    free_tensors,
    fused_ops,
    lifetimes,
    op_groups,
    op_kind,
    op_template,
    op_tensors,
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
    that nothing else reads (an optimization barrier of one operand: always)."""
    if op.primitive not in _FOLLOWERS or len(op.outputs) != 1 or op.opaque:
        return None
    real = [t for t in dict.fromkeys(op.inputs) if t not in free and g.tensors[t].size > 1]
    if len(real) != 1:
        return None
    t = real[0]
    if g.tensors[t].shape != g.tensors[op.outputs[0]].shape:
        return None
    if readers.get(t, []) != [op.name] and op.primitive != "optimization_barrier":
        return None  # a barrier is its operand as stored, whoever else reads it (al.remat's
    return t  # regather: the backward pass gathers the barrier's output afresh)


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
    g: Graph,
    *,
    share: bool = True,
    donated: Sequence[str] = (),
    merge: bool = True,
    compiler: Efficiency | None = None,
) -> Structure:
    """Leaders, followers, shared nodes, reads and lifetimes of ``g`` (mesh-independent);
    ``merge=False`` keeps every op a decision of its own (no followers); ``compiler`` (the
    hardware's efficiency table) as :func:`~autolayout.cost_models.memory.lifetimes` takes it."""
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
        free=free, fused=fused, donated=list(donated), lifetimes=lifetimes(g, donated, compiler),
        index=index, share=share, ops=ops,
    )  # fmt: skip


# --- the request on one mesh ------------------------------------------------------------------


def analyse_on(
    g: Graph, hw: Hardware, *, share: bool = True, donated: Sequence[str] = ()
) -> Structure:
    """:func:`analyse` as the planner runs it for ``hw``: its profile's scan-stack, remat
    barrier and lowering behaviour (its efficiency table)."""
    return analyse(g, share=share, donated=donated, compiler=hw.efficiency)
