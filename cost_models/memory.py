"""Memory per device: the peak of a liveness walk over the traced step.

Inputs (parameters, optimizer state, the batch) are resident for the whole step at their
split sizes. Every other tensor lives from the op that writes it to the last op that reads
it, in program order; the tensors a ``scan`` body writes live for one iteration, its stacked
outputs (the forward pass's saved activations) until the backward scan reads them. Remat
shows up by itself: the traced step saves only what the checkpoint policy keeps and
recomputes the rest inside the backward pass. A step output that takes the place of a
donated input (the new parameters) reuses its buffer and adds nothing.

This is a lower bound on what XLA allocates (it also keeps fusion temporaries and may
schedule differently); ``al.validate`` prints XLA's ``memory_analysis()`` beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from autolayout._ir import Graph


@dataclass(frozen=True, slots=True)
class MemoryUse:
    peak_bytes: int
    by_category: dict[str, int]  # resident inputs by argument name, plus "activations"
    peak_op: str | None  # the op at which the peak is reached


def _category(path: str | None) -> str:
    return path.split("/", 1)[0] if path else "inputs"


def liveness_peak(
    g: Graph,
    nbytes: Callable[[str], int],
    donated: Sequence[str] = (),
    copies: Sequence[tuple[int, int, int]] = (),
) -> MemoryUse:
    """Peak bytes per device; ``nbytes(tensor)`` is a tensor's local size, ``donated`` the
    input tensors whose buffers the step's outputs may reuse, ``copies`` extra buffers as
    ``(first op index, last op index, bytes)`` (a tensor resharded for its readers: FSDP's
    gathered weights live from the first reader to the last)."""
    resident: dict[str, int] = {}
    for t in g.inputs:
        c = _category(g.tensors[t].path)
        resident[c] = resident.get(c, 0) + nbytes(t)
    free_slots: dict[tuple, int] = {}
    for t in donated:
        tt = g.tensors[t]
        key = (tt.shape, tt.dtype)
        free_slots[key] = free_slots.get(key, 0) + 1
    aliased: set[str] = set()
    for o in g.outputs:
        tt = g.tensors[o]
        key = (tt.shape, tt.dtype)
        if tt.role != "input" and free_slots.get(key, 0) > 0:
            free_slots[key] -= 1
            aliased.add(o)
    last: dict[str, int] = {}
    for i, op in enumerate(g.ops):
        for t in op.inputs:
            last[t] = i
    end = len(g.ops)
    for o in g.outputs:
        last[o] = end
    inputs = set(g.inputs)
    live = 0
    peak, peak_op = 0, None
    dying: dict[int, int] = {}
    born: dict[int, int] = {}
    for first, last_i, b in copies:
        born[first] = born.get(first, 0) + b
        dying[last_i] = dying.get(last_i, 0) + b
    for i, op in enumerate(g.ops):
        live += born.pop(i, 0)
        for t in op.outputs:
            if t in inputs or t in aliased or g.tensors[t].role == "input":
                continue
            b = nbytes(t)
            live += b
            at = last.get(t, i)  # never read: freed right after
            dying[at] = dying.get(at, 0) + b
        if live > peak:
            peak, peak_op = live, op.name
        live -= dying.pop(i, 0)
    total = sum(resident.values())
    return MemoryUse(total + peak, {**resident, "activations": peak}, peak_op)
