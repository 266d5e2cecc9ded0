"""Per-primitive dim rules: which axes of an equation's inputs and outputs are the same axis.

A rule is ``rule(b, eqn, ins, outs) -> (params, flops)``. ``ins`` and ``outs`` are the tensor
ids the builder ``b`` assigned to the equation's variables (``None`` for a literal);
``b.link((t, axis), (t2, axis2), ...)`` says those axes are one iteration axis of the op
(it ignores pairs whose sizes differ or are 1). ``params`` is a dict of plain values the
cost model needs (which axes are contracted, gathered, windowed...), ``flops`` the op's
floating-point work when run once, unsplit.

Rules are registered per primitive name in :data:`DIM_RULES`, beside what they describe,
the way jax keeps ``dce_rules``. A primitive without a rule becomes an opaque op.
Higher-order primitives (jit, scan, remat, ...) are walked by ``_trace.py`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from jax._src.random import prng as _prng  # the registered key implementations (jax is pinned)

from ._splash import SPLASH_BWD, SPLASH_FWD
from ._workload import parse_name_dims


class Builder(Protocol):
    user: dict[int, tuple[str | None, ...]]
    shapes: list[tuple[int, ...]]

    def shape(self, t: int | None) -> tuple[int, ...]: ...
    def link(self, *axes: tuple[int | None, int]) -> None: ...
    def link_pair(self, t: int, a: int, u: int, c: int) -> None: ...


Rule = Callable[[Builder, Any, list, list], tuple[dict[str, Any], float]]
DIM_RULES: dict[str, Rule] = {}


def register(*names: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        for n in names:
            DIM_RULES[n] = fn
        return fn

    return deco


def _size(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# --- elementwise ----------------------------------------------------------------------------

ELEMENTWISE = (
    "abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp complex conj "
    "convert_element_type copy copy_p cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 "
    "floor ge gt igamma igammac imag integer_pow is_finite le lgamma log log1p logistic lt max "
    "min mul ne neg nextafter not or population_count pow real reduce_precision rem round rsqrt "
    "select_n shift_left shift_right_arithmetic shift_right_logical sign sin sinh sqrt square "
    "stop_gradient sub tan tanh xor clz polygamma zeta bessel_i0e bessel_i1e optimization_barrier "
    "mulhi igamma_grad_a random_gamma_grad regularized_incomplete_beta zeros_like select_if_vmap"
).split()


@register(*ELEMENTWISE)
def _elementwise(b, eqn, ins, outs):
    shapes, pair = b.shapes, b.link_pair
    for o in outs:
        rank = len(shapes[o])
        for i in ins:  # operands of equal rank; a size-1 axis broadcasts and is not linked
            if i is not None and len(shapes[i]) == rank:
                for ax in range(rank):
                    pair(o, ax, i, ax)
    return {}, float(_size(shapes[outs[0]])) if outs else 0.0


@register("optimization_barrier")
def _barrier(b, eqn, ins, outs):
    """Each output is its own operand (a barrier over a weight and a cotangent does not make
    them one dim, whatever their sizes)."""
    for i, o in zip(ins, outs, strict=False):
        if i is not None:
            for ax in range(len(b.shape(o))):
                b.link((o, ax), (i, ax))
    return {}, 0.0


@register("name")
def _name(b, eqn, ins, outs):
    """``checkpoint_name``: an identity; ``al.name_dims`` uses it to name an intermediate."""
    _elementwise(b, eqn, ins, outs)
    dims = parse_name_dims(str(eqn.params["name"]))
    if dims is not None and len(dims) == len(b.shape(outs[0])):
        b.user[outs[0]] = dims
    return {"name": str(eqn.params["name"])}, 0.0


@register("device_put")
def _device_put(b, eqn, ins, outs):
    """``jax.device_put`` inside a step: an identity; between HBM and host memory (an
    offloaded residual, ``pinned_host``) a transfer, ``to`` "host" or "device"."""
    _barrier(b, eqn, ins, outs)  # each output is its own operand
    moves = {b.hosts[i] for i, o in zip(ins, outs, strict=False) if i is not None
             and b.hosts[i] != b.hosts[o]}  # fmt: skip
    to = None if not moves else ("device" if moves == {True} else "host")
    return ({"to": to} if to else {}), 0.0


@register("rev")
def _rev(b, eqn, ins, outs):
    _elementwise(b, eqn, ins, outs)
    return {"reversed_axes": tuple(eqn.params["dimensions"])}, 0.0


@register("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def _cumulative(b, eqn, ins, outs):
    _, flops = _elementwise(b, eqn, ins, outs)
    return {
        "scan_axis": eqn.params["axis"],
        "reverse": bool(eqn.params.get("reverse", False)),
    }, flops


# --- contractions ---------------------------------------------------------------------------


@register("dot_general")
def _dot_general(b, eqn, ins, outs):
    lhs, rhs = ins
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs, out = b.shape(lhs), b.shape(rhs), outs[0]
    for li, ri in zip(lc, rc, strict=True):
        b.link((lhs, li), (rhs, ri))
    k = 0
    for li, ri in zip(lb, rb, strict=True):
        b.link((lhs, li), (rhs, ri), (out, k))
        k += 1
    for li in range(len(ls)):
        if li not in lc and li not in lb:
            b.link((lhs, li), (out, k))
            k += 1
    for ri in range(len(rs)):
        if ri not in rc and ri not in rb:
            b.link((rhs, ri), (out, k))
            k += 1
    contracted = _size(tuple(ls[i] for i in lc))
    params = {
        "contracting": tuple(zip(lc, rc, strict=True)),
        "batch": tuple(zip(lb, rb, strict=True)),
        "precision": precision_name(eqn.params.get("precision")),
    }
    return params, 2.0 * _size(b.shape(out)) * contracted


@register("ragged_dot_general")
def _ragged_dot(b, eqn, ins, outs):
    """A grouped matmul (``lax.ragged_dot``: an MoE's tokens sorted by expert times each
    expert's weight), in jax's three forms (``RaggedDotMode``): ragged non-contracting
    ``[m, k] x [g, k, n] -> [m, n]`` (the forward), ragged contracting ``[m, k]^T [m, n] ->
    [g, k, n]`` (the weight gradient), ragged batch. Axes link as a dot's, the ragged one
    included: XLA:CPU keeps rows split with the weights whole (no collective; measured on
    8 devices) and sums a split ``m`` of the weight gradient. The rhs's group axis and the
    weight gradient's leading group axis are ``group_sizes``'s last axis (one dim, the
    experts), not the rows' (which rows meet which group only ``group_sizes`` knows)."""
    lhs, rhs = ins[0], ins[1]
    rd = eqn.params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = rd.dot_dimension_numbers
    groups = set(rd.rhs_group_dimensions)
    ls, rs, out = b.shape(lhs), b.shape(rhs), outs[0]
    k = 1 if rd.lhs_ragged_dimensions[0] in lc else 0  # the gradient's leading group axis
    free_l = [i for i in range(len(ls)) if i not in lc and i not in lb]
    free_r = [i for i in range(len(rs)) if i not in rc and i not in rb and i not in groups]
    if len(b.shape(out)) != k + len(lb) + len(free_l) + len(free_r):
        raise ValueError(f"output rank {len(b.shape(out))} is not the form's")
    size = _size(b.shape(out)[k:])  # each output row meets one group's weight
    gs = ins[2]
    if gs is not None and b.shape(gs):
        g = len(b.shape(gs)) - 1
        b.link((gs, g), *[(rhs, a) for a in groups], *([(out, 0)] if k else []))
    for li, ri in zip(lc, rc, strict=True):
        b.link((lhs, li), (rhs, ri))
    for li, ri in zip(lb, rb, strict=True):
        b.link((lhs, li), (rhs, ri), (out, k))
        k += 1
    for li in free_l:
        b.link((lhs, li), (out, k))
        k += 1
    for ri in free_r:
        b.link((rhs, ri), (out, k))
        k += 1
    params = {
        "contracting": tuple(zip(lc, rc, strict=True)),
        "batch": tuple(zip(lb, rb, strict=True)),
        "ragged": rd.lhs_ragged_dimensions[0],
        "precision": precision_name(eqn.params.get("precision")),
    }
    return params, 2.0 * size * _size(tuple(ls[i] for i in lc))


def precision_name(precision: Any) -> str:
    """A dot's ``precision`` (None, a ``Precision`` per operand, or a ``DotAlgorithmPreset``)
    as plain text: ``default``, ``high``, ``highest`` or the algorithm's name, lower-cased."""
    if precision is None:
        return "default"
    if isinstance(precision, (tuple, list)):
        order = ["default", "high", "highest"]
        names = [precision_name(p) for p in precision if p is not None]
        known = [n for n in names if n in order]
        return max(known, key=order.index) if known else (names[0] if names else "default")
    name = getattr(precision, "name", str(precision)).lower()
    return {"fastest": "default", "float32": "highest", "tensorfloat32": "high",
            "bfloat16": "default", "bfloat16_3x": "high"}.get(name, name)  # fmt: skip


def grouped_conv(params: dict, lhs_shape: tuple, rhs_shape: tuple) -> tuple | None:
    """Where XLA's SPMD partitioner gives up on a grouped convolution (groups of more than
    one channel: ResNeXt, RegNet; a channel multiplier's weight gradient) and runs it whole on
    every device, its operands gathered (openxla/xla#47945, jax 0.10.2; measured on 8 CPU
    devices for 2, 4 and 8 groups): its batch's positions, ``((operand, axis), (operand,
    axis))`` (0 the input, 1 the kernel, 2 the output), on which ``al.apply`` runs it under
    ``shard_map`` (runtime.kernels): the input's and the output's batch for a forward conv or
    an input gradient, the contracted batch of both operands (a partial sum) for a weight
    gradient. ``None`` for a dense or depthwise conv, which XLA partitions."""
    dn = params["dimension_numbers"]
    if params["feature_group_count"] > 1 and rhs_shape[dn.rhs_spec[1]] > 1:
        return (0, dn.lhs_spec[0]), (2, dn.out_spec[0])
    bgc = params["batch_group_count"]
    if bgc > 1 and not bgc == lhs_shape[dn.lhs_spec[0]] == rhs_shape[dn.rhs_spec[0]]:
        return (0, dn.lhs_spec[1]), (1, dn.rhs_spec[1])
    return None


@register("conv_general_dilated")
def _conv(b, eqn, ins, outs):
    """Forward convs link input and output spatial axes of equal size; the weight-gradient
    form (the kernel is the size of the input) links input and kernel spatial axes instead.
    Strided and dilated axes are windowed relations, recorded for the halo cost."""
    p = eqn.params
    lhs, rhs = ins
    out = outs[0]
    dn = p["dimension_numbers"]
    lb, lf, *lsp = dn.lhs_spec
    ro, ri, *rsp = dn.rhs_spec
    ob, of, *osp = dn.out_spec
    ls, rs, os_ = b.shape(lhs), b.shape(rhs), b.shape(out)
    fgc, bgc = p["feature_group_count"], p["batch_group_count"]
    if bgc == 1:
        b.link((lhs, lb), (out, ob))
    if fgc == 1:  # (a grouped weight gradient still contracts the batch, lhs's "feature")
        b.link((lhs, lf), (rhs, ri))
    b.link((rhs, ro), (out, of))
    # depthwise (a group per channel, as many out channels as in): the channels split
    # input, kernel and output alike, without a collective; XLA:CPU gathers every other
    # grouping (2 or 4 groups of 8 channels split 2 or 4 ways; a channel multiplier's
    # gradient), so those stay relations (measured on 8 devices)
    if fgc > 1 and fgc == ls[lf] == os_[of]:
        b.link((lhs, lf), (rhs, ro), (out, of))
    if bgc > 1 and bgc == ls[lb] == os_[of]:  # the depthwise weight gradient
        b.link((lhs, lb), (rhs, ro), (out, of))
    spatial = []
    for i, (la, ra, oa) in enumerate(zip(lsp, rsp, osp, strict=True)):
        if ls[la] == os_[oa]:
            b.link((lhs, la), (out, oa))
            pairing = "out"
        elif ls[la] == rs[ra]:
            b.link((lhs, la), (rhs, ra))
            pairing = "kernel"
        else:
            pairing = "window"
        spatial.append(
            {
                "lhs": la,
                "rhs": ra,
                "out": oa,
                "lhs_size": ls[la],
                "out_size": os_[oa],
                "window": rs[ra],
                "stride": p["window_strides"][i],
                "padding": tuple(p["padding"][i]),
                "lhs_dilation": p["lhs_dilation"][i],
                "rhs_dilation": p["rhs_dilation"][i],
                "pairing": pairing,
            }
        )
    # FLOPs as XLA counts them: only (output, tap) pairs that land on a real input element
    # (not on "SAME" padding, nor between the elements of a transposed conv's dilated input)
    taps = 1
    for i, (la, ra, oa) in enumerate(zip(lsp, rsp, osp, strict=True)):
        taps *= _valid_taps(
            ls[la], rs[ra], os_[oa], p["window_strides"][i], p["padding"][i][0],
            p["lhs_dilation"][i], p["rhs_dilation"][i],
        )  # fmt: skip
    params = {
        "spatial": tuple(tuple(sorted(s.items())) for s in spatial),
        "feature_group_count": p["feature_group_count"],
        "batch_group_count": p["batch_group_count"],
    }
    if bgc > 1 and bgc == ls[lb] == os_[of]:  # the depthwise weight gradient: its channels' axis
        params["depthwise_gradient"] = of  # (XLA:CPU runs it dense: cost_models.sharding)
    grouped = grouped_conv(p, ls, rs)
    if grouped:  # split on its batch alone (cost_models.sharding, runtime.kernels)
        params["grouped"] = grouped
    return params, 2.0 * os_[ob] * os_[of] * rs[ri] * taps


def _valid_taps(n: int, k: int, o: int, stride: int, lo: int, lhs_dil: int, rhs_dil: int) -> int:
    """Pairs (output position, kernel tap) of one spatial dim that read an input element."""
    span = (n - 1) * lhs_dil + 1
    count = 0
    for j in range(k):
        for i in range(o):
            q = i * stride + j * rhs_dil - lo
            if 0 <= q < span and q % lhs_dil == 0:
                count += 1
    return count


@register("broadcast_in_dim")
def _broadcast(b, eqn, ins, outs):
    op, out = ins[0], outs[0]
    if op is not None:
        for i, o in enumerate(eqn.params["broadcast_dimensions"]):
            b.link((op, i), (out, int(o)))
    return {"broadcast_dimensions": tuple(int(d) for d in eqn.params["broadcast_dimensions"])}, 0.0


@register("transpose")
def _transpose(b, eqn, ins, outs):
    perm = eqn.params["permutation"]
    for o, i in enumerate(perm):
        b.link((ins[0], i), (outs[0], o))
    return {"permutation": tuple(perm)}, 0.0


def reshape_groups(
    src: tuple[int, ...], dst: tuple[int, ...]
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Pairs of axis groups whose sizes multiply to the same number (size-1 axes left out).

    ``(8, 12, 64) -> (8, 768)`` gives ``[((0,), (0,)), ((1, 2), (1,))]``: axis 0 is kept,
    axes 1 and 2 merge into one.
    """
    si = [i for i, s in enumerate(src) if s != 1]
    di = [i for i, s in enumerate(dst) if s != 1]
    groups = []
    a = c = 0
    while a < len(si) and c < len(di):
        ga, gc = [si[a]], [di[c]]
        pa, pc = src[si[a]], dst[di[c]]
        a, c = a + 1, c + 1
        while pa != pc:
            if pa < pc:
                ga.append(si[a])
                pa *= src[si[a]]
                a += 1
            else:
                gc.append(di[c])
                pc *= dst[di[c]]
                c += 1
        groups.append((tuple(ga), tuple(gc)))
    return groups


@register("reshape")
def _reshape(b, eqn, ins, outs):
    src, dst = b.shape(ins[0]), b.shape(outs[0])
    if eqn.params.get("dimensions") not in (None, ()):
        return {"groups": (), "dimensions": tuple(eqn.params["dimensions"])}, 0.0
    groups = reshape_groups(src, dst)
    for ga, gc in groups:
        if len(ga) == 1 and len(gc) == 1:
            b.link((ins[0], ga[0]), (outs[0], gc[0]))
    return {"groups": tuple(groups)}, 0.0


@register("squeeze")
def _squeeze(b, eqn, ins, outs):
    removed = set(eqn.params["dimensions"])
    kept = [i for i in range(len(b.shape(ins[0]))) if i not in removed]
    for o, i in enumerate(kept):
        b.link((ins[0], i), (outs[0], o))
    return {}, 0.0


@register("expand_dims")
def _expand_dims(b, eqn, ins, outs):
    added = set(eqn.params["dimensions"])
    kept = [i for i in range(len(b.shape(outs[0]))) if i not in added]
    for i, o in enumerate(kept):
        b.link((ins[0], i), (outs[0], o))
    return {}, 0.0


def _link_except(b, a: int, c: int, skip: set[int]) -> None:
    for ax in range(len(b.shape(a))):
        if ax not in skip:
            b.link((a, ax), (c, ax))


@register("concatenate")
def _concatenate(b, eqn, ins, outs):
    d = eqn.params["dimension"]
    for i in ins:
        if i is not None:
            _link_except(b, i, outs[0], {d})
    return {"axis": d}, 0.0


@register("stack")
def _stack(b, eqn, ins, outs):
    """``jnp.stack`` (jax 0.10 binds one ``stack``): each operand's axes are the output's
    without the new axis, which is a relation (XLA concatenates along it, partitioned along
    the others like a concatenate)."""
    d = eqn.params["axis"]
    for i in ins:
        if i is not None:
            for ax in range(len(b.shape(i))):
                b.link((i, ax), (outs[0], ax + (ax >= d)))
    return {"axis": d}, 0.0


@register("unstack")
def _unstack(b, eqn, ins, outs):
    """``jnp.unstack`` / the gradient of ``jnp.stack``: each output is a slice of the operand
    along ``axis`` (kept whole there: a relation), the other axes pass through."""
    d = eqn.params["axis"]
    for o in outs:
        for ax in range(len(b.shape(o))):
            b.link((ins[0], ax + (ax >= d)), (o, ax))
    return {"axis": d}, 0.0


@register("tile")
def _tile(b, eqn, ins, outs):
    """``jnp.tile``: an axis repeated once is the operand's; a repeated one is a relation."""
    for ax, r in enumerate(eqn.params["reps"]):
        if r == 1:
            b.link((ins[0], ax), (outs[0], ax))
    return {"reps": tuple(eqn.params["reps"])}, 0.0


@register("split")
def _split(b, eqn, ins, outs):
    axis = eqn.params["axis"]
    for o in outs:
        _link_except(b, ins[0], o, {axis})
        b.link((ins[0], axis), (o, axis))  # only when the piece is whole
    return {"axis": axis, "sizes": tuple(eqn.params["sizes"])}, 0.0


@register("pad")
def _pad(b, eqn, ins, outs):
    cfg = eqn.params["padding_config"]
    for ax, (lo, hi, interior) in enumerate(cfg):
        if lo == hi == interior == 0:
            b.link((ins[0], ax), (outs[0], ax))
    return {"padding": tuple(tuple(c) for c in cfg)}, 0.0


@register("slice")
def _slice(b, eqn, ins, outs):
    start, limit = eqn.params["start_indices"], eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(start)
    shape = b.shape(ins[0])
    for ax in range(len(shape)):
        if start[ax] == 0 and limit[ax] == shape[ax] and strides[ax] == 1:
            b.link((ins[0], ax), (outs[0], ax))
    return {"start": tuple(start), "limit": tuple(limit)}, 0.0


@register("dynamic_slice")
def _dynamic_slice(b, eqn, ins, outs):
    for ax in range(len(b.shape(ins[0]))):
        b.link((ins[0], ax), (outs[0], ax))  # kept only where the slice is whole
    return {"slice_sizes": tuple(eqn.params["slice_sizes"])}, 0.0


@register("dynamic_update_slice")
def _dynamic_update_slice(b, eqn, ins, outs):
    operand, update = ins[0], ins[1]
    for ax in range(len(b.shape(operand))):
        b.link((operand, ax), (outs[0], ax), (update, ax))
    return {}, 0.0


@register("iota")
def _iota(b, eqn, ins, outs):
    return {"dimension": eqn.params["dimension"]}, 0.0


# --- reductions, sorting --------------------------------------------------------------------


@register(
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
    "reduce_xor", "argmax", "argmin",
)  # fmt: skip
def _reduce(b, eqn, ins, outs):
    axes = set(eqn.params["axes"])
    kept = [i for i in range(len(b.shape(ins[0]))) if i not in axes]
    for o in outs:
        for k, i in enumerate(kept):
            b.link((ins[0], i), (o, k))
    return {"reduced_axes": tuple(sorted(axes))}, float(_size(b.shape(ins[0])))


@register("sort")
def _sort(b, eqn, ins, outs):
    rank = len(b.shape(ins[0]))
    for ax in range(rank):
        b.link(*[(t, ax) for t in list(ins) + list(outs) if t is not None])
    n = _size(b.shape(ins[0]))
    d = b.shape(ins[0])[eqn.params["dimension"]]
    return {"sort_axis": eqn.params["dimension"]}, float(n * max(1, math.log2(max(d, 2))))


@register("top_k")
def _top_k(b, eqn, ins, outs):
    shape = b.shape(ins[0])
    axis = eqn.params.get("axis", len(shape) - 1)
    axis = axis % len(shape)
    for o in outs:
        for ax in range(len(shape)):
            b.link((ins[0], ax), (o, ax))  # the top-k axis links only when k == n
    return {"sort_axis": axis, "k": eqn.params["k"]}, float(_size(shape))


@register("approx_top_k")
def _approx_top_k(b, eqn, ins, outs):
    """``lax.approx_max_k``: like ``top_k`` along ``reduction_dimension``, the other axes
    passing through (on CPU and GPU it is a sort and a slice)."""
    shape = b.shape(ins[0])
    axis = eqn.params["reduction_dimension"] % len(shape)
    for o in outs:
        for ax in range(len(shape)):
            if ax != axis:
                b.link((ins[0], ax), (o, ax))
    return {"sort_axis": axis, "k": eqn.params["k"]}, float(_size(shape))


@register("reduce")
def _reduce_generic(b, eqn, ins, outs):
    """``lax.reduce`` over a computation JAX knows no monoid of (a variadic argmax): its
    operands, then as many init values, reduced over ``dimensions``."""
    axes = set(eqn.params["dimensions"])
    n = len(outs)
    for x, o in zip(ins[:n], outs, strict=True):
        kept = [i for i in range(len(b.shape(x))) if i not in axes]
        for k, i in enumerate(kept):
            b.link((x, i), (o, k))
    return {"reduced_axes": tuple(sorted(axes))}, float(n * _size(b.shape(ins[0])))


@register("fft")
def _fft(b, eqn, ins, outs):
    """An FFT over the trailing ``len(fft_lengths)`` axes: the leading ones are batch and
    pass through; the transformed ones are relations (a real FFT changes their size)."""
    k = len(eqn.params["fft_lengths"])
    rank = len(b.shape(ins[0]))
    for ax in range(rank - k):
        b.link((ins[0], ax), (outs[0], ax))
    n = _size(b.shape(ins[0]))
    points = _size(tuple(eqn.params["fft_lengths"]))
    return {"fft_axes": tuple(range(rank - k, rank))}, 5.0 * n * math.log2(max(points, 2))


# --- indexing -------------------------------------------------------------------------------


@register("gather")
def _gather(b, eqn, ins, outs):
    """Embedding lookup and take_along_axis: the indices' batch axes become the output's
    batch axes, un-collapsed operand axes taken whole become its offset axes."""
    operand, indices = ins
    out = outs[0]
    dn = eqn.params["dimension_numbers"]
    slice_sizes = eqn.params["slice_sizes"]
    op_shape, idx_rank, out_rank = b.shape(operand), len(b.shape(indices)), len(b.shape(out))
    batch_out = [d for d in range(out_rank) if d not in dn.offset_dims]
    idx_batch = list(range(idx_rank - 1))  # the last indices axis is the index vector
    for o, i in zip(batch_out, idx_batch, strict=True):
        b.link((out, o), (indices, i))
    skip = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(len(op_shape)) if d not in skip]
    for o, d in zip(dn.offset_dims, window, strict=True):
        if slice_sizes[d] == op_shape[d]:
            b.link((operand, d), (out, o))
    for od, id_ in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True):
        b.link((operand, od), (indices, id_))
    params = {"gathered_axes": tuple(dn.start_index_map), "offset_dims": tuple(dn.offset_dims)}
    return params, 0.0


