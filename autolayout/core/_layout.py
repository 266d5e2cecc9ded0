"""Layouts: which mesh axes split each axis of a tensor, and what a device then holds."""

from __future__ import annotations

import math

from jax.sharding import PartitionSpec

from ._errors import LayoutError
from ._ir import Tensor

Layout = tuple[tuple[str, ...], ...]


def replicated(rank: int) -> Layout:
    return ((),) * rank


def split_factor(axes: tuple[str, ...], mesh: dict[str, int]) -> int:
    if not axes:
        return 1
    if len(axes) == 1:
        return mesh[axes[0]]
    return math.prod(mesh[a] for a in axes)


def local_shape(shape: tuple[int, ...], layout: Layout, mesh: dict[str, int]) -> tuple[int, ...]:
    return tuple(s // split_factor(ax, mesh) for s, ax in zip(shape, layout, strict=True))


def local_bytes(t: Tensor, layout: Layout, mesh: dict[str, int]) -> int:
    return t.nbytes // math.prod(split_factor(ax, mesh) for ax in layout)


def check_layout(t: Tensor, layout: Layout, mesh: dict[str, int]) -> None:
    """Raises :class:`LayoutError` naming the tensor, dim and axis a layout cannot split."""
    seen: set[str] = set()
    label = t.path or t.name
    for axis, (size, axes) in enumerate(zip(t.shape, layout, strict=True)):
        for a in axes:
            if a not in mesh:
                raise LayoutError(f"{label}: unknown mesh axis {a!r} (mesh has {', '.join(mesh)})")
            if a in seen:
                raise LayoutError(f"{label}: mesh axis {a!r} splits two of its axes")
            seen.add(a)
        n = split_factor(axes, mesh)
        if size % n:
            dim = t.dims[axis] or f"axis {axis}"
            raise LayoutError(
                f"{label}: dim {dim!r} of size {size} does not divide over mesh axes "
                f"{'x'.join(axes)} = {n}"
            )


def mesh_text(mesh: dict[str, int]) -> str:
    """``{"data": 16, "model": 8}`` -> ``"data=16 x model=8"``."""
    return " x ".join(f"{k}={v}" for k, v in mesh.items())


def mfu_text(mfu: float) -> str:
    """An MFU as a report prints it: three decimals, or two significant digits below 0.01
    (a tiny model on 8 GPUs read ``MFU 0.000``, as if nothing ran)."""
    return f"{mfu:.3f}" if not 0 < abs(mfu) < 0.01 else f"{mfu:.2g}"


def partition_spec(layout: Layout) -> PartitionSpec:
    """The ``jax.sharding.PartitionSpec`` of a layout."""
    return PartitionSpec(*[None if not a else (a[0] if len(a) == 1 else tuple(a)) for a in layout])
