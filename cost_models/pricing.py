"""The price of a whole step laid out one way: every op's strategy, the resharding between
them, the hand-overs at loop boundaries and donated state, step time and memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from autolayout.core import (
    Graph,
    Hardware,
    hoisted,
    local_bytes,
    loop_links,
    made_at,
    op_index,
    per_graph,
)

from .compute import peak_flops
from .memory import aliased_outputs, liveness_peak
from .sharding import (
    LOOP_OPS,
    Comm,
    Machine,
    OpCost,
    boundaries,
    boundary_comms,
    copied_inputs,
    copy_key,
    copy_layout,
    free_tensors,
    fused_ops,
    op_cost,
    op_groups,
    op_template,
    reshard,
    stacked_residuals,
    state_dims,
)


def step_time(compute: float, comm: float, overlap: float) -> tuple[float, float, float]:
    """(used, no-overlap bound, full-overlap bound): the profile's overlap factor interpolates."""
    worst, best = compute + comm, max(compute, comm)
    return best + (1.0 - overlap) * (worst - best), worst, best


def price(
    g: Graph,
    hw: Hardware,
    mesh: dict[str, int],
    layouts: dict[str, tuple[tuple[str, ...], ...]],
    assign_of,
    *,
    donated: Sequence[str] = (),
    reuse: bool = True,
) -> dict[str, Any]:
    """Prices a whole step: ``layouts`` of every tensor, ``assign_of(op, groups)`` each op's
    strategy (or a mapping op name -> strategy). Returns the per-op costs and the totals.
    ``reuse=False`` prices every op on its own instead of reusing the cost of an op alike
    (the tests hold the two equal)."""

    m = Machine(hw, mesh, state_dims(g, donated))
    costs: list[OpCost] = []
    resharded: set = set()
    free, fused = free_tensors(g), fused_ops(g)
    alike: dict[tuple, tuple] = {}
    static = g.derived("alike ops", dict)  # op -> the part of its alike key the graph fixes
    given = assign_of if isinstance(assign_of, Mapping) else None
    index = op_index(g)
    spans: dict[tuple, list[int]] = {}  # (tensor, layout) read in another layout: op span
    made = made_at(g)
    for op in g.ops:
        if op.primitive in LOOP_OPS:  # its body's ops carry the cost
            continue
        kind = static.get(op.name) if reuse else False
        if kind is None:
            kind = static[op.name] = _alike_kind(g, op, free, fused)
        if kind is False:
            groups = op_groups(g, op)
            assign = given[op.name] if given is not None else assign_of(op, groups)
            c = op_cost(m, g, op, groups, assign, layouts, resharded, free, fused)
            read = _copied(op, c, layouts, free)
        else:  # groups are made only for the first op of each key
            assign = given[op.name] if given is not None else assign_of(op, op_groups(g, op))
            c, read = _op_cost_alike(m, g, op, kind, assign, layouts, resharded, free, fused, alike)
        costs += _hoisted_copies(c, made) if op.trip_count > 1 else [c]
        if read:
            i = index[op.name]
            for key in read:  # a copy hoisted out of a loop lives through it, one a loop
                lo, hi, loop = hoisted(g, i, key[0])
                span = spans.setdefault((*key, loop), [lo, hi])
                span[0], span[1] = min(span[0], lo), max(span[1], hi)
    costs += _boundary_costs(m, g, layouts, aliased_outputs(g, donated))
    compute = sum(c.compute_s * c.op.trip_count for c in costs)
    comm = sum(c.comm_s * c.op.trip_count for c in costs)
    used, worst, best = step_time(compute, comm, hw.efficiency.overlap)
    flops = sum(c.flops * c.op.trip_count for c in costs)
    model_flops = _model_flops(g)
    nbytes = _bytes_of(g, mesh)
    copies = [(a, b, nbytes(t, w)) for (t, w, _), (a, b) in spans.items()]
    mem = liveness_peak(
        g,
        lambda t: nbytes(t, layouts[t]),
        donated,
        copies,
        compiler=hw.efficiency,
    )
    main_dtype = _main_dtype(g)
    peak = peak_flops(hw, main_dtype) * hw.num_devices
    predicted = {
        "step_time_s": used,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": used - compute,
        "step_time_no_overlap_s": worst,
        "step_time_full_overlap_s": best,
        "flops_per_device": flops,
        "model_flops": model_flops,
        "memory_bytes_per_device": mem.peak_bytes,
        "memory_limit_bytes": hw.hbm_limit_bytes,
        "memory_by_category": mem.by_category,
        "fits": mem.peak_bytes <= hw.hbm_limit_bytes,
        "mfu": model_flops / (used * peak) if used > 0 else 0.0,
        "hfu": flops * hw.num_devices / (used * peak) if used > 0 else 0.0,
        "dtype": main_dtype,
        # the chip's rooflines (per device), for reports
        "peak_flops_per_device": peak / hw.num_devices,
        "hbm_bandwidth_bytes_per_s": hw.chip.hbm_bandwidth,
        "hbm_bytes_per_device": hw.chip.hbm_bytes,
        "matmul_efficiency": hw.efficiency.matmul,
        "memory_efficiency": hw.efficiency.memory,
    }
    return {"costs": costs, "predicted": predicted}


