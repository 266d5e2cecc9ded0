"""How one op runs under a sharding, and what moving a tensor between shardings costs.

A *layout* gives each axis of a tensor the mesh axes it is split over (``()`` for whole):
``(("data",), (), ("model",))`` splits a ``[batch, seq, d_ff]`` activation's batch on
``data`` and its d_ff on ``model``. A mesh axis splits at most one axis of a tensor.

An op's axes fall into *groups*: the tensor axes its primitive equates (``Op.links``),
joined transitively, plus every unlinked axis on its own. A group is

* ``pass``: it reaches an output; splitting it splits the work and the output alike;
* ``sum`` / ``max`` / ``min``: it is reduced away (a matmul's contracting dim, a
  ``reduce_sum`` axis, an embedding's vocab in a gather): splitting it leaves each device a
  partial result, which an all-reduce (or a reduce-scatter, when the consumer wants the result
  split on that axis) completes;
* ``fixed``: it must stay whole in this op (a sort axis, a concat axis, a conv's window).

A *strategy* gives each group mesh axes. From it follow the layout the op wants of each
input, the layout and partial axes of each output, and its local FLOPs; the difference
between a tensor's layout and the one its consumer wants is a resharding
(:func:`reshard`): dropping a split is an all-gather, moving one to another tensor axis an
all-to-all, adding one a free local slice. This is Mesh-TF's einsum lowering
(``mesh_tensorflow/ops.py``) and Alpa's resharding table, with the work counted.

``bytes`` of a collective is its result buffer on one device, as XLA's compiled HLO shows it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from autolayout.core import (
    ELEMENTWISE,
    LOOP_OPS,
    Graph,
    Hardware,
    HardwareError,
    Layout,
    Op,
    Tensor,
    attention_axes,
    hoisted,
    local_bytes,
    local_shape,
    made_at,
    op_index,
    per_graph,
    replicated,
    split_factor,
)

from .collectives import Segment, collective_time, combines, group_segments, place_mesh
from .compute import (
    ATTENTION_OPS,
    GROUPED_MATMUL,
    KERNEL_OPS,
    MATRIX_OPS,
    compute_dtype,
    op_time,
)
from .xla_reshard import slice_exchange, xla_reshard

# input-only groups of these primitives are reductions (each device sums its part)
_SUM_OPS = frozenset(
    {"dot_general", "conv_general_dilated", "reduce_sum", "gather", "scatter-add", "scatter_add"}
)
_REDUCE_KIND = {"reduce_max": "max", "reduce_min": "min"}
_SCATTER_OPS = frozenset({"scatter-add", "scatter_add", "scatter"})
_PARTIAL = ("sum", "max", "min")  # group kinds that leave a partial result
# ops that move no data through HBM of their own (views, or fused into their consumer)
_FREE_OPS = frozenset(
    {"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "name", "iota", "stop_gradient"}
)


# --- collectives ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comm:
    """One collective: its kind, the mesh axes of its groups, result bytes per device."""

    kind: str
    axes: tuple[str, ...]
    bytes: int
    time_s: float
    tensor: str
    why: str  # "reshard" | "partial" | "halo" | "align" (an indexed table moved, index_alignment)
    combined: bool = False  # XLA may merge it with others of its kind (the state's)


PROMOTED_ON_CPU = ("bfloat16", "float16")  # XLA:CPU all-reduces/all-gathers them as float32


@dataclass
class Machine:
    """A hardware profile with a mesh laid on it: prices collectives over mesh axes."""

    hw: Hardware
    mesh: dict[str, int]
    # dims of the state (donated inputs: weights, optimizer state): a tensor laid out like
    # one (a weight, its gradient) is independent of the others of its kind, so XLA's
    # combiners merge its collectives (collectives.COMBINE_BYTES)
    state_dims: frozenset = frozenset()
    placement: dict[str, tuple[Segment, ...]] = field(init=False)

    def __post_init__(self) -> None:
        self.placement = place_mesh(self.hw, self.mesh)

    @property
    def reduce_scatter(self) -> bool:
        """Whether the backend lowers partial-sum-then-split as a reduce-scatter (XLA:CPU
        lowers it as an all-reduce and a local slice)."""
        return self.hw.kind != "cpu"

    def wire_bytes(self, t: Tensor, nbytes: int) -> int:
        """An all-reduce's or all-gather's bytes as the backend moves them: XLA:CPU promotes
        16-bit floats to float32 in both (``add.clone_promoted``; measured: bf16 FSDP
        all-gathers compile at 2.0x)."""
        if self.hw.kind == "cpu" and t.dtype in PROMOTED_ON_CPU:
            return nbytes * 2
        return nbytes

    def combinable(self, t: Tensor) -> bool:
        """In a step with state: a tensor over the dims of a state tensor in any order (a
        weight, its gradient, transposed or not), or a scalar (the loss, which rides along
        with the gradients): independent of the others of its kind."""
        if not self.state_dims:  # no state, no gradients to ride along with
            return False
        return t.size == 1 or frozenset(d for d in t.dims if d) in self.state_dims

    def comm(
        self, kind: str, axes: tuple[str, ...], result: int, tensor: str, why: str,
        combined: bool = False,
    ) -> Comm:  # fmt: skip
        n = split_factor(axes, self.mesh)
        full = result * n if kind in ("reduce-scatter", "all-to-all") else result
        combined = combined and combines(self.hw, kind)
        t = collective_time(self.hw, kind, group_segments(self.placement, axes), full, combined)
        return Comm(kind, tuple(axes), int(result), t, tensor, why, combined)


def state_dims(g: Graph, donated) -> frozenset:
    """The dims of the state (``donated`` input tensors) and, for one a ``scan`` reads, of one
    layer of it (its leading axis dropped: what the body reads), each as a set: tensors over
    these dims are weights, their gradients and optimizer moments (:attr:`Machine.state_dims`)."""
    scanned = {t for op in g.ops if op.primitive == "scan" for t in op.inputs}
    out = set()
    for t in donated:
        dims = g.tensors[t].dims
        for ds in (dims, dims[1:]) if t in scanned else (dims,):
            named = frozenset(d for d in ds if d)
            if named:
                out.add(named)
    return frozenset(out)


def _axis_positions(layout: Layout) -> dict[str, int]:
    return {a: i for i, axes in enumerate(layout) for a in axes}


def reshard(m: Machine, t: Tensor, src: Layout, dst: Layout) -> list[Comm]:
    """The collectives that take tensor ``t`` from layout ``src`` to ``dst``, as XLA's SPMD
    partitioner emits them (:func:`.xla_reshard.xla_reshard`): a collective-permute where
    only the devices holding each block change, all-to-alls where splits move between
    tensor axes, all-gathers where they are dropped (the last tensor axis first), a free
    local slice where they are added, the whole tensor gathered where XLA knows no better.
    16-bit all-gathers move as float32 on XLA:CPU (:meth:`Machine.wire_bytes`).
    """
    if src == dst:
        return []
    out: list[Comm] = []
    for kind, axes, divisor in _xla_steps(m, t, src, dst)[0]:
        result = t.nbytes // divisor
        if kind == "all-gather":
            out.append(m.comm(kind, axes, m.wire_bytes(t, result), t.name, "reshard",
                              m.combinable(t)))  # fmt: skip
        else:
            out.append(m.comm(kind, axes, result, t.name, "reshard"))
    return out


def _xla_steps(m: Machine, t: Tensor, src: Layout, dst: Layout) -> tuple[tuple, bool]:
    key = (tuple(m.mesh.items()), tuple(t.shape), tuple(map(tuple, src)), tuple(map(tuple, dst)))
    return xla_reshard(*key)


def copy_layout(m: Machine, t: Tensor, src: Layout, dst: Layout) -> Layout:
    """The copy a read of ``t`` (laid out ``src``) in layout ``dst`` makes: ``dst``, or the
    whole tensor where XLA gathers it whole to get there (it keeps that copy for every such
    read of the value: the U-Net's ``[a], [b], [c]`` activation read as ``[a b c]`` and
    whole by two convs is gathered once). Copies are charged once per tensor, copy layout and
    trip count, by ``price`` and the search's request alike."""
    if src == dst or not any(dst) or not _xla_steps(m, t, src, dst)[1]:
        return dst
    return replicated(len(dst))


