"""Dim names a library already attaches to its parameters, read where they exist (the only
place the planner knows a library's conventions):

* Flax linen's ``nn.with_logical_partitioning`` boxes (``LogicallyPartitioned`` and any
  ``flax.core.meta.AxisMetadata`` with ``names``): the logical axis names.
* Flax NNX variables (``nnx.with_partitioning``): the ``out_sharding`` / ``sharding_names``
  / ``sharding`` metadata.

Both are duck-typed (no import of flax): a box is anything with ``names`` and ``unbox``, a
variable anything with ``get_metadata`` and a value."""

from __future__ import annotations

from typing import Any

import jax

from ._workload import Spec

NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def _names(x: Any) -> tuple | None:
    """The dim names a box or variable carries, or None for another leaf."""
    if hasattr(x, "unbox") and hasattr(x, "names"):
        return tuple(x.names)
    get = getattr(x, "get_metadata", None)
    if callable(get) and (hasattr(x, "get_value") or hasattr(x, "value")):
        try:
            md = get()
        except Exception:  # noqa: BLE001 - not a variable after all
            return None
        for k in NNX_KEYS:
            if isinstance(md, dict) and md.get(k) is not None:
                return tuple(md[k])
        return ()
    return None


def is_box(x: Any) -> bool:
    return _names(x) is not None


def _value(x: Any) -> Any:
    if hasattr(x, "unbox") and hasattr(x, "names"):
        return x.value
    get = getattr(x, "get_value", None)
    return get() if callable(get) else x.value


def unboxed(tree: Any) -> Any:
    """``tree`` with every box or variable replaced by its value (the rest as it is)."""
    return jax.tree.map(lambda x: _value(x) if is_box(x) else x, tree, is_leaf=is_box)


def named_specs(tree: Any) -> Any:
    """Abstract ``tree`` unboxed, each boxed leaf an ``al.spec`` carrying the library's names
    (a name that is not one string, a tuple of mesh axes, is left to the tracer)."""

    def one(x: Any) -> Any:
        if not is_box(x):
            return x
        v, names = _value(x), _names(x)
        if len(names) != len(getattr(v, "shape", ())):
            return v
        dims = tuple(n if isinstance(n, str) and n else None for n in names)
        seen = [d for d in dims if d is not None]
        if len(set(seen)) != len(seen):
            return v
        return Spec(v.shape, v.dtype, dims)

    return jax.tree.map(one, tree, is_leaf=is_box)
