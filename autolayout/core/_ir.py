"""The named-dimension IR: plain, frozen data that every pass walks.

A :class:`Graph` is what :func:`autolayout.trace` returns: the ops of one training step in
program order, the tensors they read and write, and the named dims those tensors' axes
carry. Behaviour lives in functions over a graph (the cost model, the search), not here.

Conventions:

* Every axis of size > 1 carries a dim name; axes of size 1 carry ``None`` (nothing to split).
* Two axes of one tensor never carry the same dim. Axes that unify anyway (attention's query
  and key sequence) are distinct dims of one *family* (``Dim.family``).
* ``Op.links`` says which tensor axes the primitive equates: each link is a tuple of
  ``(tensor name, axis)`` pairs of equal size. Linked axes usually carry the same dim; where
  they do not (the key sequence meeting the query sequence), the op reshards between them.
* Ops inside a ``scan`` body appear once, with ``trip_count`` the number of times they run.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Dim:
    """A named dimension: a class of tensor axes that are split together or not at all.

    As in Mesh-TF a user's dim is a name and a size: one name given to axes of two sizes
    (every kernel's depth ``kd``, 3 and 2) is two dims, named ``kd(3)`` and ``kd(2)``
    (:func:`sized_name`); ``base`` is ``kd`` for both, and a rule for ``kd`` lays out both.
    """

    name: str  # unique in a graph
    size: int
    family: str  # the dims that unify through some op, ignoring the one-tensor rule
    user: bool = False  # named by the user with ``al.spec``

    @property
    def base(self) -> str:
        """The name without its size: ``kd`` for ``kd(3)``, the name itself for most dims."""
        return base_name(self.name)


_SIZED = re.compile(r"\((\d+)\)(?=\*|$)")  # "kd(3)", and each part of "depth(8)*height(8)"


def sized_name(name: str, size: int) -> str:
    """The name of the dim ``name`` of size ``size`` where ``name`` has several sizes:
    ``kd(3)``. A name of one size is the dim's name."""
    return f"{name}({size})"


def base_name(name: str) -> str:
    """``kd(3)`` -> ``kd``; ``depth(8)*height(8)`` -> ``depth*height``; others unchanged."""
    return _SIZED.sub("", name) if "(" in name else name


def name_size(name: str) -> int | None:
    """The size a dim name states (``kd(3)`` -> 3), else None."""
    m = _SIZED.search(name) if "(" in name else None
    return int(m.group(1)) if m and m.end() == len(name) else None


def shown_names(names: Iterable[str | None]) -> dict[str, str]:
    """How a table that holds the dims ``names`` shows each: ``kd(3)`` as ``kd`` where no
    other size of ``kd`` is among them, ``kd(3)`` and ``kd(2)`` where both are."""
    names = {n for n in names if n}
    bases: dict[str, set[str]] = {}
    for n in names:
        bases.setdefault(base_name(n), set()).add(n)
    return {n: n if len(bases[base_name(n)]) > 1 else base_name(n) for n in names}


LOOP_OPS = frozenset({"scan", "while", "cond"})  # ops whose bodies are ops of the graph


def model_named(dim: str | None) -> bool:
    """Whether ``dim`` is a name the model gave (``al.spec``, ``al.name_dims``, or a reshape's
    merge of such names), not a fallback the tracer made up: those carry ``#`` (another dim
    of a named family, ``seq#2``) or ``:`` (an op's axis, ``iota.130:2``)."""
    return dim is not None and "#" not in dim and ":" not in dim


@dataclass(frozen=True, slots=True)
class Tensor:
    """A value of the traced program (one jaxpr variable)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str | None, ...]
    role: str = "intermediate"  # "input" | "const" | "intermediate" | "loop"
    path: str | None = None  # pytree path of a workload argument, e.g. "params/wq"
    host: bool = False  # in host memory (``jax.device_put`` to ``pinned_host``): no HBM

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        size = _ITEMSIZE.get(self.dtype)
        if size is None:
            size = _ITEMSIZE[self.dtype] = np.dtype(self.dtype).itemsize
        return size

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize


_ITEMSIZE: dict[str, int] = {}  # dtype name -> bytes (np.dtype() is slow on a hot path)


@dataclass(frozen=True, slots=True)
class Op:
    """One primitive application (a jaxpr equation), with control flow walked."""

    name: str  # unique, e.g. "dot_general.12"
    primitive: str
    inputs: tuple[str, ...]  # tensor names; literal scalars are left out
    outputs: tuple[str, ...]
    links: tuple[tuple[tuple[str, int], ...], ...] = ()
    params: tuple[tuple[str, Any], ...] = ()  # primitive-specific, plain values
    flops: float = 0.0  # per execution, whole (unsplit) op
    scope: tuple[str, ...] = ()  # enclosing calls and loops, e.g. ("scan.3", "remat.7")
    trip_count: int = 1  # how many times the op runs per step
    opaque: bool = False  # no dim rule: kept replicated, listed in Graph.opaque
    name_stack: str = ""  # the user's jax.named_scope names, transforms left out: "layers.3/mlp"

    def param(self, key: str, default: Any = None) -> Any:
        for k, v in self.params:
            if k == key:
                return v
        return default

    @property
    def remat(self) -> bool:
        """True for work inside a checkpoint/remat region (recomputed in the backward pass)."""
        return any(s.startswith("remat.") for s in self.scope)


@dataclass(frozen=True, slots=True)
class Loop:
    """A ``scan`` or ``while`` whose body ops appear once in ``Graph.ops``."""

    name: str  # the loop op's name, e.g. "scan.40"
    kind: str  # "scan" | "while"
    length: int  # trip count of one execution (1 for a while loop of unknown count)
    ops: tuple[str, ...]  # names of the body's ops (nested loops included)
    length_known: bool = True


@dataclass(frozen=True, slots=True)
class Graph:
    """A traced training step over named dims."""

    name: str
    ops: tuple[Op, ...]
    tensors: Mapping[str, Tensor]
    dim_info: Mapping[str, Dim]
    inputs: tuple[str, ...]  # tensor names of the flattened workload arguments, in order
    outputs: tuple[str, ...]
    loops: tuple[Loop, ...] = ()
    dims: Mapping[str, int] = field(init=False)
    # values computed from the graph, by the passes that read it often (see derived)
    _derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", {d.name: d.size for d in self.dim_info.values()})

    def derived(self, key: Any, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per graph under ``key`` (the graph is immutable, so what
        is derived from it never goes stale): the search and the final pricing read the same
        36k-op graph hundreds of times. Callers must not change what they get."""
        try:
            return self._derived[key]
        except KeyError:
            v = self._derived[key] = make()
            return v

    def named(self, name: str) -> tuple[str, ...]:
        """The dims a layout rule for ``name`` lays out: the dim ``name``, or where the user
        gave ``name`` to axes of several sizes, each of them (``kd`` -> ``kd(3)``,
        ``kd(2)``), largest first. Empty for a name the graph does not have."""
        if name in self.dim_info:
            return (name,)
        return self.derived("sizes of names", lambda: _sizes_of_names(self)).get(name, ())

    @property
    def opaque(self) -> list[Op]:
        """Ops the tracer has no dim rule for; they are kept replicated."""
        return [op for op in self.ops if op.opaque]

    @property
    def families(self) -> dict[str, tuple[str, ...]]:
        """``{family: (dim, ...)}``; a family with two dims had two of its axes meet in one tensor."""
        out: dict[str, list[str]] = {}
        for d in self.dim_info.values():
            out.setdefault(d.family, []).append(d.name)
        return {k: tuple(v) for k, v in out.items()}

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(f"no op named {name!r} in graph {self.name!r}")

    def input_tensor(self, path: str) -> Tensor:
        """The input tensor at a pytree path such as ``"params/wq"``."""
        for t in self.inputs:
            if self.tensors[t].path == path:
                return self.tensors[t]
        known = ", ".join(self.tensors[t].path or t for t in self.inputs[:8])
        raise KeyError(f"no input at path {path!r}; inputs include {known}, ...")

    @property
    def total_flops(self) -> float:
        """FLOPs of one step, loops multiplied out."""
        return sum(op.flops * op.trip_count for op in self.ops)


def _sizes_of_names(g: Graph) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[Dim]] = {}
    for d in g.dim_info.values():
        if d.base != d.name and "*" not in d.name:
            out.setdefault(d.base, []).append(d)
    return {k: tuple(d.name for d in sorted(v, key=lambda d: -d.size)) for k, v in out.items()}


