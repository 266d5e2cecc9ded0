"""Layout rules (Mesh-TF): dim names to mesh axes, applied to every tensor of a step.

Rules map dim names to mesh axes and apply to every tensor of the step, Mesh-TF style: an
axis of a tensor is split over its dim's mesh axes unless an earlier rule already took one
of them for another axis of that tensor (the order of the rules is their priority). A dim
may have several rules: a later one is its fallback where an earlier rule took the first
one's axes (Flax's ``logical_axis_rules``: ``d_model -> fsdpxexpert`` for the dense weights,
then ``d_model -> fsdp`` for the experts' weights, whose ``experts`` took ``expert``). Each op
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
    seen: set[tuple[str, tuple[str, ...]]] = set()  # a dim may repeat (its fallbacks)
    for dim, axes in out:
        if (dim, axes) in seen:
            raise RuleError(f"rule {dim!r} -> {'x'.join(axes) or '()'} is given twice")
        seen.add((dim, axes))
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
        self.axes: dict[str, tuple[str, ...]] = {}  # each dim's first rule
        self.options: dict[str, list[tuple[int, tuple[str, ...]]]] = {}  # its rules, in order
        self._picked: dict[tuple, dict[int, tuple[str, ...]]] = {}  # _pick's answers
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
            self.axes.setdefault(dim, axes)
            self.options.setdefault(dim, []).append((k, axes))
        for dim, size in g.dims.items():  # a reshape's merged dim follows its leading part
            if dim not in self.axes and "*" in dim:
                lead = dim.split("*", 1)[0]
                opts = [
                    (k, axes) for k, axes in self.options.get(lead, ())
                    if size % math.prod(self.mesh[a] for a in axes) == 0
                ]  # fmt: skip
                if opts:
                    self.axes[dim] = opts[0][1]
                    self.options[dim] = opts

    def _pick(self, items) -> dict[int, tuple[str, ...]]:
        """``items``: (dim, sizes) of one tensor's axes or of one op's groups; each item's
        mesh axes: the first of its dim's rules, in the rules' order, whose axes no earlier
        pick took and which divide its sizes. Memoised (a 96-layer step asks the same
        37k times; the rules are fixed once made)."""
        key = tuple([(d, tuple(sizes)) for d, sizes in items])
        got = self._picked.get(key)
        if got is None:
            got = self._picked[key] = self._pick_new(items)
        return got

    def _pick_new(self, items) -> dict[int, tuple[str, ...]]:
        order = sorted(
            (k, j, i)
            for i, (d, _) in enumerate(items)
            if d is not None and d in self.options
            for j, (k, _) in enumerate(self.options[d])
        )
        out: dict[int, tuple[str, ...]] = {}
        used: set[str] = set()
        for _, j, i in order:
            if i in out:
                continue
            d, sizes = items[i]
            axes = self.options[d][j][1]
            if not axes:  # a rule that keeps the dim whole: no fallback after it
                out[i] = ()
                continue
            n = math.prod(self.mesh[a] for a in axes)
            if used.isdisjoint(axes) and all(s % n == 0 for s in sizes):
                out[i] = axes
                used.update(axes)
        return out

    def layout(self, t: Tensor) -> tuple[tuple[str, ...], ...]:
        """The tensor's layout: each axis its dim's mesh axes, earlier rules first."""
        got = self._pick([(d, (n,)) for d, n in zip(t.dims, t.shape, strict=True)])
        return tuple(got.get(i, ()) for i in range(len(t.shape)))

    def assign(self, g: Graph, groups) -> list[tuple[str, ...]]:
        """Mesh axes of each op group, by the same priority; fixed groups stay whole."""
        items = [
            (grp.dim if grp.kind != "fixed" else None,
             [g.tensors[t].shape[a] for t, a in grp.members])
            for grp in groups
        ]  # fmt: skip
        got = self._pick(items)
        return [got.get(k, ()) for k in range(len(groups))]