SCATTERS = ("scatter-add", "scatter_add", "scatter", "scatter-mul", "scatter_mul", "scatter-min",
            "scatter-max", "scatter_min", "scatter_max", "scatter-sub", "scatter_sub")  # fmt: skip


@register(*SCATTERS)
def _scatter(b, eqn, ins, outs):
    """The gradient of a gather: updates scattered into an operand-shaped output."""
    operand, indices, updates = ins[:3]
    out = outs[0]
    dn = eqn.params["dimension_numbers"]
    op_shape, idx_rank, up_rank = b.shape(operand), len(b.shape(indices)), len(b.shape(updates))
    for ax in range(len(op_shape)):
        b.link((operand, ax), (out, ax))
    scatter_up = [d for d in range(up_rank) if d not in dn.update_window_dims]
    for u, i in zip(scatter_up, range(idx_rank - 1), strict=True):
        b.link((updates, u), (indices, i))
    skip = set(dn.inserted_window_dims) | set(dn.operand_batching_dims)
    window = [d for d in range(len(op_shape)) if d not in skip]
    for u, d in zip(dn.update_window_dims, window, strict=True):
        b.link((updates, u), (operand, d))
    for od, id_ in zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True):
        b.link((operand, od), (indices, id_))
    params = {"scattered_axes": tuple(dn.scatter_dims_to_operand_dims)}
    return params, float(_size(b.shape(updates)))