def from_partial(
    m: Machine,
    t: Tensor,
    produced: Layout,
    partial: tuple[str, ...],
    dst: Layout,
    form: str = "",
    parts: list[tuple[str, ...]] | None = None,
    first: tuple[str, ...] = (),
) -> list[Comm]:
    """Completes a partial result (summed over ``partial`` mesh axes) into layout ``dst``.

    A partial axis that ``dst`` splits ``t`` on is reduce-scattered first, the rest then
    all-reduced on the scattered piece; then :func:`reshard`. On a backend without
    reduce-scatter (XLA:CPU) it depends on the op's ``form`` (measured, 8 CPU devices): a
    matmul or conv (``"dot"``: XLA's dot handler partitions to the output's split) is computed
    at the splits of ``dst`` that are not partial, all-reduces the whole buffer once per tensor
    axis ``dst`` splits on partial axes alone (slicing after), then the rest of the partial
    axes on the slice: partial over ``a, b, c`` into ``[a, b]`` is an all-reduce over ``b``
    and one over ``a`` of the whole and one over ``c`` of a quarter. A gather (``"gather"``)
    is computed at every split of ``dst`` on a mesh axis not partial, wherever it stands
    (XLA's gather handler partitions the indices' batch by the output's split, less the
    table's axes): the embedding's output split on ``fsdp, data`` with the table's vocab on
    ``fsdp`` all-reduces a quarter over ``fsdp``, then a slice and a permute (the order of
    the axes); where ``dst`` splits it on partial axes, free mesh axes take those splits before
    the sum (:func:`_gather_on_free_axes`). Any other op (a reduce, a scatter-add) all-reduces
    the whole buffer once per reduced tensor axis (``parts``: the partial axes of each; a sum
    over a batch split on ``a, b`` and a sequence split on ``c`` is two all-reduces of the
    whole), then slices.
    ``first``: partial axes summed by themselves before the rest, whole (a weight gradient's
    spatial split, :func:`_window_axes`).
    """
    cur = [tuple(x) for x in produced]
    if not partial:
        return reshard(m, t, tuple(cur), dst)
    out: list[Comm] = []
    combinable = m.combinable(t)

    def all_reduce(axes) -> Comm:
        result = m.wire_bytes(t, local_bytes(t, tuple(cur), m.mesh))
        return m.comm("all-reduce", tuple(axes), result, t.name, "partial", combinable)

    first = tuple(a for a in first if a in partial)
    if first and len(first) < len(partial):
        out.append(all_reduce(first))
        partial = tuple(a for a in partial if a not in first)

    used = {a for axes in cur for a in axes}
    if m.reduce_scatter:
        dp = _axis_positions(dst)
        scatter = [a for a in partial if a in dp and a not in used]
        if scatter:
            for a in scatter:
                cur[dp[a]] = cur[dp[a]] + (a,)
            result = m.wire_bytes(t, local_bytes(t, tuple(cur), m.mesh))
            out.append(m.comm("reduce-scatter", tuple(scatter), result, t.name, "partial",
                              combinable))  # fmt: skip
        rest = tuple(a for a in partial if a not in scatter)
    elif form == "gather":
        for j, d in enumerate(dst):
            cur[j] = cur[j] + tuple(a for a in d if a not in partial and a not in used)
        summed = _gather_on_free_axes(m, t, cur, partial, dst, combinable)
        out += summed
        rest = () if summed else partial
    elif form == "dot":
        new = [d[len(c) :] if d[: len(c)] == c else () for c, d in zip(cur, dst, strict=True)]
        scatter = [a for a in new if a and set(a) <= set(partial) and not set(a) & used]
        for j, a in enumerate(new):  # the splits that are no partial axis: computed so
            if a and not set(a) & (set(partial) | used):
                cur[j] = cur[j] + a
        out += [all_reduce(a) for a in reversed(scatter)]
        for j, a in enumerate(new):
            if a in scatter:
                cur[j] = cur[j] + a
        rest = tuple(a for a in partial if not any(a in s for s in scatter))
    else:
        out += [all_reduce(p) for p in parts or [partial] if p]
        rest = ()
    if rest:
        out.append(all_reduce(rest))
    return out + reshard(m, t, tuple(cur), dst)


