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
