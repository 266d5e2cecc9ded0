"""Layout rules (Mesh-TF): dim names to mesh axes, applied to every tensor of a step.

Rules map dim names to mesh axes and apply to every tensor of the step, Mesh-TF style: an
axis of a tensor is split over its dim's mesh axes unless an earlier rule already took one
of them for another axis of that tensor (the order of the rules is their priority). Each op
splits its groups the same way, so where a tensor's layout and the layout its consumer
splits it in differ (FSDP: weights stored split on ``d_model``, read whole because the batch
took the axis), the consumer pays the resharding. A dim merged by a reshape (``batch*seq``)
follows the rule of its leading part. Dims without a rule stay whole.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from autolayout.core import Graph, Hardware, MeshError, RuleError, Tensor, model_named

from .collectives import place_mesh

RuleSpec = Mapping[str, Any] | Sequence[tuple[str, Any]]


def _close(name: str, known: Sequence[str]) -> str:
    m = difflib.get_close_matches(name, list(known), n=3)
    return f" (did you mean {', '.join(repr(x) for x in m)}?)" if m else ""


def normalize_rules(rules: RuleSpec | None) -> list[tuple[str, tuple[str, ...]]]:
    """``{"batch": "data", "heads": ("model",)}`` -> ``[("batch", ("data",)), ...]``."""
    if rules is None:
        return []
    items = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    out = []
    for item in items:
        try:
            dim, axes = item
        except (TypeError, ValueError):
            raise RuleError(f"a rule is a (dim, mesh axes) pair, got {item!r}") from None
        if axes is None:
            axes = ()
        elif isinstance(axes, str):
            axes = (axes,)
        axes = tuple(axes)
        if not isinstance(dim, str) or not all(isinstance(a, str) for a in axes):
            raise RuleError(f"rule {item!r}: dims and mesh axes are names (strings)")
        if len(set(axes)) != len(axes):
            raise RuleError(f"rule {dim!r} -> {axes}: names a mesh axis twice")
        out.append((dim, axes))
    dims = [d for d, _ in out]
    dup = sorted({d for d in dims if dims.count(d) > 1})
    if dup:
        raise RuleError(f"two rules for dim {dup[0]!r}; give one per dim")
    return out


def check_mesh(hw: Hardware, mesh: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(mesh, Mapping) or not mesh:
        raise MeshError(f"mesh must be a dict of axis name -> size, got {mesh!r}")
    out = {}
    for k, v in mesh.items():
        if not isinstance(k, str) or not k:
            raise MeshError(f"mesh axis names must be non-empty strings, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MeshError(f"mesh axis {k!r} must have a positive integer size, got {v!r}")
        out[k] = v
    place_mesh(hw, out)  # the device count, and each axis against the topology
    return out


def _carried(g: Graph) -> dict[str, Tensor]:
    """The dims a rule may name, each with a tensor that carries it: the inputs' dims and
    the dims the model named inside the step (``al.name_dims``). Cached on the graph (the
    search builds hundreds of rule sets over one 36k-tensor graph)."""
    return g.derived("carried", lambda: _find_carried(g))


def _find_carried(g: Graph) -> dict[str, Tensor]:
    carried: dict[str, Tensor] = {}
    for t in g.inputs:
        for d in g.tensors[t].dims:
            if d is not None:
                carried.setdefault(d, g.tensors[t])
    for t in g.tensors.values():  # dims the model named inside the step (al.name_dims)
        for d in t.dims:
            if model_named(d):
                carried.setdefault(d, t)
    return carried


def _each_size(g: Graph, rules, mesh: Mapping[str, int]):
    """The rules over the graph's dims: a rule for a name the user gave axes of several sizes
    (Mesh-TF: ``kd`` of 3 and of 2 are two dims, ``kd(3)`` and ``kd(2)``) is a rule for each
    size not named in a rule of its own, at the rule's priority. Refused in one line where
    its mesh axes do not divide every such size (name the size to split only some)."""
    named = {d for d, _ in rules}
    out: list[tuple[int, str, tuple[str, ...]]] = []
    for k, (dim, axes) in enumerate(rules):
        sized = () if dim in g.dims else g.named(dim)
        if not sized:
            out.append((k, dim, axes))
            continue
        sized = [d for d in sized if d not in named]
        n = math.prod(mesh.get(a, 1) for a in axes)
        bad = [d for d in sized if g.dims[d] % n]
        if bad:
            good = [d for d in sized if d not in bad]
            hint = f"; a rule for {good[0]!r} splits that size alone" if good else ""
            raise RuleError(
                f"rule {dim!r} -> {'x'.join(axes)}: {dim!r} has sizes "
                f"{', '.join(str(g.dims[d]) for d in sized)} ({', '.join(sized)}), and "
                f"{'x'.join(axes)} = {n} does not divide {', '.join(str(g.dims[d]) for d in bad)}"
                f"{hint}"
            )
        out.extend((k, d, axes) for d in sized)
    return out


class RuleSet:
    """Resolved rules: each dim's mesh axes and priority, checked against a graph and mesh."""

    def __init__(self, g: Graph, mesh: Mapping[str, int], rules: RuleSpec | None) -> None:
        self.rules = normalize_rules(rules)
        self.mesh = dict(mesh)
        carried = _carried(g)
        self.axes: dict[str, tuple[str, ...]] = {}
        self.priority: dict[str, int] = {}
        for k, dim, axes in _each_size(g, self.rules, self.mesh):
            if dim not in carried:
                where = (
                    "no input carries it and it is an inferred name (al.name_dims names one)"
                    if dim in g.dims
                    else "the workload has no such dim"
                )
                raise RuleError(
                    f"rule {dim!r} -> {'x'.join(axes) or '()'}: {where}{_close(dim, list(carried))}"
                )
            for a in axes:
                if a not in self.mesh:
                    raise RuleError(
                        f"rule {dim!r} -> {a!r}: the mesh has no axis {a!r} "
                        f"(axes: {', '.join(self.mesh)})"
                    )
            n = math.prod(self.mesh[a] for a in axes)
            size = g.dims[dim]
            if size % n:
                t = carried[dim]
                raise RuleError(
                    f"rule {dim!r} -> {'x'.join(axes)}: {t.path or t.name} has {dim!r} of size "
                    f"{size}, which {'x'.join(axes)} = {n} does not divide"
                )
            self.axes[dim] = axes
            self.priority[dim] = k
        for dim, size in g.dims.items():  # a reshape's merged dim follows its leading part
            if dim not in self.axes and "*" in dim:
                lead = dim.split("*", 1)[0]
                if (
                    lead in self.axes
                    and size % math.prod(self.mesh[a] for a in self.axes[lead]) == 0
                ):
                    self.axes[dim] = self.axes[lead]
                    self.priority[dim] = self.priority[lead]

    def layout(self, t: Tensor) -> tuple[tuple[str, ...], ...]:
        """The tensor's layout: each axis its dim's mesh axes, earlier rules first."""
        out: list[tuple[str, ...]] = [()] * len(t.shape)
        used: set[str] = set()
        order = sorted(
            (self.priority[d], i) for i, d in enumerate(t.dims) if d is not None and d in self.axes
        )
        for _, i in order:
            axes = self.axes[t.dims[i]]
            if (
                axes
                and used.isdisjoint(axes)
                and t.shape[i] % math.prod(self.mesh[a] for a in axes) == 0
            ):
                out[i] = axes
                used.update(axes)
        return tuple(out)

    def assign(self, g: Graph, groups) -> list[tuple[str, ...]]:
        """Mesh axes of each op group, by the same priority; fixed groups stay whole."""
        out: list[tuple[str, ...]] = [()] * len(groups)
        used: set[str] = set()
        order = sorted(
            (self.priority[grp.dim], k)
            for k, grp in enumerate(groups)
            if grp.kind != "fixed" and grp.dim in self.axes
        )
        for _, k in order:
            grp = groups[k]
            axes = self.axes[grp.dim]
            n = math.prod(self.mesh[a] for a in axes)
            sizes = [g.tensors[t].shape[a] for t, a in grp.members]
            if axes and used.isdisjoint(axes) and all(s % n == 0 for s in sizes):
                out[k] = axes
                used.update(axes)
        return out