# --- windows: pooling and its gradients ----------------------------------------------------


def _untouched(p: dict, ax: int) -> bool:
    """Whether a windowed op leaves axis ``ax`` alone: a window of 1, stride 1, no padding
    or dilation (a pooling's batch and channels)."""
    pad = p.get("padding")
    return (
        p["window_dimensions"][ax] == 1
        and p["window_strides"][ax] == 1
        and (pad is None or tuple(pad[ax]) == (0, 0))
        and p.get("base_dilation", (1,) * (ax + 1))[ax] == 1
        and p.get("window_dilation", (1,) * (ax + 1))[ax] == 1
    )


def _window_params(p: dict) -> dict[str, Any]:
    return {
        "window": tuple(p["window_dimensions"]),
        "strides": tuple(p["window_strides"]),
        "padding": tuple(tuple(x) for x in p["padding"]),
    }


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window")
def _reduce_window(b, eqn, ins, outs):
    """Pooling (``max_pool``, ``avg_pool``, Keras ``MaxPooling2D``, and ``cumsum``'s
    lowering on some backends): the axes the window leaves alone (batch, channels) pass
    through, as XLA's SPMD partitioner keeps them split; a windowed axis is a relation
    between input and output, like a slice's (XLA exchanges halos there; here the input's
    windowed axis stays whole). The generic ``reduce_window`` reads operands, then as many
    init values."""
    p = eqn.params
    n = len(outs)
    for x, o in zip(ins[:n], outs, strict=True):
        if x is not None:
            for ax in range(len(b.shape(o))):
                if _untouched(p, ax):
                    b.link((x, ax), (o, ax))
    taps = _size(tuple(p["window_dimensions"]))  # taps - 1 combines an output, as XLA counts
    return _window_params(p), float(n * _size(b.shape(outs[0])) * max(taps - 1, 1))


