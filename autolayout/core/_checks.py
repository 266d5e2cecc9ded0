"""What a command or a call is handed, checked before the work starts: limits (positive,
finite numbers) and the files it will write (a directory that exists and can be written),
so a bad value is one line naming the option, not a failure after a search of minutes."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from ._errors import AutolayoutError


class InputError(AutolayoutError, ValueError):
    """An argument or option out of range: a limit that is not a positive finite number, an
    output file whose directory is missing or cannot be written."""


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return repr(value)


def check_limit(name: str, value: Any, unit: str) -> float:
    """``value`` as a float, where it is a positive finite number; else :class:`InputError`
    naming ``name`` (``"--time-limit"``, ``"time_limit_s"``) and the value.

    Example:
      >>> check_limit("--time-limit", 60, "seconds")
      60.0
    """
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a positive finite number of {unit}, got {_shown(value)}")
    return float(value)


def check_gap(name: str, value: Any) -> float:
    """``value`` as a float, where it is a fraction in [0, 1) (a relative gap: ``0.02`` is
    2%); else :class:`InputError` naming ``name`` (``"--gap"``, ``"gap"``) and the value.

    Example:
      >>> check_gap("--gap", 0.02)
      0.02
    """
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or not 0 <= value < 1:
        raise InputError(f"{name} must be a fraction in [0, 1) (0.02 is 2%), got {_shown(value)}")
    return float(value)


def check_writable(path: str | Path, option: str = "--out") -> Path:
    """``path`` as a :class:`~pathlib.Path`, where a file can be written there (its directory
    exists and is writable; it is not a directory, nor a read-only file); else
    :class:`InputError` naming ``option`` and the path."""
    p = Path(path)
    real = Path(os.path.realpath(p))
    parent = real.parent
    where = f"{option} {path}"
    if real.is_dir():
        raise InputError(f"{where}: is a directory; give a file name")
    if not parent.is_dir():
        raise InputError(f"{where}: directory {p.parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{where}: directory {p.parent} is not writable")
    if real.exists() and not os.access(real, os.W_OK):
        raise InputError(f"{where}: the file is read-only")
    return p
