"""The tracer's builder: the ops, tensors and axis links of a graph as the walk emits them."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._ir import Loop, Op

_SCALARS = frozenset({int, float, str, bool, type(None)})


def _plain(v: Any) -> Any:
    """Parameters as hashable plain data: dicts as sorted item tuples, lists as tuples, numpy
    integers as ints."""
    kind = type(v)
    if kind in _SCALARS:
        return v
    if isinstance(v, dict):
        return tuple(sorted((k, _plain(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        if all(type(x) in _SCALARS for x in v):
            return v if kind is tuple else tuple(v)
        return tuple(_plain(x) for x in v)
    if isinstance(v, np.integer):
        return int(v)
    return v


_DTYPE_NAMES: dict[Any, str] = {}  # a jax dtype -> its numpy name


_HOST: dict[Any, bool] = {}  # a memory space -> whether it is the host's


def in_host_memory(aval: Any) -> bool:
    """Whether a value of ``aval`` lives in host memory (``jax.device_put`` to
    ``pinned_host``: memory space Host)."""
    space = getattr(aval, "memory_space", "")
    try:
        return _HOST[space]
    except (KeyError, TypeError):  # a new space, or one that does not hash
        host = str(space).endswith("Host")
        with contextlib.suppress(TypeError):
            _HOST[space] = host
        return host


class _Builder:
    """Collects tensors, ops and axis links while the jaxpr is walked."""

    def __init__(self, visits: bool = True) -> None:
        self.visiting = visits  # record the visits (only the runtime reads them)
        self.shapes: list[tuple[int, ...]] = []
        self.names: list[str] = []  # "t<id>" of each tensor
        self.dtypes: list[str] = []
        self.roles: list[str] = []
        self.paths: list[str | None] = []
        self.hosts: list[bool] = []  # in host memory (an aval of memory space Host)
        self.user: dict[int, tuple[str | None, ...]] = {}
        self.offsets: list[int] = []
        self.nax = 0
        self.links: list[tuple[int, int]] = []  # axis-key pairs of the live ops, program order
        self._pending: list[list[tuple[tuple[int, int], ...]]] = []
        self.ops: list[Op] = []
        self.producer: dict[int, str] = {}
        self.scope: list[str] = []
        # per level of the walk, outermost first: "/".join of the equations' non-empty name
        # stacks down to it
        self.joined: list[str] = []
        self.trip = 1
        self.loops: list[Loop] = []
        # tensor ids of every equation visited, keyed by its path (equation indices down the
        # walk; "cond"/"body"/branch labels inside loops): the runtime walks the same way
        self.visits: dict[tuple, tuple[list[int | None], list[int]]] = {}
        self.visit_keys: list[tuple] = []  # the visits' keys in order
        self.path: list[Any] = []
        self.number = 0  # the next op number
        self.templates: dict[tuple, Any] = {}  # _trace._Template per inlined call walked once
        self.int_links: dict[int, list] = {}  # op number -> its links over tensor ids
        self.scopes: dict[tuple, tuple] = {}  # one object per scope
        self.int_io: list[tuple[int, Sequence[int | None], Sequence[int]]] = []  # per op:
        # (number, input ids, output ids)
        self.io: list[tuple[list[int], list[int]]] = []  # per live op after dead-code removal:
        # (input ids, literals left out, output ids), as its inputs and outputs name them
        self.program: Any = None  # _roles._Program: what the naming reads of the live ops

    # tensors ---------------------------------------------------------------------------
    def new(self, aval: Any, role: str = "intermediate", path: str | None = None) -> int:
        shape = tuple(map(int, getattr(aval, "shape", ())))
        raw = getattr(aval, "dtype", None)
        dtype = _DTYPE_NAMES.get(raw)
        if dtype is None:
            try:
                dtype = np.dtype(raw).name
            except TypeError:
                dtype = str(raw)
            _DTYPE_NAMES[raw] = dtype
        self.names.append(f"t{len(self.shapes)}")
        self.shapes.append(shape)
        self.dtypes.append(dtype)
        self.roles.append(role)
        self.paths.append(path)
        self.hosts.append(in_host_memory(aval))
        self.offsets.append(self.nax)
        self.nax += len(shape)
        return len(self.shapes) - 1

    def shape(self, t: int | None) -> tuple[int, ...]:
        return () if t is None else self.shapes[t]

    def key(self, t: int, axis: int) -> int:
        return self.offsets[t] + axis

    # links and ops ---------------------------------------------------------------------
    def link(self, *axes: tuple[int | None, int]) -> None:
        """Says these axes are one iteration axis; pairs of another size than the first, or of
        size 1, are left out (a broadcast or a partial slice is a relation, not an identity)."""
        shapes = self.shapes
        size = 0
        keep: list[tuple[int, int]] = []
        for ta in axes:
            t, a = ta
            if t is None:
                continue
            n = shapes[t][a]
            if not size:
                if n <= 1:
                    return
                size = n
                keep.append(ta)
            elif n == size and ta not in keep:
                keep.append(ta)
        if len(keep) >= 2:
            self._pending[-1].append(tuple(keep))

    def link_pair(self, t: int, a: int, u: int, c: int) -> None:
        """``link((t, a), (u, c))`` for two axes of tensors (not literals), without its loop:
        most links are such pairs (every axis of an elementwise op)."""
        shapes = self.shapes
        n = shapes[t][a]
        if n > 1 and shapes[u][c] == n and (t != u or a != c):
            self._pending[-1].append(((t, a), (u, c)))

    def begin(self) -> int:
        """Opens an op: returns its number; links go to it until :meth:`emit`."""
        self._pending.append([])
        return self.take_number()

    def take_number(self) -> int:
        n = self.number
        self.number += 1
        return n

    def drop_links(self) -> None:
        """Forgets the open op's links: it becomes opaque."""
        self._pending[-1].clear()

    def emit(
        self,
        number: int,
        primitive: str,
        ins: Sequence[int | None],
        outs: Sequence[int],
        params: dict[str, Any] | None = None,
        flops: float = 0.0,
        opaque: bool = False,
    ) -> str:
        """Closes the open op: adds it with the links given since :meth:`begin`."""
        return self.add_op(number, primitive, ins, outs, self._pending.pop(),
                           _plain(params) if params else (),
                           float(flops), tuple(self.scope), opaque,
                           self.joined[-1] if self.joined else "")  # fmt: skip

    def add_op(self, number: int, primitive: str, ins: Sequence[int | None], outs: Sequence[int],
               groups: list, params: Any, flops: float, scope: tuple[str, ...], opaque: bool,
               name_stack: str) -> str:  # fmt: skip
        """Adds an op over tensor ids (``groups``: its links over ids) at the current trip
        count; returns its name."""
        name = f"{primitive}.{number}"
        self.int_links[number] = groups
        tn = self.names
        op = Op(
            name=name,
            primitive=primitive,
            inputs=tuple([tn[i] for i in ins if i is not None]),
            outputs=tuple([tn[o] for o in outs]),
            links=tuple([tuple([(tn[t], a) for t, a in g]) for g in groups]),
            params=params,
            flops=flops,
            scope=self.scopes.setdefault(scope, scope),
            trip_count=self.trip,
            opaque=opaque,
            name_stack=name_stack,
        )
        self.ops.append(op)
        self.int_io.append((number, ins, outs))
        for o in outs:
            self.producer.setdefault(o, name)
        return name

    def visit(self, key: tuple, ins: list[int | None], outs: list[int]) -> None:
        """Records an equation's tensor ids under its path (for the runtime)."""
        self.visits[key] = (ins, outs)
        self.visit_keys.append(key)
