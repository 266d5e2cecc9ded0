"""A run's metrics as they happen: one JSON line per finished step, appended with one
``write`` and flushed before the next step starts (a reader, or a job killed at any moment,
sees whole lines only), and, on request, TensorBoard event files (tensorboardX).

A line: ``step`` (steps done), ``loss``, ``step_time_s``, ``tokens_per_s`` (or
``samples_per_s`` for a step without token ids), ``mfu`` measured (the plan's FLOPs over the
measured time and the local profile's peak) beside ``predicted_mfu`` and
``predicted_step_time_s`` (the plan's layout priced on the local hardware profile), and
``time`` (seconds since the epoch)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autolayout.core import atomic_write, check_writable

from .checkpoint import check_directory


def step_size(data: Sequence[Any]) -> tuple[str, int]:
    """What one step consumes, from its per-step inputs (the batch): the token ids' count
    (the largest integer array) as ``tokens``, else the leading dim of the first array as
    ``samples``."""
    leaves = [x for x in _leaves(data) if hasattr(x, "dtype") and hasattr(x, "shape")]
    ints = [x for x in leaves if np.issubdtype(np.dtype(x.dtype), np.integer) and x.shape]
    if ints:
        return "tokens", max(math.prod(x.shape) for x in ints)
    shaped = [x for x in leaves if x.shape]
    return "samples", (shaped[0].shape[0] if shaped else 1)


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


class Metrics:
    """Where a run's per-step metrics go: ``jsonl`` (a file), ``tensorboard`` (a folder of
    event files); either may be None. Both are checked before the first step."""

    def __init__(self, jsonl: str | Path | None = None, tensorboard: str | Path | None = None):
        self.jsonl = check_writable(jsonl, "--metrics") if jsonl else None
        self._tb = None
        if tensorboard:
            folder = check_directory(tensorboard, "--tensorboard")
            import tensorboardX  # heavy: 0.16 s (protobuf), imported where --tensorboard asks

            self._tb = tensorboardX.SummaryWriter(str(folder))
        self._fd: int | None = None

    def start(self, after_step: int) -> None:
        """Opens the JSONL file for appending; lines past ``after_step`` (a run resumed from a
        checkpoint at that step re-runs them) are dropped first, the file rewritten whole."""
        if self.jsonl is None:
            return
        if self.jsonl.exists():
            kept = []
            for line in self.jsonl.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= after_step:
                        kept.append(line)
                except (json.JSONDecodeError, AttributeError):
                    continue  # a torn line from a killed writer: not a step
            atomic_write(self.jsonl, "".join(k + "\n" for k in kept))
        self._fd = os.open(self.jsonl, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)

    def write(self, record: dict[str, Any]) -> None:
        """One step's line, appended in one write; its TensorBoard scalars."""
        if self._fd is not None:
            os.write(self._fd, (json.dumps(record) + "\n").encode())
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                if key not in ("step", "time") and isinstance(value, (int, float)):
                    self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
