"""The layouts people write by hand, built from a workload's dim names.

* ``dp``: data parallel, the batch split over every device, weights replicated.
* ``fsdp``: FSDP / ZeRO-3: the batch and every weight split over one axis; weights are
  all-gathered before use and their gradients reduce-scattered.
* ``megatron``: Megatron-LM tensor parallelism over every device: attention heads, the MLP's
  ``d_ff`` and the vocabulary split; two all-reduces per layer forward and backward.
* ``2d``: Megatron tensor parallelism on a ``tensor`` axis, data parallelism on ``data``.
* ``megatron_fsdp``: Megatron on ``tensor``, FSDP on ``fsdp``.
* ``megatron_sp``: Megatron+FSDP with Megatron-LM's sequence parallelism (Korthikanti et al.
  2022): the tokens' sequence dims also split on ``tensor``, so the ops outside attention and
  the MLP (norms, residuals, the activations saved for the backward pass) are split over
  every device instead of repeated on the tensor axis. Only where the batch holds token ids.
* ``spatial``: spatial partitioning (Mesh-TF; Hou et al. 2019), only where the step has
  convolutions: the volume's spatial dims split over up to three mesh axes named after them,
  halos exchanged with the neighbours around every conv.

Tensor-parallel dims are ``heads``, ``d_ff`` and ``vocab`` where the workload has them (the
names of ``experiments/models``, and the names the tracer gives an unnamed model by role),
with ``kv_heads`` where the tensor axis divides them; elsewhere the parameter dim that holds
the most bytes. The
FSDP dim is ``d_model``, else every parameter dim in order of the bytes it holds (each weight
takes the first that divides). Each layout is ``(mesh, rules)`` for ``al.evaluate``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autolayout.core import Graph, RuleError, base_name, model_named
from autolayout.cost_models import conv_spatial

NAMES = ("dp", "fsdp", "megatron", "2d", "megatron_fsdp", "megatron_sp", "spatial")
TP_DIMS = ("heads", "d_ff", "vocab")


def _param_dims(g: Graph, batch: str, devices: int = 1) -> list[str]:
    """Dims of the parameters that ``devices`` divides, most bytes first (the batch and
    stacked-layer dims left out)."""
    by: dict[str, int] = {}
    for t in g.inputs:
        tt = g.tensors[t]
        if not (tt.path or "").startswith("params"):
            continue
        for d in tt.dims:
            if (d is not None and base_name(d) not in (batch, "layers") and d != batch
                    and g.dims[d] % devices == 0):  # fmt: skip
                by[d] = by.get(d, 0) + tt.nbytes
    return sorted(by, key=lambda d: (-by[d], d))


def batch_dim(g: Graph) -> str:
    """The name a rule gives the batch inputs' leading axis (``batch`` in the example models):
    where that name has several sizes, the name of them all (an accumulated step's whole
    batch is ``batch(256)``, each microbatch's rows ``batch(128)``: a rule for the first alone
    left every microbatch whole, so its hand layouts ran replicated, 668 s a step where FSDP
    over the rows takes 14.8 s)."""
    if "batch" in g.dims or g.named("batch"):
        return "batch"
    for t in g.inputs:
        tt = g.tensors[t]
        if (tt.path or "").startswith("batch") and tt.dims and tt.dims[0]:
            d = tt.dims[0]
            return base_name(d) if len(g.named(base_name(d))) > 1 else d
    raise RuleError(f"workload {g.name!r}: no batch dim (name one 'batch' with al.spec)")


def divides(g: Graph, name: str, n: int) -> bool:
    """Whether ``n`` divides every dim a rule for ``name`` lays out."""
    return all(g.dims[d] % n == 0 for d in g.named(name) or (name,))


def _with_kv(g: Graph, tp: list[str], model: int, model_dims: Sequence[str] | None) -> list[str]:
    """``tp`` and, with grouped-query attention, ``kv_heads`` where the model axis divides
    them (Megatron-LM splits the query groups; where they are fewer than the model axis, as
    in MaxText, the kv heads stay whole)."""
    if model_dims is None and "kv_heads" in g.dims and g.dims["kv_heads"] % model == 0:
        if "heads" in tp and "kv_heads" not in tp:
            return [*tp, "kv_heads"]
    return tp


def tp_dims(g: Graph, model_dims: Sequence[str] | None = None, devices: int = 1) -> list[str]:
    if model_dims is not None:
        return list(model_dims)
    named = [d for d in TP_DIMS if d in g.dims]
    try:
        batch = batch_dim(g)
    except RuleError:  # batch 1
        batch = ""
    return named or _param_dims(g, batch, devices)[:1]


def seq_dims(g: Graph) -> list[str]:
    """The sequence dims of the token inputs: axis 1 of each rank-2 integer batch input
    (``seq``; T5's ``enc_seq`` and ``dec_seq``). Empty where the batch holds no tokens."""
    out: list[str] = []
    for t in g.inputs:
        tt = g.tensors[t]
        if (tt.path or "").startswith("batch") and len(tt.shape) == 2 and "int" in tt.dtype:
            d = tt.dims[1]
            if d is not None and g.dims.get(d, 1) > 1 and d not in out:
                out.append(d)
    return out


def spatial_dims(g: Graph) -> list[list[str]]:
    """Per spatial position of the convs (depth, height, width of ``NDHWC``), the named dims
    their inputs and outputs carry there where the conv can be split with a halo exchange.
    Empty when the step has no such conv."""

    slots: list[list[str]] = []
    for op in g.ops:
        if op.primitive != "conv_general_dilated":
            continue
        for i, (s, form) in enumerate(conv_spatial(op)):
            if form != "forward":
                continue
            while len(slots) <= i:
                slots.append([])
            for t, a in ((op.inputs[0], s["lhs"]), (op.outputs[0], s["out"])):
                d = g.tensors[t].dims[a]
                if model_named(d) and d not in slots[i]:
                    slots[i].append(d)
    return [sl for sl in slots if sl]


def _spatial_mesh(g: Graph, slots: list[list[str]], devices: int) -> dict[str, int] | None:
    """``devices`` factored over the spatial slots as evenly as each slot's dims divide."""
    sizes = [1] * len(slots)
    n, primes, p = devices, [], 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    for p in sorted(primes, reverse=True):
        ok = [i for i, sl in enumerate(slots) if all(g.dims[d] % (sizes[i] * p) == 0 for d in sl)]
        if not ok:
            return None
        i = min(ok, key=lambda i: sizes[i])
        sizes[i] *= p
    return {base_name(slots[i][0]): k for i, k in enumerate(sizes) if k > 1}  # depth, not depth(32)


def _split(n: int, sizes: Sequence[int]) -> int:
    """The largest divisor of ``n`` that divides every size (the model axis of a 2-D mesh),
    at most ``sqrt(n)`` rounded up to a divisor so that the data axis keeps its share."""
    best = 1
    for m in range(1, n + 1):
        if n % m == 0 and all(s % m == 0 for s in sizes) and m * m <= n * 2:
            best = m
    return best


def standard_layout(
    g: Graph, name: str, devices: int, *, model_dims: Sequence[str] | None = None
) -> tuple[dict[str, int], list[tuple[str, tuple[str, ...]]]]:
    """``(mesh, rules)`` of one hand-written layout for ``devices`` devices.

    Example:
      >>> import autolayout as al
      >>> g = al.trace(al.load_workload("experiments/models/gpt.py"))
      >>> standard_layout(g, "2d", 8)
      ({'data': 2, 'tensor': 4}, [('batch', ('data',)), ('heads', ('tensor',)), ('d_ff', ('tensor',)), ('vocab', ('tensor',))])
    """
    if name not in NAMES:
        raise RuleError(f"unknown standard layout {name!r}; known: {', '.join(NAMES)}")
    if name == "spatial":
        slots = spatial_dims(g)
        mesh = _spatial_mesh(g, slots, devices) if slots else None
        if mesh is None:
            raise RuleError(
                f"workload {g.name!r}: no convolution whose spatial dims {devices} devices "
                "can split (spatial partitioning needs one)"
            )
        axis = [base_name(sl[0]) for sl in slots]
        return mesh, [(d, (a,)) for sl, a in zip(slots, axis, strict=True) if a in mesh for d in sl]
    if name == "megatron":  # needs no batch dim
        tp = _with_kv(g, tp_dims(g, model_dims, devices), devices, model_dims)
        return {"tensor": devices}, [(d, ("tensor",)) for d in tp]
    batch = batch_dim(g)
    tp = tp_dims(g, model_dims, devices)
    fsdp = ["d_model"] if "d_model" in g.dims else _param_dims(g, batch, devices)
    if name == "dp":
        return {"data": devices}, [(batch, ("data",))]
    if name == "fsdp":
        return {"fsdp": devices}, [(batch, ("fsdp",))] + [(d, ("fsdp",)) for d in fsdp]
    m = _split(devices, [g.dims[d] for d in tp])
    tp = _with_kv(g, tp, m, model_dims)
    if name == "2d":
        return {"data": devices // m, "tensor": m}, [(batch, ("data",))] + [
            (d, ("tensor",)) for d in tp
        ]
    seq = seq_dims(g) if name == "megatron_sp" else []
    if name == "megatron_sp" and not seq:
        raise RuleError(f"workload {g.name!r}: no token sequence dim (sequence parallelism)")
    rules = [(batch, ("fsdp",))] + [(d, ("tensor",)) for d in tp]
    rules += [(d, ("fsdp",)) for d in fsdp if d not in seq]  # SP keeps the sequence
    rules += [(d, ("tensor",)) for d in seq]
    return {"fsdp": devices // m, "tensor": m}, first_rule_per_dim(rules)


def first_rule_per_dim(rules: list) -> list:
    """One rule per dim, the first kept: the batch, then tensor parallelism, then FSDP's
    weight dims, then sequence parallelism (whose ``seq`` FSDP leaves alone where a position
    table carries it; two rules for one dim used to fail the whole plan)."""
    seen: set[str] = set()
    out = []
    for d, axes in rules:
        if d not in seen:
            seen.add(d)
            out.append((d, axes))
    return out


def standard_layouts(g: Graph, devices: int, **kw) -> dict[str, tuple[dict[str, int], list]]:
    """Every standard layout that the workload's dims divide on ``devices`` devices."""
    return layouts_and_misses(g, devices, **kw)[0]


def layouts_and_misses(
    g: Graph, devices: int, **kw
) -> tuple[dict[str, tuple[dict[str, int], list]], dict[str, str]]:
    """``standard_layouts``, and why each of the others is not there."""
    out, missed = {}, {}
    for name in NAMES:
        try:
            mesh, rules = standard_layout(g, name, devices, **kw)
        except RuleError as e:  # no batch dim (batch 1), no conv to split spatially
            missed[name] = str(e)
            continue
        bad = [(d, axes) for d, axes in rules if g.dims[d] % math.prod(mesh[a] for a in axes)]
        if bad:
            d, axes = bad[0]
            n = math.prod(mesh[a] for a in axes)
            missed[name] = f"dim {d!r} ({g.dims[d]}) does not divide over {'x'.join(axes)} = {n}"
        else:
            out[name] = (mesh, rules)
    return out, missed


def layouts_on(g: Graph, mesh: dict[str, int]) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    """The standard layouts as rules on any mesh: DP and FSDP over every axis, Megatron over
    every axis, and (with two or more axes) 2-D, Megatron+FSDP and (where the batch holds
    tokens) Megatron+FSDP+SP with the last axis as the model axis and the others as data;
    spatial partitioning with each spatial position on one axis, in order. Without a batch
    dim (batch 1) only Megatron and spatial. Rules the dims do not divide are left out."""
    axes = tuple(mesh)
    cands: dict[str, list] = {}
    slots = spatial_dims(g)
    if slots:  # each spatial position on one mesh axis, in order
        cands["spatial"] = [(d, (a,)) for sl, a in zip(slots, axes, strict=False) for d in sl]
    try:
        batch = batch_dim(g)
    except RuleError:  # batch 1: only the layouts that do not split the batch
        n = math.prod(mesh.values())
        tp = _with_kv(g, tp_dims(g, None, mesh[axes[-1]]), n, None)
        cands["megatron"] = [(d, axes) for d in tp]
        return _dividing(g, mesh, cands)
    n = math.prod(mesh.values())
    tp = tp_dims(g, None, mesh[axes[-1]])
    fsdp = ["d_model"] if "d_model" in g.dims else _param_dims(g, batch, n)
    cands.update({
        "dp": [(batch, axes)],
        "fsdp": [(batch, axes)] + [(d, axes) for d in fsdp],
        "megatron": [(d, axes) for d in _with_kv(g, tp, n, None)],
    })  # fmt: skip
    if len(axes) > 1:
        data, model = axes[:-1], axes[-1:]
        tp = _with_kv(g, tp, mesh[axes[-1]], None)
        cands["2d"] = [(batch, data)] + [(d, model) for d in tp]
        head = [(batch, data)] + [(d, model) for d in tp]
        cands["megatron_fsdp"] = head + [(d, data) for d in fsdp]
        seq = seq_dims(g)
        if seq:  # SP keeps the sequence on the model axis, FSDP the rest
            cands["megatron_sp"] = (
                head + [(d, data) for d in fsdp if d not in seq] + [(d, model) for d in seq]
            )
    cands = {k: first_rule_per_dim(v) for k, v in cands.items()}
    return _dividing(g, mesh, cands)


def _dividing(g: Graph, mesh: dict[str, int], cands: dict[str, list]) -> dict[str, list]:
    """Each candidate's rules that the dims divide; candidates left with none are dropped."""
    out = {}
    for name, rules in cands.items():
        ok = [(d, a) for d, a in rules if divides(g, d, math.prod(mesh[x] for x in a))]
        if ok:
            out[name] = ok
    return out
