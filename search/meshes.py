"""Mesh shapes a planner tries: the ordered factorisations of the device count into 1-3
axes that tile the hardware (``place_mesh`` accepts them: each axis covers whole torus dims,
or a divisor of one, or whole GPU nodes, or a divisor of a node)."""

from __future__ import annotations

from autolayout.core import Hardware, MeshError
from autolayout.cost_models import place_mesh

AXIS_NAMES = ("a", "b", "c")


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


def factorisations(n: int, max_axes: int = 3) -> list[tuple[int, ...]]:
    """Ordered factorisations of ``n`` into 1..``max_axes`` factors, each at least 2.

    >>> factorisations(12, 2)
    [(12,), (2, 6), (3, 4), (4, 3), (6, 2)]
    """
    out: list[tuple[int, ...]] = []
    partial: list[tuple[int, tuple[int, ...]]] = [(n, ())]  # (what is left, factors so far)
    while partial:
        rest, cur = partial.pop()
        if rest == 1:
            if cur:
                out.append(cur)
        elif len(cur) < max_axes:
            partial += [(rest // d, cur + (d,)) for d in _divisors(rest)]
    return sorted(out, key=lambda s: (len(s), s))


def mesh_shapes(hw: Hardware, max_axes: int = 3) -> list[dict[str, int]]:
    """Every mesh shape of ``hw`` with generic axis names ``a``, ``b``, ``c`` (the planner
    names them after what they split)."""
    if hw.num_devices == 1:
        return [{"a": 1}]
    out = []
    for shape in factorisations(hw.num_devices, max_axes):
        mesh = dict(zip(AXIS_NAMES, shape, strict=False))
        try:
            place_mesh(hw, mesh)
        except MeshError:
            continue
        out.append(mesh)
    return out