@register("select_and_scatter_add", "select_and_scatter")
def _select_and_scatter(b, eqn, ins, outs):
    """Max-pooling's gradient: ``source`` (the pooled cotangent) scattered into an
    operand-shaped output where each window's maximum was. Untouched axes are one axis of
    source, operand and output; windowed axes are relations (a window reaches its
    neighbours' positions)."""
    p = eqn.params
    source, operand = ins[0], ins[1]
    for ax in range(len(b.shape(operand))):
        if _untouched(p, ax):
            b.link((outs[0], ax), (operand, ax), (source, ax))
    # XLA expands it into a reduce-window that tracks each window's argmax and a scatter:
    # 11 x taps - 10 per source element as XLA:CPU counts (2 to 16 taps, measured exactly)
    taps = _size(tuple(p["window_dimensions"]))
    return _window_params(p), float(_size(b.shape(source)) * (11 * taps - 10))


@register("select_and_gather_add")
def _select_and_gather(b, eqn, ins, outs):
    """Max-pooling's forward-mode derivative: each window's tangent at its maximum."""
    p = eqn.params
    tangents, operand = ins
    for ax in range(len(b.shape(operand))):
        b.link((tangents, ax), (operand, ax))
        if _untouched(p, ax):
            b.link((operand, ax), (outs[0], ax))
    taps = _size(tuple(p["window_dimensions"]))
    return _window_params(p), float(_size(b.shape(outs[0])) * taps)


