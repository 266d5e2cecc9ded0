"""Memory per device: the peak of a liveness walk over the traced step.

Inputs (parameters, optimizer state, the batch) are resident for the whole step at their
split sizes. Every other tensor lives from the op that writes it to the last op that reads
it, in program order; the tensors a ``scan`` body writes live for one iteration, its stacked
outputs (the forward pass's saved activations) until the backward scan reads them. Remat
shows up by itself: the traced step saves only what the checkpoint policy keeps and
recomputes the rest inside the backward pass. A step output that takes the place of a
donated input (the new parameters) reuses its buffer and adds nothing. What XLA never
writes to HBM is no buffer: an elementwise result fused into its one elementwise reader
(``fused_ops``), and views and broadcasts (``reshape``, ``squeeze``, ``expand_dims``,
``broadcast_in_dim``), which XLA folds into their readers; the buffers they read live until
the fused or viewed value's last reader instead (measured: the materialised attention of
``shared/calibration/h200-attention.csv`` was predicted at 2.9x XLA's temporaries before).
Outside loops the same holds for an elementwise result every reader of which XLA can fuse
(elementwise ops, reductions, views): XLA fuses a copy of it into each reader, so a value the
backward pass reads (``tanh`` of a GELU, the float32 copy of the scores) is recomputed there
from the buffers it was made from, not kept (the H200's unrolled steps were predicted at
1.2-1.5x XLA's memory before; a scan's body writes its stacked residuals as they are).
Around 3-D convolutions XLA keeps more: each conv's operands copied into the layout it runs
in, and a 16-bit elementwise chain into a conv as written (the H200's U-Net was predicted
at 0.38x before). XLA:CPU lowers three more of a CNN's ops with buffers of their own
(:func:`lowering_buffers`, the profile's ``select_and_scatter_expanded``,
``weight_gradient_copies`` and ``depthwise_gradient_dense``): a max-pool's gradient as an
argmax in the forward pass (an int32 iota per dim of its operand, int32 indices per dim of its
result) and a scatter into zeros allocated at the step's start, each 1-D or 2-D convolution's
weight gradient on transposed copies of its operands, made where each is written (a
stranger's linen CNN on cpu-8 was predicted at 0.48x XLA's memory before, 0.93x with them),
and a depthwise convolution's weight gradient as a dense one, masked to its diagonal
(``ragged_dot_dense``: an MoE's grouped matmul, masked per group, likewise).

A remat region's optimization barrier keeps its recomputation in the backward pass, where
the compiler keeps the barrier. XLA:CPU expands the barriers before it schedules, and then
schedules breadth first, so there a recomputation outside loops runs as soon as the saved
values it reads exist, in the forward pass, and lives until its backward reader, as the value
it recomputes would have (:func:`schedule`; the profile says so: ``remat_barriers = false``,
XLA:CPU's). An unrolled step's remat saves nothing there: a stranger's 8-layer LM on 8
devices compiled at 1.000x the written step's temporaries under every policy where the walk
in program order predicted 0.34-0.70x (tests/test_memory_strangers.py).

This is a lower bound on what XLA allocates (it also keeps fusion temporaries and may
schedule differently); ``al.validate`` prints XLA's ``memory_analysis()`` beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autolayout.core import ELEMENTWISE, LOOP_OPS, Efficiency, Graph, hoisted, per_graph

from .sharding import fused_ops, ragged_operands

VIEW_OPS = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim"})
_DUPLICABLE = frozenset(ELEMENTWISE) - {"optimization_barrier"}
_FUSIBLE_READERS = _DUPLICABLE | VIEW_OPS | {"reduce_sum", "reduce_max", "reduce_min", "name"}


@dataclass(frozen=True, slots=True)
class MemoryUse:
    peak_bytes: int
    # resident inputs by argument name, "activations" at the peak, and "copies" (tensors
    # resharded for their readers, alive at the peak)
    by_category: dict[str, int]
    peak_op: str | None  # the op at which the peak is reached


def _category(path: str | None) -> str:
    return path.split("/", 1)[0] if path else "inputs"


@per_graph
def aliased_outputs(g: Graph, donated: Sequence[str]) -> dict[str, str]:
    """Step outputs that take a donated input's buffer: output -> input. The k-th output of a
    shape and dtype reuses the k-th donated input of that shape and dtype (a train step
    returns its new state in the order it took the old one); a donated input returned as it
    is (a Keras seed generator the step does not draw from) keeps its own slot."""
    slots: dict[tuple, list[str]] = {}
    for t in donated:
        tt = g.tensors[t]
        slots.setdefault((tt.shape, tt.dtype), []).append(t)
    out: dict[str, str] = {}
    for o in g.outputs:
        tt = g.tensors[o]
        queue = slots.get((tt.shape, tt.dtype))
        if not queue or o in out:
            continue
        if tt.role == "input":
            if o in queue:  # returned unchanged: no buffer, its slot taken
                queue.remove(o)
            continue
        out[o] = queue.pop(0)
    return out


class Lifetimes(list):
    """:func:`lifetimes`' answer, a list of ``(tensor, first, last)`` in positions of the
    step's schedule, with that schedule: ``order`` the program indices of the ops in the
    order they run, ``position`` each program index's place in it, ``made`` where a copy an
    op reads first can be made (all ``None`` where the schedule is program order)."""

    order: tuple[int, ...] | None = None
    position: tuple[int, ...] | None = None
    made: tuple[int, ...] | None = None

    def place(self, i: int) -> int:
        """The schedule position of the op at program index ``i``."""
        return i if self.position is None else self.position[i]

    def span(self, first: int, last: int) -> tuple[int, int]:
        """A copy read from program index ``first`` to ``last`` (its first and last reader)
        in schedule positions: from where it is made to its last reader placed (the readers
        between are not known here; the search's walk places copies the same way, so the two
        stay equal)."""
        if self.position is None:
            return first, last
        a, b = self.position[first], self.position[last]
        return min(self.made[first], b), max(a, b)


@per_graph
def schedule(g: Graph, barriers: bool = True) -> tuple[int, ...] | None:
    """The program indices of the step's ops in the order the compiler runs them; ``None``
    for program order. ``barriers=False``: the compiler drops a remat region's optimization
    barrier before it schedules (XLA:CPU expands them, then schedules breadth first: an
    instruction runs once its operands exist), so a recomputation outside loops runs right
    after the last value it reads is written, in the forward pass, not where the backward
    pass reaches it; a regather's barrier likewise right after its weight. The other ops keep
    program order (a breadth-first walk of the whole step moved the written steps' peaks away
    from XLA:CPU's: my_transformer 0.54x -> 0.35x of its temporaries; the recomputation is
    what the barriers decide)."""
    if barriers:
        return None
    anchor: list[int] = []  # the op a hoisted op runs right after (-1: the step's start)
    hoisted: list[bool] = []
    at: dict[str, int] = {}  # a value -> the anchor of the op that writes it
    for i, op in enumerate(g.ops):
        free = op.primitive not in LOOP_OPS and not any(
            s.split(".", 1)[0] in LOOP_OPS for s in op.scope
        )
        h = free and (op.remat or op.primitive == "optimization_barrier")
        a = max((at.get(t, -1) for t in op.inputs), default=-1) if h else i
        anchor.append(a)
        hoisted.append(h)
        for t in op.outputs:
            at[t] = a
    if not any(hoisted):
        return None
    return tuple(sorted(range(len(g.ops)), key=lambda i: (anchor[i], hoisted[i], i)))


@per_graph
def lifetimes(
    g: Graph,
    donated: Sequence[str] = (),
    compiler: Efficiency | None = None,
) -> Lifetimes:
    """``(tensor, first, last)`` of every buffer the step allocates, as positions in the
    step's :func:`schedule`: op results from the op that writes them to their last reader
    (the step's outputs to the end), inputs and outputs that reuse a donated input left out.
    ``compiler``: what the profile's compiler does, its efficiency table (None: a GPU's or a
    TPU's defaults). ``scan_stacks_at_start``: every scan's stacked outputs are allocated at
    the step's start (XLA:CPU's breadth-first scheduler puts their zero fill, which reads
    nothing, before the first loop), else from their loop's first body op.
    ``remat_barriers``: whether a remat region's optimization barrier reaches the scheduler
    (no fusion crosses it, the recomputation waits for the backward pass), false on XLA:CPU,
    which drops them (:func:`schedule`). The lowering flags (``select_and_scatter_expanded``,
    ``weight_gradient_copies``, ``depthwise_gradient_dense``, ``ragged_dot_dense``) add the
    buffers of :func:`lowering_buffers`; the ops they replace no longer keep the operands
    they read there alive."""
    stacks_at_start = compiler is not None and compiler.scan_stacks_at_start
    barriers = compiler is None or compiler.remat_barriers
    order = schedule(g, barriers)
    ops = g.ops if order is None else tuple(g.ops[i] for i in order)
    aliased = set(aliased_outputs(g, donated))
    fused = fused_ops(g)
    outputs = set(g.outputs)
    # who reads a value: its primitive and the remat regions it runs in (a region's inputs
    # pass an optimization barrier, which no fusion crosses, where the compiler keeps it)
    regions = [
        frozenset(s for s in op.scope if s.startswith("remat.")) if barriers else frozenset()
        for op in ops
    ]
    readers: dict[str, list[tuple[str, frozenset]]] = {}
    for op, rg in zip(ops, regions, strict=True):
        for t in op.inputs:
            readers.setdefault(t, []).append((op.primitive, rg))
    kept = _sixteen_bit_into_conv(g)
    source: dict[str, tuple[str, ...]] = {}  # a value with no buffer -> the buffers it reads
    for op, rg in zip(ops, regions, strict=True):
        duplicated = (
            op.primitive in _DUPLICABLE
            and not kept & set(op.outputs)
            # a loop body's values are its outputs' stacks as written
            and not any(s.split(".", 1)[0] in LOOP_OPS for s in op.scope)
            and all(
                o not in outputs and o in readers
                and all(p in _FUSIBLE_READERS and r <= rg for p, r in readers[o])
                for o in op.outputs
            )
        )  # fmt: skip
        if (
            duplicated
            or op.name in fused
            or (op.primitive in VIEW_OPS and not outputs & set(op.outputs))
        ):
            srcs = tuple(dict.fromkeys(s for t in op.inputs for s in source.get(t, (t,))))
            for o in op.outputs:
                source[o] = srcs
    # reads lowered elsewhere: a max-pool gradient's operand is read by its argmax, where it
    # is written; a weight gradient reads copies (lowering_buffers)
    bypass = {(op.name, t) for op in ops for t in _lowered_reads(op, compiler)}
    last: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.inputs:
            if bypass and (op.name, t) in bypass:
                continue
            for s in source.get(t, (t,)):
                last[s] = i
    end = len(ops)
    for o in g.outputs:
        last[o] = end
    inputs = set(g.inputs)
    # a loop's results (its carries, its stacked outputs) are buffers from its first body op
    # on: the body writes into them (the loop op follows its body, in either order)
    start: dict[str, int] = {}
    for i, op in enumerate(ops):
        for s in op.scope:
            if s.split(".", 1)[0] in LOOP_OPS:
                start.setdefault(s.split("/", 1)[0], i)  # cond.3/branch1 -> cond.3
    out = Lifetimes()
    if order is not None:
        out.order = order
        position = [0] * len(order)
        for k, i in enumerate(order):
            position[i] = k
        out.position = tuple(position)
        out.made = _copies_made(g, position)
    for i, op in enumerate(ops):
        born = start.get(op.name, i) if op.primitive in LOOP_OPS else i
        # a scan's outputs: its carries, then its stacks
        stacks = op.param("num_carry", 0) if stacks_at_start and op.primitive == "scan" else None
        for k, t in enumerate(op.outputs):
            tt = g.tensors[t]
            if t in inputs or t in aliased or t in source or tt.role == "input" or tt.host:
                continue  # (a value in host memory takes no HBM)
            first = 0 if stacks is not None and k >= stacks else born
            end = max(last.get(t, i), i)  # never read: freed right after
            lo, hi, loop = hoisted(g, i if order is None else order[i], t)
            if loop is not None:  # made outside the loops it leaves: alive through them
                lo, hi = out.span(lo, hi)
                first, end = min(first, lo), max(end, hi)
            out.append((t, first, end))
    out += [(t, *out.span(a, b)) for t, a, b in _conv_layout_copies(g)]
    if compiler is not None:
        out += lowering_buffers(g, ops, compiler, start)
    return out


def _weight_gradient(op) -> bool:
    """A 1-D or 2-D convolution that computes a kernel's gradient (JAX's transpose of a
    conv's kernel): each spatial dim pairs its operands' planes (``kernel``), or, the
    gradient of a strided conv, its dilated rhs spans more than its output (3-D convolutions
    copy every operand: :func:`_conv_layout_copies`)."""
    if op.primitive != "conv_general_dilated":
        return False
    spatial = [dict(sp) for sp in op.param("spatial", ())]
    return 0 < len(spatial) <= 2 and all(
        sp["pairing"] == "kernel"
        or (sp["pairing"] == "window" and sp["rhs_dilation"] > 1 and sp["window"] > sp["out_size"])
        for sp in spatial
    )


def _lowered_reads(op, lowering: Efficiency | None) -> tuple[str, ...]:
    """The inputs ``op`` does not read itself where it runs once lowered (see
    :func:`lowering_buffers`)."""
    if lowering is None:
        return ()
    if lowering.select_and_scatter_expanded and op.primitive == "select_and_scatter_add":
        return (op.inputs[1],)
    if lowering.weight_gradient_copies and _weight_gradient(op):
        return tuple(op.inputs)
    return ()


def _times(tt, nbytes: int) -> int:
    """How many buffers of ``tt``'s size hold ``nbytes`` per element of it."""
    itemsize = tt.nbytes // max(1, math.prod(tt.shape))
    return -(-nbytes // max(1, itemsize))


def lowering_buffers(
    g: Graph, ops: Sequence, lowering: Efficiency, loop_start: dict[str, int] | None = None
) -> list[tuple[str, int, int]]:
    """Buffers XLA:CPU's lowering of a CNN's ops adds, as ``(tensor, first, last)`` in
    positions of ``ops`` (the step's schedule), each the size of ``tensor`` in its layout
    (repeated where it holds more); ``lowering`` the profile's flags (its efficiency table),
    ``loop_start`` the first position of each loop's body.

    ``select_and_scatter_expanded`` (XLA:CPU's ``SelectAndScatterExpander``): a max-pool's
    gradient is an argmax, a variadic reduce-window over the pooled operand and one int32
    iota per dim of it, run where the operand is written (in the forward pass: the operand
    is not kept for the backward), then a scatter of the pooled gradient into a zero buffer
    of the operand's size. The iotas and the zeros read nothing, so the breadth-first
    scheduler allocates them at the step's start (a loop body's: at the body's); the argmax's
    int32 indices, one per dim of the pooled result, live until the scatter; the scatter
    copies its updates. Measured (a linen CNN, cpu-8, batch 8 a device): four s32 iotas of
    the 16x16x32 map and four index arrays at the forward's peak, 2.39 MB of temporaries.

    ``weight_gradient_copies``: XLA:CPU runs a 1-D or 2-D convolution's weight gradient on
    both operands transposed (``transpose_copy_fusion``), each copy made right where its
    value is written (the forward's activation in the forward pass, the batch at the step's
    start) and alive until the weight gradient; the value itself lives for its other readers
    only.

    ``depthwise_gradient_dense``: XLA:CPU runs a depthwise convolution's weight gradient
    (``depthwise_gradient`` in its parameters) as a dense convolution over every pair of
    channels, then masks it to the diagonal: two buffers, each channels x the filter's size,
    alive at the op (sized at the whole channel count: exact where the channels are not
    split, above XLA's by the channels' split where they are). Measured (the tiny Keras
    MobileNet, cpu-8, batch 1 a device): 8.45 MB of XLA's where 3.67 MB were predicted
    before; the 256-channel layer's two 2.36 MB filters at the peak.

    ``ragged_dot_dense``: a ``ragged_dot`` as jax lowers it for XLA:CPU: each ragged operand
    masked per group (groups x its size, sized in its own layout: under by the gather where
    the weight gradient reads rows split elsewhere whole), one copy an operand (XLA merges a
    forward's and its weight gradient's) alive from its first such reader to its last, and
    the forward's and the input gradient's weight copied group-major at the op."""
    loop_start = loop_start or {}
    written: dict[str, int] = {}
    for i, op in enumerate(ops):
        for t in op.outputs:
            written.setdefault(t, i)

    def origin(op) -> int:  # where a buffer that reads nothing is allocated
        return max(
            (
                loop_start.get(s.split("/", 1)[0], 0)
                for s in op.scope
                if s.split(".", 1)[0] in LOOP_OPS
            ),
            default=0,
        )

    out: list[tuple[str, int, int]] = []
    ragged: dict[str, list[int]] = {}
    for i, op in enumerate(ops):
        if lowering.select_and_scatter_expanded and op.primitive == "select_and_scatter_add":
            src, x = op.inputs[0], op.inputs[1]
            o = origin(op)
            at = max(o, written.get(x, o))  # the argmax runs where its operand is written
            index_bytes = 4 * len(g.tensors[x].shape)  # int32, one per dim
            out.append((op.outputs[0], o, max(o, i - 1)))  # the scatter's zeros (then in place)
            out += [(x, o, at)] * _times(g.tensors[x], index_bytes)  # the iotas
            out.append((src, at, at))  # the argmax's values
            out += [(src, at, i)] * _times(g.tensors[src], index_bytes)  # its indices
            out.append((src, i, i))  # the scatter's updates
        elif lowering.weight_gradient_copies and _weight_gradient(op):
            out += [(t, min(i, written.get(t, origin(op))), i) for t in op.inputs]
        if lowering.depthwise_gradient_dense and op.param("depthwise_gradient") is not None:
            out += [(op.outputs[0], i, i)] * (2 * op.param("batch_group_count"))
        if lowering.ragged_dot_dense and op.primitive == "ragged_dot_general":
            masked, weight = ragged_operands(g, op)
            for t in masked:  # one masked copy an operand (XLA merges them), to its last reader
                span = ragged.setdefault(t, [i, i, g.tensors[op.inputs[2]].shape[-1]])
                span[1] = i
            out += [(weight, i, i)] if weight is not None else []  # copied group-major
    for t, (first, last, groups) in ragged.items():
        out += [(t, first, last)] * groups
    return out


def _copies_made(g: Graph, position: list[int]) -> tuple[int, ...]:
    """Per program index, where a copy the op there reads first is made, barriers dropped:
    at its reader, or right after an optimization barrier outside loops whose output the op
    reads (a regather's weight: XLA:CPU gathers it at the step's start, beside the forward
    pass's gathered copy; the tiny GPT under FSDP with ``+regather`` compiled 1.12x the
    temporaries the step as written did, where barriers kept would save the forward's
    copies). An op reading such a barrier's output and another copy gives both that start."""
    barrier = {
        t: position[i] + 1
        for i, op in enumerate(g.ops)
        if op.primitive == "optimization_barrier"
        and not any(s.split(".", 1)[0] in LOOP_OPS for s in op.scope)
        for t in op.outputs
    }
    return tuple(
        min([position[i]] + [barrier[t] for t in op.inputs if t in barrier])
        for i, op in enumerate(g.ops)
    )


def _sixteen_bit_into_conv(g: Graph) -> set[str]:
    """Values an elementwise chain carries into a 16-bit convolution's operand. XLA keeps
    them as written instead of recomputing them in their other readers: XLA:CPU keeps the
    chain's float32 copies (``subtract_convert_fusion``, ``multiply_convert_fusion`` at the
    U-Net's peak), and the H200 kept as much (its U-Net row: docs/decisions.md). A float32
    U-Net on XLA:CPU recomputes them, as a transformer does."""
    out: set[str] = set()
    for op in reversed(g.ops):
        if (
            op.primitive == "conv_general_dilated"
            and g.tensors[op.inputs[0]].dtype in ("bfloat16", "float16")
        ) or (op.primitive in _DUPLICABLE and out & set(op.outputs)):
            out.update(op.inputs)
    return out


def _conv_layout_copies(g: Graph) -> list[tuple[str, int, int]]:
    """A 3-D convolution's operands copied into the layout the convolution runs in, each
    copy alive from the first such convolution that reads the value to the last (the
    forward's input is read again by the weight gradient's convolution). XLA:GPU runs
    convolutions with more than two spatial dims channels-first (``NCDHW``, its layout
    assignment) whatever the model's layout; XLA:CPU transposes the weight gradient's
    operands into its canonical form and keeps the forward's copy for the backward: a
    float32 U-Net's temporaries on XLA:CPU were predicted at 0.62x without these, 0.95-0.98x
    with them (three volumes: docs/decisions.md)."""
    span: dict[str, list[int]] = {}
    for i, op in enumerate(g.ops):
        if op.primitive == "conv_general_dilated" and len(op.param("spatial", ())) > 2:
            for t in op.inputs:
                span.setdefault(t, [i, i])[1] = i
    return [(t, a, b) for t, (a, b) in span.items()]


def liveness_peak(
    g: Graph,
    nbytes: Callable[[str], int],
    donated: Sequence[str] = (),
    copies: Sequence[tuple[int, int, int]] = (),
    lives: Sequence[tuple[str, int, int]] | None = None,
    compiler: Efficiency | None = None,
) -> MemoryUse:
    """Peak bytes per device; ``nbytes(tensor)`` is a tensor's local size, ``donated`` the
    input tensors whose buffers the step's outputs may reuse, ``copies`` extra buffers as
    ``(first op index, last op index, bytes)`` in program order (a tensor resharded for its
    readers: FSDP's gathered weights live from the first reader to the last), placed in the
    schedule as :meth:`Lifetimes.span` places them. ``lives`` is :func:`lifetimes` when the
    caller already has it (the search walks one graph often), ``compiler`` as there."""
    resident: dict[str, int] = {}
    for t in g.inputs:
        c = _category(g.tensors[t].path)
        resident[c] = resident.get(c, 0) + nbytes(t)
    n = len(g.ops)
    delta = [0] * (n + 2)
    if lives is None:
        lives = lifetimes(g, donated, compiler)
    for t, first, last in lives:
        b = nbytes(t)
        delta[first] += b
        delta[last + 1] -= b
    extra = [0] * (n + 2)
    span = getattr(lives, "span", None)
    for first, last, b in copies:
        if span is not None:
            first, last = span(first, last)
        delta[first] += b
        delta[last + 1] -= b
        extra[first] += b
        extra[last + 1] -= b
    order = getattr(lives, "order", None)
    live, peak, peak_op = 0, 0, None
    held = held_at_peak = 0
    for i in range(n):
        live += delta[i]
        held += extra[i]
        if live > peak:
            peak, held_at_peak = live, held
            peak_op = g.ops[i if order is None else order[i]].name
    total = sum(resident.values())
    by = {**resident, "activations": peak - held_at_peak}
    if held_at_peak:
        by["copies"] = held_at_peak  # resharded copies (FSDP's gathered weights) at the peak
    return MemoryUse(total + peak, by, peak_op)