def _alike_kind(g: Graph, op, free, fused) -> tuple | bool:
    """The part of an op's alike key (``_op_cost_alike``) the graph fixes, or ``False`` for
    an op priced on its own: a conv (halos), parameters that do not hash, an unnamed group."""
    tpl = op_template(g, op)
    if tpl is None or not tpl[1]:
        return False
    # a residual the backward scan reads is copied in and out of its stack (the profile's
    # scan_stack_passes): the backward's op alike in all else is not (LLaMA-3-8B h100-64:
    # 0.0113 s of compute charged to ops whose results are no residual, 3% of the step)
    stacked = stacked_residuals(g)
    key = (tpl[2], op.flops, op.name in fused, tuple([t in free for t in op.inputs]),
           tuple([t in stacked for t in op.outputs]))  # fmt: skip
    interned = g.derived("alike keys", dict)  # ops alike share one (fewer objects to collect)
    return interned.setdefault(key, key)


def _op_cost_alike(m, g: Graph, op, kind, assign, layouts, resharded, free, fused, alike):
    """``op_cost``, reused for an op alike in everything the cost depends on (primitive,
    parameters, FLOPs, fusion, shapes, groups, strategy and the layouts of its tensors) to one
    priced before: the 96 layers of a stack are priced once each kind. Tensor names are
    renamed to the op's own. A copy of an input is charged as ``op_cost`` charges it: once
    per tensor, layout and trip count (``resharded``). ``kind``: ``_alike_kind``. Returns the
    cost and its ``_copied`` inputs."""
    ins, outs = op.inputs, op.outputs
    key = (kind, tuple(assign), tuple([layouts[t] for t in ins]), tuple([layouts[t] for t in outs]))
    try:
        made = alike.get(key)
    except TypeError:  # layouts given as lists
        c = op_cost(m, g, op, op_groups(g, op), assign, layouts, resharded, free, fused)
        return c, _copied(op, c, layouts, free)
    if made is None:  # priced with no copy shared; the copies' collectives apart
        c0 = op_cost(m, g, op, op_groups(g, op), assign, layouts, None, free, fused)
        copies = []
        for t in copied_inputs(op, c0.wanted, layouts, free):
            tt, w = g.tensors[t], c0.wanted[t]
            made_as = copy_layout(m, tt, layouts[t], w)
            copies.append((ins.index(t), w, made_as, reshard(m, tt, layouts[t], made_as)))
        rest = c0.comms[sum(len(cc) for *_, cc in copies) :]
        made = alike[key] = (c0, copies, rest)
    c0, copies, rest = made
    ins0, outs0 = c0.op.inputs, c0.op.outputs
    same = ins0 is ins and outs0 is outs
    # the copies by position hold for this op too: the key holds the inputs' layouts and
    # which inputs are free
    reads = [(ins[pos], w) for pos, w, _, _ in copies]
    comms: list = []
    for pos, _, made_as, cc in copies:
        t = ins[pos]
        k = copy_key(g, op, t, made_as)
        if k in resharded:
            continue
        resharded.add(k)
        comms += cc if t == ins0[pos] else [_on(x, t) for x in cc]
    if same:
        return OpCost(op, c0.strategy, c0.wanted, c0.produced, c0.partial, c0.flops, c0.bytes,
                      c0.compute_s, comms + rest), reads  # fmt: skip
    rename = dict(zip(outs0, outs, strict=True))
    comms += [_on(x, rename.get(x.tensor, x.tensor)) for x in rest]
    return OpCost(
        op, c0.strategy,
        {t: c0.wanted[t0] for t, t0 in zip(ins, ins0, strict=True)},
        {t: c0.produced[t0] for t, t0 in zip(outs, outs0, strict=True)},
        c0.partial, c0.flops, c0.bytes, c0.compute_s, comms,
    ), reads  # fmt: skip


def _hoisted_copies(c: OpCost, made: Mapping[str, int]) -> list[OpCost]:
    """``c``, with the collectives on the inputs its loop's iterations share (made fewer times
    than the op runs) moved to rows of their own, run as often as those inputs are made."""
    op = c.op
    early = {t for t in op.inputs if made[t] < op.trip_count}
    if not early or not any(x.tensor in early for x in c.comms):
        return [c]
    rows: dict[int, list[Comm]] = {}
    for x in c.comms:
        if x.tensor in early:
            rows.setdefault(made[x.tensor], []).append(x)
    kept = [x for x in c.comms if x.tensor not in early]
    out = [dataclasses.replace(c, comms=kept)]
    for trips, comms in rows.items():
        moved = dataclasses.replace(op, trip_count=trips)
        out.append(OpCost(moved, {}, {}, {}, (), 0.0, 0.0, 0.0, comms))
    return out


def _copied(op, c: OpCost, layouts, free) -> list[tuple[str, Any]]:
    """``(tensor, layout)`` of each input ``c`` reads in another layout (``copied_inputs``)."""
    return [(t, c.wanted[t]) for t in copied_inputs(op, c.wanted, layouts, free)]