# --- random numbers ---------------------------------------------------------------------------


THREEFRY_FLOPS = 51  # per 32-bit word drawn: XLA:CPU's count, 1,671,277 for 32,768 words


def _link_leading(b, a: int | None, c: int | None) -> None:
    """Links the leading axes two tensors share (a key array's axes and the bits drawn from
    it, which add trailing axes)."""
    if a is None or c is None:
        return
    for ax in range(min(len(b.shape(a)), len(b.shape(c)))):
        b.link((a, ax), (c, ax))


def storage_dtype(name: str) -> str:
    """A dtype name numpy reads, of the same bytes: a typed PRNG key (``key<fry>``: two
    uint32 words) as a void type of its key data's size (``V8``); others unchanged."""
    if not name.startswith("key<"):
        return name
    words = {f"key<{impl.tag}>": math.prod(impl.key_shape) for impl in _prng.prngs.values()}
    return f"V{4 * words.get(name, 2)}"


@register("random_seed", "random_fold_in", "random_clone", "random_gamma",
          "threefry2x32", "threefry4x32", "philox2x32", "philox4x32")  # fmt: skip
def _random_elementwise(b, eqn, ins, outs):
    """Keys made, folded or consumed one per element. With JAX's partitionable threefry
    (its default) XLA computes each device's block of random bits from its own counters."""
    _, flops = _elementwise(b, eqn, ins, outs)
    return {}, flops