def _gather_on_free_axes(
    m: Machine, t: Tensor, cur: list[tuple[str, ...]], partial: tuple[str, ...], dst: Layout,
    combinable: bool,
) -> list[Comm]:  # fmt: skip
    """A gather's partial result where ``dst`` splits it on partial axes and mesh axes are
    free (in neither ``cur``, ``partial`` nor ``dst``): XLA's gather handler partitions the
    output like ``dst`` within each group of devices that sums (the free axes' devices, as far
    as they go), all-reduces that piece over the partial axes, slices it to ``dst``'s and
    permutes it onto ``dst``'s devices (measured, 8 CPU devices, rows split on ``b`` of a 2x4
    mesh into ``[_, b]``: an all-reduce of half the rows' width, a permute of a quarter).
    Updates ``cur`` to the permuted layout; none where nothing is free (whole, then sliced)."""
    taken = {a for axes in (*cur, *dst) for a in axes} | set(partial)
    free = math.prod(n for a, n in m.mesh.items() if a not in taken)
    shrink = 1
    for j, d in enumerate(dst):
        need = split_factor(tuple(a for a in d if a in partial), m.mesh)
        k = math.gcd(math.gcd(need, free), t.shape[j] // split_factor(cur[j], m.mesh))
        free //= k
        shrink *= k
    if shrink == 1:
        return []
    axes = tuple(a for a in m.mesh if a in partial or a not in taken)
    piece = m.wire_bytes(t, local_bytes(t, tuple(cur), m.mesh) // shrink)
    out = [m.comm("all-reduce", partial, piece, t.name, "partial", combinable)]
    for j, d in enumerate(dst):  # permuted straight into dst's order where it holds cur's
        cur[j] = d if set(cur[j]) <= set(d) else cur[j] + tuple(a for a in d if a in partial)
    sliced = local_bytes(t, tuple(cur), m.mesh)
    return out + [m.comm("collective-permute", axes, sliced, t.name, "partial")]


def index_alignment(
    m: Machine, g: Graph, op: Op, wanted: dict[str, Layout], produced: dict[str, Layout]
) -> list[Comm]:
    """The collective-permute XLA's partitioner adds around a gather (or scatter) whose table
    is split on its indexed axes and whose indices are split too: it runs each group of
    devices holding one block of indices on the table's split, and takes those groups from the
    table's replicated mesh axes, majors first. Where those are not the indices' own axes
    (table split on ``c``, indices on ``b``, ``a`` free: the groups by ``a``), the table's
    block is permuted onto the others (and a scatter's result back). Measured on 8 CPU devices
    (2x2x2): the pipelined GPT's vocab-split embedding and its gradient, 64 KiB each."""
    scatter = op.primitive in _SCATTER_OPS
    if op.primitive != "gather" and not scatter or len(op.inputs) < 2:
        return []
    table = op.outputs[0] if scatter else op.inputs[0]
    lay = produced[table] if scatter else wanted[table]
    indexed = op.param("scattered_axes" if scatter else "gathered_axes", ())
    split = {a for ax in indexed if ax < len(lay) for a in lay[ax]}
    used = {a for axes in lay for a in axes}
    # the indices' axes, but those the table splits alike (take_along_axis's batch)
    by = {a for axes in wanted[op.inputs[1]] for a in axes} - used
    need = split_factor(tuple(by), m.mesh)
    if not split or need == 1:
        return []
    groups: set[str] = set()
    n = 1
    for a in m.mesh:  # the replicated axes, majors first, until they make as many groups
        if n >= need:
            break
        if a not in used:
            groups.add(a)
            n *= m.mesh[a]
    if groups == by:
        return []
    t = g.tensors[table]
    result = local_bytes(t, lay, m.mesh)
    return [m.comm("collective-permute", tuple(sorted(groups | by, key=list(m.mesh).index)),
                   result, t.name, "align")]  # fmt: skip


# --- op groups ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Group:
    """Tensor axes of one op that split together (see the module docstring)."""

    members: tuple[tuple[str, int], ...]  # (tensor, axis) split by the group's mesh axes
    kind: str  # "pass" | "sum" | "max" | "min" | "fixed"
    dim: str | None  # the dim that names the group (an output's, where it has one)


def _fixed_members(g: Graph, op: Op) -> set[tuple[str, int]]:
    """Axes this primitive cannot split (yet): sort/scan axes, conv windows, partial updates."""
    p = op.primitive
    ins = op.inputs
    fixed: set[tuple[str, int]] = set()
    if p in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
        fixed.add((ins[0], op.param("scan_axis")))
    elif p == "sort":
        fixed.update((t, op.param("sort_axis")) for t in ins)
    elif p == "top_k":  # XLA's SPMD partitioner replicates top_k whole (measured on XLA:CPU)
        fixed.update((t, a) for t in ins + op.outputs for a in range(len(g.tensors[t].shape)))
    elif p == "rev":
        fixed.update((ins[0], a) for a in op.param("reversed_axes", ()))
    elif p == "conv_general_dilated" and op.param("grouped"):
        # XLA gathers it whole; al.apply runs it under shard_map on its batch alone
        fixed.update((t, a) for t in op_tensors(op) for a in range(len(g.tensors[t].shape)))
        tensors = (ins[0], ins[1], op.outputs[0])
        fixed.difference_update((tensors[k], a) for k, a in op.param("grouped"))
    elif p == "conv_general_dilated":
        for s, form in conv_spatial(op):
            if form is None:  # a window XLA cannot halo-exchange: whole
                fixed.update({(ins[0], s["lhs"]), (ins[1], s["rhs"]), (op.outputs[0], s["out"])})
            elif form == "forward":  # the kernel's window axis stays whole
                fixed.add((ins[1], s["rhs"]))
            else:  # "kernel": the weight gradient's window axis stays whole
                fixed.add((op.outputs[0], s["out"]))
    elif p in KERNEL_OPS:  # a custom call XLA cannot partition: whole on every device
        fixed.update((t, a) for t in op_tensors(op) for a in range(len(g.tensors[t].shape)))
    elif p in ATTENTION_OPS:  # cuDNN splits batch and heads only
        ax = attention_axes(op.param("layout", 0))
        like_q, like_k, stat = _attention_roles(op)
        for t in like_q + like_k:
            fixed.update({(t, ax["t"]), (t, ax["h"])})
        if stat is not None:
            fixed.add((stat, 2))
        qk = set(like_q + like_k) | {stat}
        fixed.update(
            (t, a) for t in op_tensors(op) if t not in qk for a in range(len(g.tensors[t].shape))
        )
    elif p == "dynamic_update_slice":
        op_shape, up_shape = g.tensors[ins[0]].shape, g.tensors[ins[1]].shape
        fixed.update((ins[0], a) for a in range(len(op_shape)) if op_shape[a] != up_shape[a])
    return fixed


# --- convolutions split along space: halo exchange ----------------------------------------------


def conv_spatial(op: Op) -> list[tuple[dict, str | None]]:
    """Each spatial dim of a conv with how it splits (Hou et al. 2019, spatial partitioning):

    * ``"forward"``: the input and the output split alike and each device first fetches the
      input planes its output windows reach beyond its block from its neighbours (a halo);
      a forward conv, strided or transposed (input-dilated), and the input gradient;
    * ``"kernel"``: the weight gradient (the output is the kernel window): the input and the
      output gradient split alike, each device sums its part (a partial sum) after fetching
      the input's halo;
    * ``None``: whole (a dilated input in the weight gradient's form — the transposed conv's
      weight gradient, which XLA's partitioner gathers — or a window larger than both sides).
    """
    out = []
    for sp in op.param("spatial", ()):
        s = dict(sp)
        n, o = s["lhs_size"], s["out_size"]
        pairing = s["pairing"]
        if pairing == "out":
            form = "forward"
        elif pairing == "kernel":
            form = "kernel" if s["lhs_dilation"] == 1 else None
        elif s["window"] < min(n, o):
            form = "forward"
        elif o < min(n, s["window"]) and s["lhs_dilation"] == 1:
            form = "kernel"
        else:
            form = None
        out.append((s, form))
    return out


def _conv_joins(g: Graph, op: Op) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """The spatial axes a conv splits together that its links do not equate (sizes differ:
    a strided or transposed conv's input and output, a strided conv's weight gradient)."""
    lhs, rhs = op.inputs[:2]
    joins = []
    for s, form in conv_spatial(op):
        if form == "forward":
            joins.append(((lhs, s["lhs"]), (op.outputs[0], s["out"])))
        elif form == "kernel":
            joins.append(((lhs, s["lhs"]), (rhs, s["rhs"])))
    return joins


def _attention_roles(op: Op) -> tuple[list[str], list[str], str | None]:
    """A cuDNN attention op's tensors laid out like q (q, o, do, dq), like k (k, v, dk, dv),
    and its softmax statistics (see ``_dim_rules._attention``)."""
    ins, outs = op.inputs, op.outputs
    if op.param("phase") == "bwd":
        return [ins[0], ins[-2], ins[-1], outs[0]], [ins[1], ins[2], *outs[1:3]], ins[-3]
    return [ins[0], outs[0]], [ins[1], ins[2]], (outs[1] if len(outs) > 1 else None)


def _attention_joins(op: Op) -> list[tuple[tuple[str, int], tuple[str, int]]]:
    """Grouped-query attention's kv heads split with the query heads (cuDNN's rule: q, k and v
    alike), though their sizes differ."""
    n = attention_axes(op.param("layout", 0))["n"]
    like_q, like_k, _ = _attention_roles(op)
    return [((like_q[0], n), (t, n)) for t in like_k]


@dataclass(frozen=True, slots=True)
class Halo:
    """One spatial dim of a conv split in ``parts``: the input elements a device fetches
    beyond its block on each side, and the (position, tap) pairs of the dim the local conv
    computes (each device runs the same program on its block widened by the halo, padded
    with zeros at the edges) against the pairs of the whole conv."""

    left: int
    right: int
    local_pairs: int
    pairs: int


@functools.lru_cache(maxsize=4096)
def halo(
    n: int, span: int, taps: int, stride: int, dil: int, lo: int, lhs_dil: int, parts: int
) -> Halo | None:
    """The halo of a block of ``n // parts`` input elements.

    Position ``i`` of the split side (``span`` positions: the output of a forward conv, the
    output gradient of a weight gradient) with tap ``j`` (of ``taps``) reads the input-dilated
    position ``i*stride + j*dil - lo``; padding and dilation holes are not fetched. ``None``
    when a block reaches past its neighbours (XLA then gathers instead)."""
    if n % parts or span % parts:
        return None
    bn, bs = n // parts, span // parts
    left = right = pairs = 0
    reads = []  # per block: the input elements its (position, tap) pairs read
    for b in range(parts):
        need = [
            q // lhs_dil
            for i in range(b * bs, (b + 1) * bs)
            for j in range(taps)
            if (q := i * stride + j * dil - lo) % lhs_dil == 0
        ]
        reads.append(need)
        real = [e for e in need if 0 <= e < n]
        pairs += len(real)
        if real:
            left = max(left, b * bn - min(real))
            right = max(right, max(real) - ((b + 1) * bn - 1))
    if left > bn or right > bn:
        return None
    local = max(
        sum(b * bn - left <= e < (b + 1) * bn + right for e in need) for b, need in enumerate(reads)
    )
    return Halo(left, right, local, pairs)


def _window_axes(op: Op, groups: list[Group], assign: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The mesh axes a weight gradient's spatial split (``"kernel"``) sums over. XLA's conv
    handler all-reduces them by themselves, whole, before the batch's (measured on XLA:CPU:
    the U-Net's weight gradients under batch -> data, depth -> space are an all-reduce over
    space then one over data, each of the whole kernel: 2x the bytes of one over both)."""
    if op.primitive != "conv_general_dilated":
        return ()
    lhs = op.inputs[0]
    kernel = {(lhs, s["lhs"]) for s, form in conv_spatial(op) if form == "kernel"}
    if not kernel:
        return ()
    return tuple(
        a
        for grp, axes in zip(groups, assign, strict=True)
        if axes and not kernel.isdisjoint(grp.members)
        for a in axes
    )


def conv_split(
    m: Machine, g: Graph, op: Op, groups: list[Group], assign: list[tuple[str, ...]],
    wanted: dict[str, Layout],
) -> tuple[list[Comm], float]:  # fmt: skip
    """A conv split along space: the collective-permutes of its halo exchange, and the factor
    on its local FLOPs (the zero padding at the edges is computed, as XLA's partitioner does).

    Per split spatial dim of the input, one permute per side that needs planes, ``halo x
    plane`` bytes, where a plane is the local input over the dim's other axes widened by the
    halos already exchanged (XLA exchanges the dims in order, so the second carries the
    first one's corners). A halo that reaches past the neighbours gathers the input instead."""
    if op.primitive != "conv_general_dilated":
        return [], 1.0
    lhs = op.inputs[0]
    t = g.tensors[lhs]
    axes_of = {mem: a for grp, a in zip(groups, assign, strict=True) for mem in grp.members}
    local = list(local_shape(t.shape, wanted[lhs], m.mesh))
    out: list[Comm] = []
    factor = 1.0
    for s, form in conv_spatial(op):
        axes = axes_of.get((lhs, s["lhs"]), ())
        parts = split_factor(axes, m.mesh)
        if form is None or parts == 1:
            continue
        if form == "forward":
            span, taps, stride, dil = s["out_size"], s["window"], s["stride"], s["rhs_dilation"]
        else:  # weight gradient: the output gradient is the kernel, the window the output
            span, taps, stride, dil = s["window"], s["out_size"], s["rhs_dilation"], s["stride"]
        h = halo(s["lhs_size"], span, taps, stride, dil, s["padding"][0], s["lhs_dilation"], parts)
        a = s["lhs"]
        plane = t.itemsize * math.prod(local) // local[a]
        if h is None:
            result = m.wire_bytes(t, plane * t.shape[a])
            out.append(m.comm("all-gather", axes, result, t.name, "halo"))
            local[a] = t.shape[a]
            continue
        for side in (h.left, h.right):
            if side:
                out.append(m.comm("collective-permute", axes, plane * side, t.name, "halo"))
        local[a] += h.left + h.right
        if h.pairs:
            factor *= parts * h.local_pairs / h.pairs
    return out, factor


def slice_halo(m: Machine, g: Graph, op: Op, layouts: dict[str, Layout]) -> list[Comm]:
    """The collective-permutes XLA exchanges for a slice (or a split's piece) whose output
    is split along the sliced axis: it reshards the operand like the output and exchanges each
    block's window as halos (:func:`.xla_reshard.slice_exchange`), even from a whole operand
    (measured: a fused QKV projection split into q, k, v laid out on their heads)."""
    if op.primitive == "split":
        d = op.param("axis", 0)
        starts = [sum(op.param("sizes", ())[:k]) for k in range(len(op.outputs))]
        cuts = [(o, d, a) for o, a in zip(op.outputs, starts, strict=True)]
    elif op.primitive == "slice":
        lo, src = op.param("start", ()), g.tensors[op.inputs[0]].shape
        cuts = [(op.outputs[0], d, a) for d, a in enumerate(lo)
                if (a, g.tensors[op.outputs[0]].shape[d]) != (0, src[d])]  # fmt: skip
    else:
        return []
    out: list[Comm] = []
    size = g.tensors[op.inputs[0]].shape
    for o, d, start in cuts:
        t, lay = g.tensors[o], layouts[o]
        k = split_factor(lay[d], m.mesh)
        if k == 1:
            continue
        n = t.shape[d]
        per = local_bytes(t, lay, m.mesh) // (n // k)  # bytes of one element along d
        for h in slice_exchange(size[d], k, start, n):
            out.append(m.comm("collective-permute", lay[d], per * h, op.inputs[0], "halo"))
    return out


def op_tensors(op: Op) -> list[str]:
    """The op's outputs, then its inputs, a repeated tensor once: the positions that
    templates (:func:`op_template`) and signatures (:func:`op_signature`) index."""
    return list(dict.fromkeys(op.outputs + op.inputs))


def _groups_cache(
    g: Graph,
) -> tuple[dict[str, list[Group]], dict[tuple, int], dict[str, int | None], list]:
    """The graph's groups so far: the materialised lists by op, template ids by an op's
    structure, each op's template id (``None``: a conv, or parameters that do not hash), and
    the templates (see :func:`op_template`)."""
    return g.derived("op_groups", lambda: ({}, {}, {}, []))


def op_groups(g: Graph, op: Op) -> list[Group]:
    """The op's groups, in a fixed order (outputs' axes first). Cached on the graph (the
    search and the final pricing walk one graph many times); the list is shared, so callers
    must not change it. Ops alike (:func:`op_kind`) share a template; an op's own list is
    made from it when first asked for."""
    cache, _, kinds, templates = _groups_cache(g)
    v = cache.get(op.name)
    if v is not None:
        return v
    k = op_kind(g, op)
    v = cache.get(op.name)  # the first op of its kind, or one with no kind
    if v is None:
        ts = op_tensors(op)
        v = cache[op.name] = [
            Group(tuple([(ts[j], a) for j, a in m]), kind, dim) for m, kind, dim in templates[k][0]
        ]
    return v


def op_template(g: Graph, op: Op) -> tuple[list, bool, int] | None:
    """The op's groups over its tensors' positions (outputs, then inputs, a repeated one
    once) as ``(members, kind, dim)``, whether every group has a dim, and the op's kind;
    ``None`` for an op with no kind. Reading it makes no groups."""
    _, _, kinds, templates = _groups_cache(g)
    try:
        k = kinds[op.name]
    except KeyError:
        k = op_kind(g, op)
    return None if k is None else templates[k]


def _signatures(g: Graph) -> tuple[dict[str, int], dict[tuple, int], dict[int, tuple]]:
    """Per tensor an id of its (shape, dtype, dims); the ops' parameters' ids by value, and
    by the id of the parameters object (with the object): flat keys for :func:`op_kind`."""

    def make() -> tuple[dict[str, int], dict[tuple, int], dict[int, tuple]]:
        ids: dict[tuple, int] = {}
        sig = {
            t: ids.setdefault((x.shape, x.dtype, x.dims), len(ids)) for t, x in g.tensors.items()
        }
        return sig, {}, {}

    return g.derived("op signatures", make)


def op_kind(g: Graph, op: Op) -> int | None:
    """An id shared by the ops of ``g`` alike in everything :func:`op_groups` reads (the same
    op in another layer); ``None`` for a conv or an op whose parameters do not hash."""
    cache, alike, kinds, templates = _groups_cache(g)
    try:
        return kinds[op.name]
    except KeyError:
        pass
    if op.primitive == "conv_general_dilated":  # its joins read the parameters' windows
        cache[op.name] = _op_groups(g, op)
        kinds[op.name] = None
        return None
    # an op alike in primitive, parameters, tensors' shapes, dtypes and dims and links by
    # position (the same op in another layer) has the same groups over its own tensors
    ts = op_tensors(op)
    pos = {t: k for k, t in enumerate(ts)}
    sig, by_value, by_id = _signatures(g)
    held = by_id.get(id(op.params))  # the op's parameters as an id (one per value)
    if held is None:
        try:
            p = by_value.setdefault(op.params, len(by_value))
        except TypeError:  # a parameter that does not hash
            cache[op.name] = _op_groups(g, op)
            kinds[op.name] = None
            return None
        by_id[id(op.params)] = (op.params, p)  # held, so the id is never another object's
    else:
        p = held[1]
    links = []
    for link in op.links:  # by position: a link's length, then position x 256 + axis
        links.append(len(link))
        links += [pos.get(t, -1) * 256 + a for t, a in link]
    key = (op.primitive, p, op.opaque, len(op.outputs), tuple([pos[t] for t in op.inputs]),
           tuple([sig[t] for t in ts]), tuple(links))  # fmt: skip
    k = alike.get(key)
    if k is None:
        v = cache[op.name] = _op_groups(g, op)
        k = alike[key] = len(templates)
        templates.append(
            (
                [(tuple([(pos[t], a) for t, a in x.members]), x.kind, x.dim) for x in v],
                all(x.dim is not None for x in v),
                k,
            )
        )
    kinds[op.name] = k
    return k


def _op_groups(g: Graph, op: Op) -> list[Group]:
    tensors = op_tensors(op)
    members = [(t, a) for t in tensors for a, s in enumerate(g.tensors[t].shape) if s > 1]
    parent = {k: k for k in members}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    links = list(op.links)
    if op.primitive == "conv_general_dilated":
        links += _conv_joins(g, op)
    elif op.primitive in ATTENTION_OPS:
        links += _attention_joins(op)
    for link in links:
        live = [k for k in link if k in parent]
        for k in live[1:]:
            parent[find(k)] = find(live[0])
    comps: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for k in members:
        comps.setdefault(find(k), []).append(k)
    outs = set(op.outputs)
    if op.opaque or op.primitive in LOOP_OPS:
        return [Group(tuple(c), "fixed", _dim(g, c)) for c in comps.values()]
    fixed = _fixed_members(g, op)
    reshaped: dict[tuple[str, int], Group] = {}
    if op.primitive == "reshape":
        src, dst = op.inputs[0], op.outputs[0]
        groups = op.param("groups", ())
        if not groups:  # a reshape with a transposition: nothing splits through it
            fixed.update(members)
        for ga, gc in groups:
            if len(ga) == 1 and len(gc) == 1:
                continue
            ins_, outs_ = [(src, a) for a in ga], [(dst, a) for a in gc]
            kind = "fixed" if len(ga) > 1 and len(gc) > 1 else "pass"
            # the major axes split together; the minor ones map to this group too, so they
            # never split on their own (a split of the merged axis is a split of its major)
            grp = Group((ins_[0], outs_[0]), kind, _dim(g, [outs_[0]]))
            for k in ins_ + outs_:
                reshaped[k] = grp
    out: list[Group] = []
    seen: set[int] = set()
    for c in comps.values():
        if c[0] in reshaped:
            grp = reshaped[c[0]]
            if id(grp) not in seen:
                seen.add(id(grp))
                out.append(grp)
            continue
        if any(k in fixed for k in c):
            kind = "fixed"
        elif any(t in outs for t, _ in c):
            kind = "pass"
        elif op.primitive in _SUM_OPS:
            kind = "sum"
        else:
            kind = _REDUCE_KIND.get(op.primitive, "fixed")
        out.append(Group(tuple(c), kind, _dim(g, c)))
    return out


def op_signature(g: Graph, op: Op, groups: list[Group]) -> tuple:
    """What an op's strategies depend on: its tensors' shapes and dtypes (outputs, then each
    input by position, a repeated operand once) and its groups over those positions."""
    ts = op_tensors(op)
    pos = {t: k for k, t in enumerate(ts)}
    tensors = g.tensors
    return (
        len(op.outputs),
        tuple(pos[t] for t in op.inputs),
        tuple((tensors[t].shape, tensors[t].dtype) for t in ts),
        tuple((grp.kind, tuple((pos[t], a) for t, a in grp.members)) for grp in groups),
    )


def _dim(g: Graph, members) -> str | None:
    for t, a in members:
        d = g.tensors[t].dims[a]
        if d is not None:
            return d
    return None


# --- one op under one strategy ----------------------------------------------------------------


@dataclass
class OpCost:
    """One op under one strategy, per device and per execution (``trip_count`` runs a step)."""

    op: Op
    strategy: dict[str, tuple[str, ...]]  # group dim -> mesh axes (split groups only)
    wanted: dict[str, Layout]  # input tensor -> the layout the op reads it in
    produced: dict[str, Layout]  # output tensor -> the layout the op writes it in
    partial: tuple[str, ...]  # mesh axes the outputs are partial sums over
    flops: float
    bytes: float
    compute_s: float
    comms: list[Comm]

    @property
    def comm_s(self) -> float:
        return sum(c.time_s for c in self.comms)


@per_graph
def fused_ops(g: Graph) -> set[str]:
    """Elementwise ops XLA fuses into their consumers: their results never reach HBM.

    An elementwise result is written to HBM only where a consumer cannot fuse it (a matmul,
    a reduction, a gather...), where the backward pass reads it later (two or more readers),
    or where it leaves the step. The rest stay in registers inside a loop fusion.
    """
    elementwise = set(ELEMENTWISE) | {"name"}
    readers: dict[str, list[Op]] = {}
    for op in g.ops:
        for t in dict.fromkeys(op.inputs):
            readers.setdefault(t, []).append(op)
    outputs = set(g.outputs)
    fused = set()
    for op in g.ops:
        if op.primitive not in elementwise:
            continue
        if all(
            o not in outputs
            and len(readers.get(o, ())) == 1
            and readers[o][0].primitive in elementwise
            and readers[o][0].scope == op.scope
            for o in op.outputs
        ):
            fused.add(op.name)
    return fused


@per_graph
def stacked_residuals(g: Graph) -> frozenset[str]:
    """The values a scan body writes into a stacked output that a later loop reads (the
    forward pass's residuals, read back by the backward scan). XLA on GPU writes each into the
    stack with a dynamic-update-slice and copies it out with a dynamic-slice: the profile's
    ``scan_stack_passes`` prices those passes (measured on one H200: docs/decisions.md)."""
    read_by_loop = {t for op in g.ops if op.primitive in LOOP_OPS for t in op.inputs}
    out: set[str] = set()
    for op in g.ops:
        if op.primitive != "scan":
            continue
        body = op.param("body_outputs", ())
        ncar = op.param("num_carry", 0)
        for outer, inner in zip(op.outputs[ncar:], body[ncar:], strict=False):
            if outer in read_by_loop:
                out.add(inner)
    return frozenset(out)


@per_graph
def free_tensors(g: Graph) -> set[str]:
    """Tensors any device can make in any layout: iotas, splats of a scalar, their converts."""
    free: set[str] = set()
    for op in g.ops:
        p = op.primitive
        if p == "iota" or (
            p in ("broadcast_in_dim", "convert_element_type", "reshape")
            and all(i in free or g.tensors[i].size == 1 for i in op.inputs)
        ):
            free.update(op.outputs)
    return free


def layouts_of(
    g: Graph, op: Op, groups: list[Group], assign: list[tuple[str, ...]]
) -> tuple[dict[str, Layout], dict[str, Layout], tuple[str, ...]]:
    """(wanted input layouts, produced output layouts, partial axes) of a strategy."""
    per: dict[str, list[tuple[str, ...]]] = {
        t: [()] * len(g.tensors[t].shape) for t in dict.fromkeys(op.inputs + op.outputs)
    }
    partial: list[str] = []
    for grp, axes in zip(groups, assign, strict=True):
        for t, a in grp.members:
            per[t][a] = axes
        if grp.kind in _PARTIAL:
            partial.extend(axes)
    wanted = {t: tuple(per[t]) for t in op.inputs}
    produced = {t: tuple(per[t]) for t in op.outputs}
    return wanted, produced, tuple(partial)


def copied_inputs(op: Op, wanted: dict[str, Layout], layouts, free: set[str] | None) -> list[str]:
    """The op's inputs (each once, in order) it reads in another layout than they have: the
    ones that need a copy (tensors in ``free`` are re-made instead)."""
    return [
        t
        for t in dict.fromkeys(op.inputs)
        if wanted[t] != layouts[t] and (free is None or t not in free)
    ]


def copy_key(g: Graph, op: Op, t: str, w: Layout) -> tuple:
    """What one copy of ``t`` into layout ``w`` for ``op`` is: XLA makes one per tensor,
    layout, trips and loop it is hoisted out of (``hoisted``)."""
    return (t, w, made_at(g)[t], hoisted(g, op_index(g)[op.name], t)[2])


def op_cost(
    m: Machine,
    g: Graph,
    op: Op,
    groups: list[Group],
    assign: list[tuple[str, ...]],
    layouts: dict[str, Layout],
    resharded: set | None = None,
    free: set[str] | None = None,
    fused: set[str] | None = None,
) -> OpCost:
    """Prices ``op`` when its groups are split over ``assign`` and its tensors live in
    ``layouts``: resharding of inputs, the local roofline, completing partial outputs.

    ``resharded`` collects ``(tensor, layout, trips)`` of the copies made so far: XLA keeps one
    copy of a tensor per layout (common subexpressions merge, so FSDP's weights are gathered
    once for the forward, the backward and any recomputation), made as often as the tensor
    is (``made_at``: a loop's invariant is copied outside it). Tensors in ``free`` (splats, iotas) are
    re-made in any layout at no cost.
    """
    wanted, produced, partial = layouts_of(g, op, groups, assign)
    comms: list[Comm] = []
    for t in copied_inputs(op, wanted, layouts, free):
        tt = g.tensors[t]
        w = copy_layout(m, tt, layouts[t], wanted[t])
        if resharded is not None:
            key = copy_key(g, op, t, w)
            if key in resharded:
                continue
            resharded.add(key)
        comms += reshard(m, tt, layouts[t], w)
    halo_comms, halo_flops = conv_split(m, g, op, groups, assign, wanted)
    comms += index_alignment(m, g, op, wanted, produced)
    comms += slice_halo(m, g, op, layouts)
    # how XLA's partitioner completes the op's partial result (from_partial)
    form = "dot" if op.primitive in MATRIX_OPS else "gather" if op.primitive == "gather" else ""
    comms += halo_comms
    parts = None
    if partial and not form:  # the partial axes of each reduced tensor axis
        parts = [a for grp, a in zip(groups, assign, strict=True) if a and grp.kind in _PARTIAL]
    first = _window_axes(op, groups, assign) if partial else ()
    for t in op.outputs:
        comms += from_partial(m, g.tensors[t], produced[t], partial, layouts[t], form, parts,
                              first)  # fmt: skip
    split = math.prod(split_factor(a, m.mesh) for a in assign)
    flops = op.flops / split * halo_flops
    moved = op.param("to") if op.primitive == "device_put" else None
    if moved:  # to or from host memory: a DMA on the host link, beside compute
        comms += [host_transfer(m, g.tensors[t], produced[t], moved) for t in op.outputs]
    if (
        op.primitive in _FREE_OPS
        or op.primitive in LOOP_OPS
        or op.primitive == "device_put"
        or (fused and op.name in fused)
    ):
        nbytes = 0.0
    else:
        nbytes = float(sum(local_bytes(g.tensors[t], produced[t], m.mesh) for t in op.outputs))
        if op.primitive in KERNEL_OPS:  # its author's estimate of its HBM traffic
            nbytes = op.param("bytes_accessed", nbytes)
        elif op.primitive in MATRIX_OPS or op.primitive in _READ_OPS:
            nbytes += sum(local_bytes(g.tensors[t], wanted[t], m.mesh) for t in set(op.inputs))
    if op.primitive == GROUPED_MATMUL and m.hw.efficiency.ragged_dot_dense:
        flops, dense = _dense_ragged(m, g, op, wanted, flops)
        nbytes += dense
    axis = op.param("depthwise_gradient")
    if axis is not None and m.hw.efficiency.depthwise_gradient_dense:
        flops, dense = _dense_depthwise(m, g.tensors[op.outputs[0]], produced[op.outputs[0]],
                                        axis, flops)  # fmt: skip
        nbytes += dense
    dtype = compute_dtype([g.tensors[t].dtype for t in op.inputs])
    compute = (
        op_time(
            m.hw,
            op.primitive,
            flops,
            nbytes,
            dtype,
            op.param("precision", "default"),
            len(g.tensors[op.inputs[0]].shape) - 2 if op.primitive == "conv_general_dilated" else 0,
        )  # fmt: skip
        if op.primitive not in LOOP_OPS
        else 0.0
    )
    passes = m.hw.efficiency.scan_stack_passes
    if passes and op.scope:  # a residual stacked for the backward scan: copied in and out
        stacked = stacked_residuals(g)
        extra = sum(local_bytes(g.tensors[t], produced[t], m.mesh)
                    for t in op.outputs if t in stacked and not g.tensors[t].host)  # fmt: skip
        compute += passes * extra / (m.hw.chip.hbm_bandwidth * m.hw.efficiency.memory)
    strategy = {
        (grp.dim or f"{grp.members[0][0]}.{grp.members[0][1]}"): a
        for grp, a in zip(groups, assign, strict=True)
        if a
    }
    return OpCost(op, strategy, wanted, produced, partial, flops, nbytes, compute, comms)


def _dense_depthwise(
    m: Machine, out: Tensor, layout: Layout, axis: int, flops: float
) -> tuple[float, float]:
    """(FLOPs, extra bytes) of a depthwise weight gradient where the compiler runs it dense
    (the profile's ``depthwise_gradient_dense``; XLA:CPU's ConvolutionGroupConverter, a
    batch group per channel): one convolution over every pair of the ``c`` local channels
    (``c`` x the grouped FLOPs), then the diagonal kept, an iota compare and a select over
    the ``c`` x larger filter, and a sum over the pairs; the dense and the masked filter each
    written and read once (measured: 16 channels, 1.98e6 + 6.8e3 FLOPs for 1.24e5)."""
    itemsize = out.itemsize
    o = local_bytes(out, layout, m.mesh) // itemsize
    c = out.shape[axis] // split_factor(layout[axis], m.mesh)
    return flops * c + o * (3 * c - 1), 4.0 * o * c * itemsize


_READ_OPS = ATTENTION_OPS | {GROUPED_MATMUL}  # beside matmuls, ops that read their inputs' bytes


def ragged_operands(g: Graph, op: Op) -> tuple[tuple[str, ...], str | None]:
    """(the operands a dense ``ragged_dot`` masks per group, the weight it copies in a
    group-major layout) of ``op`` and its group sizes' tensor; none where its mode needs no
    mask (ragged batch: a plain dot) or its group sizes are no tensor."""
    ragged = op.param("ragged")
    if len(op.inputs) < 3 or any(ragged == lb for lb, _ in op.param("batch", ())):
        return (), None
    if any(ragged == lc for lc, _ in op.param("contracting", ())):  # the weight gradient
        return tuple(op.inputs[:2]), None
    return (op.inputs[0],), op.inputs[1]  # the rows, and the weight read group-major


def _dense_ragged(
    m: Machine, g: Graph, op: Op, wanted: dict[str, Layout], flops: float
) -> tuple[float, float]:
    """(FLOPs, extra bytes) of a ``ragged_dot`` where it runs dense (the profile's
    ``ragged_dot_dense``; jax's lowering for XLA:CPU, ``_ragged_dot_general_impl``): each
    ragged operand broadcast over the ``G`` groups and masked to its group's rows (two
    compares, an and and a select an element), then one matmul over every group and row
    (``G`` x the grouped FLOPs, the groups' split included: a split group axis leaves a
    partial sum); the masked operands written and read once, the forward's and the input
    gradient's weight copied group-major (written and read once). Measured on one device,
    64 rows, 4 groups: 278,540 FLOPs for a grouped 65,536 (4 x it + 4 x 4,096 + 12)."""
    masked, weight = ragged_operands(g, op)
    if not masked:
        return flops, 0.0
    gs = op.inputs[2]
    groups = g.tensors[gs].shape[-1]
    local = groups // split_factor(wanted[gs][-1], m.mesh)
    sizes = [(local_bytes(g.tensors[t], wanted[t], m.mesh), g.tensors[t]) for t in masked]
    nbytes = 2.0 * local * sum(b for b, _ in sizes)
    elements = sum(b // t.itemsize for b, t in sizes)
    if weight is not None:
        nbytes += 2.0 * local_bytes(g.tensors[weight], wanted[weight], m.mesh)
    return flops * groups + 4.0 * local * elements, nbytes


def host_transfer(m: Machine, t: Tensor, layout: Layout, to: str) -> Comm:
    """A tensor's local part moved between HBM and host memory (``to``: "host" or
    "device"), at the profile's ``chip.host_bandwidth``."""
    bw = m.hw.chip.host_bandwidth
    if not bw and m.hw.kind == "cpu":
        raise HardwareError(
            f"hardware {m.hw.name!r}: the step moves values to host memory (jax.device_put to "
            "pinned_host, e.g. an offloading remat policy), and CPU devices have one memory: "
            "plan it for the accelerator it is meant for (--hw h100-8, ...)"
        )
    if not bw:
        raise HardwareError(
            f"hardware {m.hw.name!r}: the step moves values to host memory (jax.device_put to "
            "pinned_host, e.g. an offloading remat policy) and the profile gives no "
            "chip.host_bandwidth; add it to the profile's [chip] section"
        )
    nbytes = local_bytes(t, layout, m.mesh)
    return Comm(f"offload-to-{to}", (), nbytes, nbytes / bw, t.name, "offload")


# --- where two tensors must agree: loop boundaries, donated state -------------------------------


@dataclass(frozen=True, slots=True)
class Boundary:
    """Tensor ``dst`` holds what ``src`` holds (a loop's carry, input or output; a branch's
    result; new state in a donated buffer), so it is laid out alike or resharded into it.
    ``shift`` is +1 when ``dst`` has an extra leading (stacked) axis, -1 when ``src`` has."""

    src: str
    dst: str
    shift: int
    trips: int  # how many times a step the hand-over happens
    owner: str  # the op it is charged to
    # "enter" (loop input) | "exit" (loop result) | "carry" | "branch" | "alias"
    kind: str = "enter"


def boundaries(g: Graph, aliased: dict[str, str] | None = None) -> list[Boundary]:
    """Every hand-over of the step: loop inputs and outputs, carries (each iteration), cond
    branches, and ``aliased`` outputs (output -> donated input)."""
    out: list[Boundary] = []
    for op in g.ops:
        p = op.primitive
        if p not in LOOP_OPS:
            continue
        body_trips = op.trip_count * (op.param("length", 1) if p == "scan" else 1)
        for o, b in op.param("body_inputs", ()):
            if b not in g.tensors:  # a scanned input its body never reads (dead code gone)
                continue
            shift = len(g.tensors[b].shape) - len(g.tensors[o].shape)
            out.append(Boundary(o, b, shift, op.trip_count, op.name, "enter"))
        for bo, bi in op.param("carries", ()):
            out.append(Boundary(bo, bi, 0, body_trips, op.name, "carry"))
        results = op.param("body_outputs", ())
        n = len(op.outputs)
        branches = op.param("branches", 1) if p == "cond" else 1
        for i in range(branches):
            for o, r in zip(op.outputs, results[i * n : (i + 1) * n], strict=True):
                shift = len(g.tensors[o].shape) - len(g.tensors[r].shape)
                kind = "exit" if i == 0 else "branch"
                out.append(Boundary(r, o, shift, op.trip_count, op.name, kind))
    producer = {t: op.name for op in g.ops for t in op.outputs}
    for o, i in (aliased or {}).items():
        out.append(Boundary(o, i, 0, 1, producer.get(o, o), "alias"))
    return out


def map_layout(layout: Layout, shift: int) -> Layout | None:
    """``layout`` seen from the other side of a boundary; ``None`` where the stacked axis is
    split (a loop slices it whole)."""
    if shift > 0:
        return ((),) * shift + tuple(layout)
    if shift < 0:
        if any(layout[:-shift]):
            return None
        return tuple(layout[-shift:])
    return tuple(layout)


def boundary_comms(m: Machine, g: Graph, b: Boundary, src: Layout, dst: Layout) -> list[Comm]:
    """The resharding a hand-over needs when ``src`` and ``dst`` are laid out differently."""
    mapped = map_layout(src, b.shift)
    if mapped == tuple(dst):
        return []
    if b.shift >= 0:  # compare on dst (a stacked output, a carry, donated state)
        return reshard(m, g.tensors[b.dst], mapped or replicated(len(dst)), tuple(dst))
    return reshard(m, g.tensors[b.src], tuple(src), map_layout(dst, -b.shift))