def _on(x: Comm, t: str) -> Comm:
    """Collective ``x`` on tensor ``t`` (``x`` itself when it is on ``t``: comms are frozen)."""
    return x if x.tensor == t else dataclasses.replace(x, tensor=t)


def _boundary_costs(m, g: Graph, layouts, aliased: dict[str, str]) -> list:
    """Resharding where a loop, a branch or donated state hands a tensor over in another
    layout, as one row per (op, trips): a carry is handed over every iteration."""
    rows: dict[tuple[str, int], OpCost] = {}
    ops = {op.name: op for op in g.ops}
    for b in boundaries(g, aliased):
        comms = boundary_comms(m, g, b, layouts[b.src], layouts[b.dst])
        if not comms:
            continue
        key = (b.owner, b.trips)
        if key not in rows:
            op = dataclasses.replace(ops.get(b.owner, g.ops[-1]), trip_count=b.trips)
            rows[key] = OpCost(op, {}, {}, {}, (), 0.0, 0.0, 0.0, [])
        rows[key].comms.extend(comms)
    return list(rows.values())


def _loss_op(g: Graph, t: str, producer: dict[str, str], index: dict[str, int]) -> str:
    """The op that first makes the loss ``t`` a scalar: back from ``t`` through the scalar
    floats it is made of (the latest one each time), and from a loop's output into its body
    (gradient accumulation returns the mean of a loop's summed microbatch losses: the
    backward passes are in the loop, after each microbatch's loss)."""
    ops = {op.name: op for op in g.ops}
    body_of = loop_links(g)[1]  # a loop's output -> the body's tensor it is
    seen: set[str] = set()
    name = producer[t]
    while t not in seen:
        seen.add(t)
        if t in body_of and body_of[t] in producer:  # into the loop's body
            t = body_of[t]
            name = producer[t]
            continue
        scalars = [x for x in ops[name].inputs if x in producer and g.tensors[x].size == 1
                   and "float" in g.tensors[x].dtype]  # fmt: skip
        if not scalars:
            break
        t = max(scalars, key=lambda x: index[producer[x]])
        if t not in body_of:
            name = producer[t]
    return name


@per_graph
def recomputed_ops(g: Graph) -> set[str]:
    """The ops that redo forward work in the backward pass (remat), for MFU's model FLOPs.

    The backward pass is what follows the op that writes the loss (the step's last scalar
    float output). A remat region there holds the recomputed forward and the region's own
    backward; an op of it is a recomputation when none of its inputs depends on a cotangent,
    i.e. on a value the backward pass made outside the recomputation.
    """
    index = op_index(g)
    producer = {o: op.name for op in g.ops for o in op.outputs}
    losses = [
        _loss_op(g, o, producer, index)
        for o in g.outputs
        if o in producer and g.tensors[o].size == 1 and "float" in g.tensors[o].dtype
    ]
    if not losses:
        return set()
    end = max(index[p] for p in losses)
    outer = loop_links(g)[0]  # a loop body's input -> the tensor the loop feeds it
    again: set[str] = set()
    cot: dict[str, bool] = {}

    def is_cot(t: str) -> bool:
        while t not in cot and t in outer:  # a loop: a closure calling itself is a cycle
            t = outer[t]
        if t in cot:
            return cot[t]
        p = producer.get(t)
        return p is not None and index[p] > end and p not in again

    for i, op in enumerate(g.ops):
        carries = any(is_cot(t) for t in op.inputs)
        if i > end and op.remat and not carries:
            again.add(op.name)
        for o in op.outputs:  # a cotangent: made after the loss from one (or from nothing:
            # the seed); a weight read again through a barrier is none
            cot[o] = i > end and op.name not in again and (carries or not op.inputs)
    return again


@per_graph
def _model_flops(g: Graph) -> float:
    """The step's FLOPs without the recomputed ones (what MFU counts)."""
    again = recomputed_ops(g)
    return sum(op.flops * op.trip_count for op in g.ops if op.name not in again)


@per_graph
def _main_dtype(g: Graph) -> str:
    """The element type of most matmul FLOPs (what the MFU's peak is taken at)."""
    by: dict[str, float] = {}
    for op in g.ops:
        if op.primitive in ("dot_general", "conv_general_dilated") and op.inputs:
            d = g.tensors[op.inputs[0]].dtype
            by[d] = by.get(d, 0.0) + op.flops * op.trip_count
    return max(by, key=by.get) if by else "float32"


def _bytes_of(g: Graph, mesh: Mapping[str, int]):
    """``local_bytes`` of a tensor in a layout, memoised by shape, dtype and layout (a
    96-layer step has 38k tensors of a few dozen shapes)."""
    memo: dict[tuple, int] = {}

    def nbytes(t: str, layout) -> int:
        tt = g.tensors[t]
        try:
            key = (tt.shape, tt.dtype, layout)
            v = memo.get(key)
        except TypeError:  # a layout given as lists
            return local_bytes(tt, layout, mesh)
        if v is None:
            v = memo[key] = local_bytes(tt, layout, mesh)
        return v

    return nbytes
