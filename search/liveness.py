"""Memory in the search: the peak bytes per device of a choice (a liveness walk over the
request's layouts, as arrays on large graphs) and the memory rows the ILP adds at the peaks a
solution breaks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autolayout.core import hoisted, local_bytes
from autolayout.cost_models import (
    liveness_peak,
)

from .request import Request
from .structure import ARRAY_WALK_OPS, Structure

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
    place = _placer(st)
    copies = []
    for t, rs in st.reads:
        before = [(st.node_of[r], pos) for r, pos, i in rs if place(i) <= point]
        after = [(st.node_of[r], pos) for r, pos, i in rs if place(i) >= point]
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


def _placer(st: Structure):
    """Program index -> position in the schedule ``st.lifetimes`` is walked in (the same
    where that is program order)."""
    return getattr(st.lifetimes, "place", lambda i: i)


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
        r_tensor, r_ti, r_kind, r_want, r_at = [], [], [], [], []
        copy_ids: dict[tuple[int, str | None], int] = {}  # (read tensor, loop hoisted from)
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
                lo, hi, loop = hoisted(g, i, t)  # a loop's invariant: a copy a loop, through it
                r_tensor.append(copy_ids.setdefault((ti, loop), len(copy_ids)))
                r_ti.append(ti)
                r_kind.append(k)
                r_want.append(w)
                r_at.append((lo, hi))
        self.r_tensor = np.array(r_tensor, dtype=np.int64)
        self.r_shape = np.array(read_shape, dtype=np.int64)[np.array(r_ti, dtype=np.int64)]
        self.r_kind = np.array(r_kind, dtype=np.int64)
        self.r_want = np.array(r_want, dtype=np.int64)
        self.r_at = np.array(r_at, dtype=np.int64).reshape(-1, 2)
        self.n = len(g.ops)
        # a copy's first and last reader (program indices) -> schedule positions (Lifetimes.span)
        position = getattr(lives, "position", None)
        self.position = None if position is None else np.array(position, dtype=np.int64)
        self.made = None if position is None else np.array(lives.made, dtype=np.int64)

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
                np.minimum.at(first, inv, at[:, 0])
                np.maximum.at(last, inv, at[:, 1])
                if self.position is not None:  # as Lifetimes.span
                    a, b = self.position[first], self.position[last]
                    first, last = np.minimum(self.made[first], b), np.maximum(a, b)
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
    """(peak bytes per device, point of the peak: a position in the schedule the structure's
    lifetimes follow) of a choice: the liveness walk of
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
        spans: dict[tuple[int, str | None], list[int]] = {}
        src = maps[t][choice[root[t].node]]
        for r, pos, i in rs:
            k = st.node_of[r]
            w = req.nodes[k].wanted[pos][choice[k]]
            if w != src:  # a loop's invariant: one copy a loop, alive through it
                lo, hi, loop = hoisted(g, i, t)
                key = (w, loop)
                sp = spans.get(key)
                if sp is None:
                    spans[key] = [lo, hi]
                else:
                    sp[0], sp[1] = min(sp[0], lo), max(sp[1], hi)
        copies += [(a, b, req.local_bytes(t, w)) for (w, _), (a, b) in spans.items()]
    mem = liveness_peak(g, nbytes, copies=copies, lives=st.lifetimes)
    if mem.peak_op is None:
        return mem.peak_bytes, 0
    return mem.peak_bytes, _placer(st)(st.index[mem.peak_op])
