"""A pipeline's raw material: the stack of layers a scan runs over, and one stage's step.

Mesh-TF's idea applied to depth: a pipeline is the stacked layer dim of a scanned model split
over a ``stage`` mesh axis, ``{"layers": "stage"}``, with the batch cut into microbatches.
:func:`find_stack` finds the dim (the leading axis of the weights a top-level ``scan`` iterates
over, read by the forward scan and its transpose); :func:`stage_workload` is the step one
stage runs for one microbatch: the same function over arguments whose layer dim is divided by
the stages and whose batch dim by the microbatches, which the planner prices like any step.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from ._errors import PlanError
from ._ir import Graph
from ._workload import Workload, spec


@dataclass(frozen=True)
class Stack:
    """The layer stack of a scanned model: ``dim`` (its name) of ``length`` layers, the
    top-level scans that run over it (forward, and the backward's transpose), and the dim
    microbatches cut (``batch``)."""

    dim: str
    length: int
    loops: tuple[str, ...]
    batch: str


def scan_parts(op) -> tuple[list[str], list[str], list[str]]:
    """A scan op's inputs as (consts, carries, xs). An operand that is a literal is no input
    of the op, so the consts are the leading inputs the tracer recorded as consts."""
    consts = set(op.param("aliased_inputs", ()))
    ins = list(op.inputs)
    nc = 0
    while nc < len(ins) and ins[nc] in consts:
        nc += 1
    nk = op.param("num_carry", 0)
    return ins[:nc], ins[nc : nc + nk], ins[nc + nk :]


def find_stack(g: Graph) -> Stack | str:
    """The model's layer stack, or one line saying why it has none a pipeline can split."""
    batch = "batch" if "batch" in g.dims else None
    by_dim: dict[str, list] = {}
    for op in g.ops:
        if op.primitive != "scan" or op.scope:
            continue
        xs = scan_parts(op)[2]
        weights = [t for t in xs if g.tensors[t].role == "input" and g.tensors[t].dims]
        if not weights:
            continue
        d = g.tensors[weights[0]].dims[0]
        if d is not None and g.dims.get(d) == op.param("length"):
            by_dim.setdefault(d, []).append(op)
    if not by_dim:
        return (
            f"{g.name}: no scan over stacked weights (pipelining splits a scanned layer stack; "
            "stack the layers with jax.lax.scan, e.g. --set scan=true on the example models)"
        )
    if batch is None:
        return f"{g.name}: no dim named 'batch' to cut into microbatches"
    dim, ops = max(by_dim.items(), key=lambda kv: g.dims[kv[0]])
    for op in ops:
        flat = [t for t in scan_parts(op)[1] if batch not in g.tensors[t].dims]
        if flat:
            return (
                f"{g.name}: the scan {op.name} carries {flat[0]} "
                f"{g.tensors[flat[0]].shape}, which has no batch dim (a pipeline passes only "
                "per-example state from stage to stage)"
            )
    return Stack(dim, g.dims[dim], tuple(op.name for op in ops), batch)


def stage_workload(
    wl: Workload, g: Graph, stack: Stack, stages: int, microbatches: int
) -> Workload:
    """The step one stage runs on one microbatch: ``wl`` with the stack's layers divided by
    ``stages`` and the batch by ``microbatches`` (every argument dim of those names)."""
    length, batch = g.dims[stack.dim], g.dims[stack.batch]
    if length % stages or batch % microbatches:
        raise PlanError(
            f"{stages} stages x {microbatches} microbatches do not divide {length} "
            f"{stack.dim} and a batch of {batch}"
        )
    leaves, tree = jax.tree_util.tree_flatten(wl.args)
    if len(leaves) != len(g.inputs):
        raise PlanError(f"{g.name}: the traced step has other inputs than the workload's arguments")
    new = []
    for leaf, t in zip(leaves, g.inputs, strict=True):
        tt = g.tensors[t]
        shape = [
            n // stages if d == stack.dim else n // microbatches if d == stack.batch else n
            for n, d in zip(tt.shape, tt.dims, strict=True)
        ]
        new.append(spec(tuple(shape), tt.dims, leaf.dtype))
    name = f"{wl.name or g.name} (one stage: {length // stages} {stack.dim}, batch {batch // microbatches})"
    return Workload(
        wl.fn, jax.tree_util.tree_unflatten(tree, new), donate_argnums=wl.donate_argnums,
        name=name, options=dict(wl.options),
    )  # fmt: skip
