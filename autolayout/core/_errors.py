"""The error hierarchy: every error autolayout raises on bad input is one of these.

Each subclasses a built-in error as well, so ``except ValueError`` keeps working for
callers who do not know about autolayout. Messages say what was expected, what was
found and where (file, key, op, dim).
"""

from __future__ import annotations


class AutolayoutError(Exception):
    """Base class of every error autolayout raises on bad input."""


class ModelFileError(AutolayoutError, ValueError):
    """A model file is missing, defines no ``workload``, or raised while loading."""


class WorkloadError(AutolayoutError, ValueError):
    """A workload's function or arguments are malformed (e.g. a spec with bad dims)."""


class HardwareError(AutolayoutError, ValueError):
    """A hardware name is unknown, or a profile file is malformed or has a wrong key."""


class TraceError(AutolayoutError, RuntimeError):
    """The workload could not be traced by ``jax.make_jaxpr``."""


class MeshError(AutolayoutError, ValueError):
    """A mesh that does not fit the hardware (its size, or an axis across the topology)."""


class RuleError(AutolayoutError, ValueError):
    """A layout rule that names an unknown dim or mesh axis, or that does not divide."""


class LayoutError(AutolayoutError, ValueError):
    """A tensor layout that does not fit: a split that does not divide, an axis used twice."""


class PlanError(AutolayoutError, ValueError):
    """A plan file that cannot be used: another version, corrupted, or for another model."""