def per_graph(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Caches ``fn(g, *args)`` on graph ``g`` (:meth:`Graph.derived`); lists among ``args``
    key as tuples. For the mesh-independent passes the search and the pricing repeat."""

    @functools.wraps(fn)
    def cached(g: Graph, *args: Any) -> Any:
        key = (fn, tuple(tuple(a) if isinstance(a, list) else a for a in args))
        return g.derived(key, lambda: fn(g, *args))

    return cached


@per_graph
def op_index(g: Graph) -> dict[str, int]:
    """Each op's position in program order."""
    return {op.name: i for i, op in enumerate(g.ops)}


@per_graph
def loop_links(g: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """Where loops hand tensors over: each body input -> the tensor the loop feeds it, and
    each loop output -> the body's tensor it is (the first branch's, for a ``cond``)."""
    outer: dict[str, str] = {}
    body: dict[str, str] = {}
    for op in g.ops:
        for o, b in op.param("body_inputs", ()):
            outer[b] = o
        for o, b in zip(op.outputs, op.param("body_outputs", ()), strict=False):
            body[o] = b
    return outer, body


# ops a loop-invariant code motion leaves where they are: control flow, effects, transfers
_STAYS = frozenset({"scan", "while", "cond", "device_put", "optimization_barrier", "rng_uniform",
                    "io_callback", "debug_callback", "pure_callback"})  # fmt: skip


def invariant_levels(ops: Iterable[Op]) -> tuple[dict[str, int], dict[str, int]]:
    """``(runs, made)``: how many times a step each op runs and each tensor is made once
    XLA hoists what a scan's iterations share out of it (``WhileLoopInvariantCodeMotion``):
    an op of a scan body whose inputs are all made outside that scan (its constants, a carry
    the body hands on unchanged, a slice or a result of a one-iteration scan, or ops of those
    alone) runs as often as they are made; so does a copy of such an input into another layout (FSDP's
    weights gathered in a microbatch loop: once a step, measured on XLA:CPU). ``ops`` in
    program order (a loop's body before the loop); tensors no op makes are made once."""
    ops = list(ops)
    # body input -> (the outer tensor it is, or None and its trips)
    outer: dict[str, tuple[str | None, int]] = {}
    for op in ops:
        if op.primitive != "scan":
            continue
        n = int(op.param("length", 1))
        changed = {b for _, b in op.param("carries", ())}
        scanned = set(op.param("scanned_inputs", ()))
        for o, b in op.param("body_inputs", ()):
            same = b not in changed and (b not in scanned or n == 1)
            outer[b] = (o, 0) if same else (None, op.trip_count * max(n, 1))

    made: dict[str, int] = {}

    def level(t: str) -> int:
        v = made.get(t)
        if v is None:
            o, trips = outer.get(t, (None, 1))
            v = made[t] = level(o) if o is not None else trips
        return v

    runs: dict[str, int] = {}
    for op in ops:
        trips = op.trip_count
        if not op.inputs:  # a constant or an iota: hoisted along with what it feeds
            for t in op.outputs:
                made[t] = 1
            runs[op.name] = trips
            continue
        if (
            op.primitive not in _STAYS
            and trips > 1
            and not any(s.startswith(("cond.", "while.")) for s in op.scope)
        ):
            trips = min(trips, max(level(t) for t in op.inputs))
        runs[op.name] = trips
        for t in op.outputs:
            made[t] = trips
        if op.primitive == "scan" and int(op.param("length", 1)) == 1:  # its body's results
            for o, b in zip(op.outputs, op.param("body_outputs", ()), strict=False):
                made[o] = min(trips, level(b))
    for op in ops:
        for t in op.inputs:
            level(t)
    return runs, made


def hoist_ops(ops: Iterable[Op]) -> tuple[Op, ...]:
    """``ops`` with each one's ``trip_count`` as often as it runs once XLA hoists what a
    scan's iterations share (:func:`invariant_levels`)."""
    ops = tuple(ops)
    runs, _ = invariant_levels(ops)
    return tuple(op if runs[op.name] == op.trip_count else replace(op, trip_count=runs[op.name])
                 for op in ops)  # fmt: skip


@per_graph
def made_at(g: Graph) -> dict[str, int]:
    """How many times a step each tensor is made (:func:`invariant_levels`): a copy of it
    into another layout is made as often, wherever it is read."""
    return invariant_levels(g.ops)[1]


@per_graph
def _scan_extents(g: Graph) -> dict[str, tuple[int, int, int]]:
    """Each scan's ``(first body op, the scan op, its body's trips)`` in program indices."""
    index = op_index(g)
    out = {}
    for lp in g.loops:
        if lp.kind == "scan" and lp.ops:
            op = g.ops[index[lp.name]]
            out[lp.name] = (index[lp.ops[0]], index[lp.name], op.trip_count * max(lp.length, 1))
    return out


def hoisted(g: Graph, i: int, t: str) -> tuple[int, int, str | None]:
    """``(first, last, loop)``: where tensor ``t`` (or its copy), written or read by the op at
    program index ``i``, is alive, and the outermost scan XLA hoists it out of
    (:func:`made_at`): the whole of that scan, from its first body op to the scan op; ``(i,
    i, None)`` for a tensor made in every iteration. Copies hoisted out of two loops are two
    (XLA:CPU gathers a weight an ALBERT-style stack's forward and backward scans share twice,
    measured), each alive through its loop."""
    op = g.ops[i]
    if op.trip_count > 1 or op.scope:
        made = made_at(g)[t]
        extents = _scan_extents(g)
        for s in op.scope:
            e = extents.get(s)
            if e is not None and e[2] > made:
                return e[0], e[1], s
    return i, i, None


class GraphInvariantError(AssertionError):
    """A graph broke an IR invariant: a bug in the pass that built it."""


def check_graph(g: Graph) -> None:
    """Checks the IR invariants; raises :class:`GraphInvariantError` naming the first broken one."""

    def fail(msg: str) -> None:
        raise GraphInvariantError(f"graph {g.name!r}: {msg}")

    for name, d in g.dim_info.items():
        if name != d.name:
            fail(f"dim_info key {name!r} holds dim {d.name!r}")
        if d.size < 2:
            fail(f"dim {name!r} has size {d.size}; size-1 axes carry None")
    for tname, t in g.tensors.items():
        if tname != t.name:
            fail(f"tensors key {tname!r} holds tensor {t.name!r}")
        if len(t.dims) != len(t.shape):
            fail(f"tensor {t.name} has {len(t.shape)} axes but {len(t.dims)} dims")
        seen: set[str] = set()
        for axis, (size, dim) in enumerate(zip(t.shape, t.dims, strict=True)):
            if size == 1 and dim is not None:
                fail(f"tensor {t.name} axis {axis} has size 1 but dim {dim!r}")
            if size != 1:
                if dim not in g.dim_info:
                    fail(f"tensor {t.name} axis {axis} carries unknown dim {dim!r}")
                if g.dim_info[dim].size != size:
                    fail(
                        f"tensor {t.name} axis {axis} has size {size}, dim {dim!r} has size {g.dims[dim]}"
                    )
                if dim in seen:
                    fail(f"tensor {t.name} carries dim {dim!r} twice")
                seen.add(dim)
    for i in g.inputs:
        if g.tensors[i].role != "input":
            fail(f"input {i} has role {g.tensors[i].role!r}")
    defined = {n for n, t in g.tensors.items() if t.role in ("input", "const", "loop")}
    op_names: set[str] = set()
    for op in g.ops:
        if op.name in op_names:
            fail(f"two ops named {op.name}")
        op_names.add(op.name)
        if op.trip_count < 1:
            fail(f"op {op.name} has trip_count {op.trip_count}")
        for i in op.inputs:
            if i not in defined:
                fail(f"op {op.name} reads {i} before any op writes it")
        for o in op.outputs:
            if o not in g.tensors:
                fail(f"op {op.name} writes {o}, which the graph has no tensor for")
            if o in defined and g.tensors[o].role != "loop":
                fail(f"tensor {o} is written twice (again by {op.name})")
            defined.add(o)
        for link in op.links:
            sizes = {g.tensors[t].shape[a] for t, a in link}
            if len(sizes) != 1:
                fail(f"op {op.name} links axes of sizes {sorted(sizes)}: {link}")
    for o in g.outputs:
        if o not in defined:
            fail(f"output {o} is never written")
    for loop in g.loops:
        missing = [n for n in loop.ops if n not in op_names]
        if missing:
            fail(f"loop {loop.name} names unknown ops {missing[:3]}")