@register("random_wrap", "random_unwrap", "random_bits", "random_split", "bitcast_convert_type",
          "to_edtype", "from_edtype")  # fmt: skip
def _random_leading(b, eqn, ins, outs):
    """A key array and what it becomes: ``random_wrap`` drops the key data's trailing axis,
    ``random_unwrap`` adds it, ``random_bits`` / ``random_split`` add the drawn shape after
    the keys' axes; ``bitcast_convert_type`` to a wider or narrower type adds or drops a
    trailing axis. The keys' axes are the result's leading axes; what is added is new."""
    for o in outs:
        _link_leading(b, ins[0], o)
    if eqn.primitive.name == "random_bits" and b.dtypes[ins[0]] == "key<fry>":
        words = _size(b.shape(outs[0])) * max(1, eqn.params["bit_width"] // 32)
        return {}, float(THREEFRY_FLOPS * words)
    return {}, 0.0


@register("iota_2x32_shape", "rng_bit_generator", "rng_uniform", "empty", "empty2",
          "platform_index", "create_token", "after_all", "dce_sink", "unvmap_any", "unvmap_all",
          "unvmap_max")  # fmt: skip
def _made_here(b, eqn, ins, outs):
    """Values made from no tensor axis (counters, uninitialised buffers, an RNG state's
    bits, the platform's index, tokens, Equinox's ``unvmap_any`` flags), or none made
    (``dce_sink``): their axes are their own, split as their readers want (XLA makes each
    device's block)."""
    return {}, 0.0


# --- identities -------------------------------------------------------------------------------


@register("sharding_constraint", "reshard", "layout_constraint", "pvary", "tie",
          "nondifferentiable_backward", "nontraceable", "nonbatchable", "announce_jaxpr")  # fmt: skip
def _identity(b, eqn, ins, outs):
    """A user's sharding or layout request, or a marker (Equinox's ``nontraceable`` and
    kin): each output is its operand (the plan chooses the layout; ``tie`` returns its
    second operand)."""
    src = ins[-len(outs) :] if len(ins) >= len(outs) else ins
    for i, o in zip(src, outs, strict=False):
        if i is not None:
            for ax in range(len(b.shape(o))):
                b.link((o, ax), (i, ax))
    return {}, 0.0


# --- fused attention kernels ------------------------------------------------------------------

# JAX's cuDNN flash attention (``jax.nn.dot_product_attention(implementation="cudnn")``) and
# the TPU's splash attention (``al.splash_attention``, ``_splash.py``): one kernel forward,
# one backward; the scores never reach HBM.
CUDNN_FWD = ("dot_product_attention_fwd_wrapper", "dot_product_attention_fwd")
CUDNN_BWD = ("dot_product_attention_bwd_wrapper", "dot_product_attention_bwd")
ATTENTION_FWD = CUDNN_FWD + SPLASH_FWD
ATTENTION_BWD = CUDNN_BWD + SPLASH_BWD
ATTENTION_BWD_FLOPS = 2.5  # the backward's matmuls per forward matmul: 5 against 2 (flash)


def attention_axes(layout: int) -> dict[str, int]:
    """Axis positions of q/k/v/o in cuDNN's layouts (0: ``BTNH``, 1: ``BNTH``)."""
    return {"b": 0, "t": 2, "n": 1, "h": 3} if layout == 1 else {"b": 0, "t": 1, "n": 2, "h": 3}


def attention_keys(t: int, s: int, causal: bool, window: int | None) -> float:
    """Keys one query attends to on average (a causal kernel skips the masked half)."""
    if window:
        return float(min(window, s))
    if causal:
        return (s + 1) / 2 if t == s else max(1.0, s - t / 2)
    return float(s)


@register(*ATTENTION_FWD, *ATTENTION_BWD)
def _attention(b, eqn, ins, outs):
    """q ``[B, T, N, H]``, k and v ``[B, S, K, H]`` (K divides N: grouped-query attention), the
    output like q, the softmax statistics ``[B, N, T]``; the backward reads q, k, v, the
    statistics, the output and its cotangent and writes dq, dk, dv (and the bias's). Batch
    and heads split (cuDNN's partitioning rule allows no other), so k's heads are joined to
    q's by the cost model, not linked (sizes differ under GQA)."""
    p = eqn.params
    ax = attention_axes(int(p.get("layout", 0)))
    bwd = eqn.primitive.name in ATTENTION_BWD
    q, k, v = ins[:3]
    qs, ks = b.shape(q), b.shape(k)
    batch, t, n, h = (qs[ax[x]] for x in "btnh")
    s = ks[ax["t"]]
    like_q = [q, outs[0]] + ([ins[-2], ins[-1]] if bwd else [])  # o, do (bwd)
    like_k = [k, v] + (list(outs[1:3]) if bwd else [])
    stat = ins[-3] if bwd else (outs[1] if len(outs) > 1 else None)

    def stat_axis(a: int) -> list:  # the statistics [B, N, T], where the op has them
        return [(stat, a)] if stat is not None else []

    b.link(*[(x, ax["b"]) for x in like_q + like_k], *stat_axis(0))
    b.link(*[(x, ax["t"]) for x in like_q], *stat_axis(2))
    heads_q = [(x, ax["n"]) for x in like_q] + stat_axis(1)
    heads_k = [(x, ax["n"]) for x in like_k]
    if ks[ax["n"]] == n:  # multi-head: one heads dim; grouped-query: joined by the cost model
        b.link(*heads_q, *heads_k)
    else:
        b.link(*heads_q)
        b.link(*heads_k)
    b.link(*[(x, ax["t"]) for x in like_k])
    b.link(*[(x, ax["h"]) for x in like_q + like_k])
    splash = eqn.primitive.name in SPLASH_FWD + SPLASH_BWD
    causal = bool(p["is_causal"]) if splash else "CAUSAL" in str(p.get("mask_type", "")).upper()
    window = p.get("sliding_window_length")
    has_bias = bool(p.get("variadic_args", (False, False))[0])
    params = {
        "kernel": "splash" if splash else "cudnn",
        "phase": "bwd" if bwd else "fwd",
        "causal": causal,
        "window": int(window) if window else None,
        "bias": has_bias,
        "layout": int(p.get("layout", 0)),
    }
    flops = 4.0 * batch * n * t * attention_keys(t, s, causal, params["window"]) * h
    return params, flops * (ATTENTION_BWD_FLOPS if bwd else 1.0)


# --- Pallas kernels ---------------------------------------------------------------------------


@register("pallas_call")
def _pallas_call(b, eqn, ins, outs):
    """A Pallas kernel is priced from the ``cost_estimate`` its author gave (FLOPs, HBM bytes
    accessed); without one its work is unknown and it stays opaque. Its axes are linked to
    nothing: XLA cannot partition a custom call, so it runs whole on every device (split it
    with ``shard_map`` around the call; the cost model keeps it replicated)."""
    ce = eqn.params.get("cost_estimate")
    if ce is None:
        raise ValueError("a pallas_call without a cost_estimate: its work is unknown")
    params = {
        "kernel": str(eqn.params.get("name") or "pallas"),
        "bytes_accessed": float(ce.bytes_accessed),
        "transcendentals": float(ce.transcendentals),
    }
    return params, float(ce.flops)


# --- primitives kept whole on purpose -----------------------------------------------------------


class Opaque(Exception):  # noqa: N818 (an outcome, not a failure: the op is kept whole)
    """Raised by a policy rule: the equation is an opaque op on purpose; the message says
    why (``op.param("reason")``)."""


_POLICIES = {
    "a custom call XLA's SPMD partitioner cannot split: it gathers the operands and runs the "
    "call whole on every device (LAPACK/cuSOLVER on CPU/GPU, a user's FFI or callback, a "
    "cuDNN kernel without a partitioning rule)": (
        "cholesky cholesky_update eig eigh geqp3 geqrf hessenberg householder_product lu "
        "lu_pivots_to_permutation ormqr qr schur svd symmetric_product triangular_solve "
        "tridiagonal tridiagonal_solve ffi_call cudnn_fusion custom_partitioning pure_callback "
        "io_callback debug_callback debug_print inspect_sharding call_exported scaled_dot "
        "scaled_matmul scaled_matmul_wrapper dot_product_attention_fp8_fwd "
        "dot_product_attention_fp8_fwd_wrapper dot_product_attention_fp8_bwd "
        "dot_product_attention_fp8_bwd_wrapper custom_linear_solve linear_call noinline vprim "
        "tpu_custom_call mosaic_gpu_p"
    ),
    "an op of jax.experimental.sparse's formats (BCOO, BCSR, COO, CSR): no dim rule reads "
    "a sparse layout's indices yet, so it runs whole": (
        "bcoo_dot_general bcoo_dot_general_sampled bcoo_extract bcoo_fromdense "
        "bcoo_sort_indices bcoo_spdot_general bcoo_sum_duplicates bcoo_todense bcoo_transpose "
        "bcsr_dot_general bcsr_extract bcsr_fromdense bcsr_todense coo_fromdense coo_matmat "
        "coo_matvec coo_spmm coo_spmv coo_todense csr_fromdense csr_matmat csr_matvec csr_spmm "
        "csr_spmv csr_todense todense spsolve"
    ),
    "a conversion between a process's local arrays and global ones (multihost_utils): it "
    "runs outside a step": "global_array_to_host_local_array host_local_array_to_global_array",
    "a collective of a shard_map body: the user partitioned that code by hand, and the "
    "shard_map is kept whole (its inputs gathered to what it reads)": (
        "shard_map all_gather all_gather_done all_gather_invariant all_gather_reduced "
        "all_gather_reduced_start all_gather_start all_to_all all_to_all_done all_to_all_start "
        "axis_index pbroadcast pbroadcast_done pbroadcast_start pmax pmin ppermute "
        "ppermute_done ppermute_start precv psend preduced psum psum_done psum_invariant "
        "psum_invariant_start psum_start ragged_all_to_all reduce_scatter reduce_scatter_done "
        "reduce_scatter_start unreduced_psum unreduced_psum_start unreduced_reduce_scatter "
        "unreduced_reduce_scatter_start vary_unreduced_cast_p reduced_vary_cast_p mpmd_map"
    ),
    "a Pallas kernel's or a stateful body's own operation (refs, semaphores, program ids): "
    "it runs inside a pallas_call or run_state, which is priced whole": (
        "addupdate get swap broadcast_to masked_load masked_swap multiple_of num_programs "
        "program_id reciprocal run_scoped semaphore_read semaphore_signal semaphore_wait delay "
        "get_global jaxpr_call with_memory_space_constraint pin unpin create_linear "
        "accum_grad_in_ref empty_ref free_ref new_ref freeze run_state core_map maybe_set "
        "new_variable get_variable set_variable add_dependency bitcast dma_start dma_wait "
        "einshape_lo emit_pipeline get_barrier_semaphore matmul_acc_lhs matmul_pop "
        "matmul_push_rhs pack_elementwise pipeline_body prng_join prng_random_bits prng_seed "
        "prng_split remove_memory_space roll stochastic_round trace_value unpack_elementwise "
        # Mosaic GPU's (jax.experimental.pallas.mosaic_gpu, imported by Pallas' interpreter)
        "_copysign async_copy_scales_to_tmem async_copy_smem_to_tmem "
        "async_copy_sparse_metadata_to_tmem async_load async_prefetch async_store_smem "
        "async_store_tmem barrier_arrive barrier_test barrier_wait commit_group commit_smem "
        "commit_tmem copy_gmem_to_smem copy_smem_to_gmem griddepcontrol_launch_dependents "
        "griddepcontrol_wait inline_mgpu_p layout_cast load mgpu_atomic_store "
        "multimem_load_reduce multimem_store print_layout query_cluster_cancel "
        "semaphore_signal_multicast semaphore_signal_parallel set_max_registers_p "
        "tcgen05_commit_arrive tcgen05_mma try_cluster_cancel wait_load_tmem wait_smem_to_gmem "
        "wgmma wgmma_accumulator_deref_p wgmma_accumulator_store_p wgmma_ref wgmma_wait"
    ),
    "a transformation's internal: JAX removes it before make_jaxpr returns a step (autodiff's "
    "linearization, checkify's checks, hijax boxes, symbolic shapes of jax.export)": (
        "custom_lin custom_jvp_call_jaxpr remat_opt unreachable stage check box_get box_set "
        "new_box new_log log_extend log_read call_hi_primitive call_hi_primitive_linearized "
        "eval_jaxpr dim_as_value dimension_size shape_assertion eq_to le_to lt_to"
    ),
}
POLICY: dict[str, str] = {n: why for why, names in _POLICIES.items() for n in names.split()}
"""Primitives with no dim rule, and why: each is an opaque op that runs whole on every
device, as XLA's SPMD partitioner runs it."""


def _policy(b, eqn, ins, outs):
    raise Opaque(POLICY[eqn.primitive.name])


for _name in POLICY:
    DIM_RULES.setdefault(_name, _policy)
