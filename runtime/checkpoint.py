"""Checkpoints of a run's state with Orbax: each process writes its own shards, in the
background (``save`` copies the arrays off the devices and returns; the files are written
while the next steps run), the last few kept. A checkpoint is restored into whatever layout
the run asks for: the plan it was saved with, or another plan's mesh and shardings (Orbax
reads each device's slice of the global arrays), so resuming on another slice, or after
planning again, is the same ``--resume``.

A checkpoint ``DIR/<step>`` holds ``state`` (the donated arguments after ``step`` steps)
and ``meta`` (JSON: the model, its options, the seed, the mesh and rules it was saved with,
the losses and step times so far). Orbax writes into a temporary folder and renames it when
every process is done, so a killed save leaves no half checkpoint."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax

from autolayout.core import InputError, PlanError

KEEP = 3  # checkpoints kept by default: the newest, and two to fall back on


def check_directory(path: str | Path, option: str = "--checkpoint-dir") -> Path:
    """``path`` as an absolute :class:`Path`, created where missing, where it is a directory
    this process can write; else :class:`InputError` naming ``option``: found before the
    first step, not after the first save."""
    p = Path(path).expanduser().absolute()
    where = f"{option} {path}"
    if p.exists() and not p.is_dir():
        raise InputError(f"{where}: is a file; give a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{where}: cannot be created ({e.strerror})") from None
    probe = p / f".autolayout-write-check-{jax.process_index()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise InputError(f"{where}: is not writable ({e.strerror})") from None
    return p


class _QuietBackgroundSave(logging.Filter):
    """Drops Orbax's log of a save that failed in its background thread (a traceback on
    stderr when a peer dies mid-save): the failure is raised again by the wait that follows
    (``Checkpoints.close``), where the run says in one line what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "in background save thread" not in record.getMessage()


class Checkpoints:
    """The checkpoints of one run in ``directory`` (Orbax's ``CheckpointManager``): ``save``
    every ``save_every`` steps (and whenever ``force``), asynchronously, ``keep`` kept;
    ``latest`` and ``restore`` for ``--resume``."""

    def __init__(self, directory: str | Path, *, save_every: int | None = None, keep: int = KEEP):
        self.directory = check_directory(directory)
        self.save_every = save_every
        absl = logging.getLogger("absl")
        absl.setLevel(logging.ERROR)  # Orbax: INFO per save, WARNING per sync
        if not any(isinstance(f, _QuietBackgroundSave) for f in absl.filters):
            absl.addFilter(_QuietBackgroundSave())
        # Orbax takes 0.15 s to import: a command that writes no checkpoint starts without it
        import orbax.checkpoint as ocp  # heavy: imported by the first run that checkpoints

        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=True, create=True
            ),
        )
        self.last_saved: int | None = self._manager.latest_step()

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def path(self, step: int | None) -> str:
        return str(self.directory / str(step)) if step is not None else "none"

    def due(self, step: int) -> bool:
        """Whether ``step`` (steps done) is one ``save_every`` asks for."""
        return bool(self.save_every) and step % self.save_every == 0

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """Starts saving ``state`` after ``step`` steps; returns once the arrays are off the
        devices (they may be donated to the next step), the files written in the background.
        Every process calls it at the same step."""
        if step == self.last_saved:
            return
        a = self._ocp.args
        self._manager.save(
            step,
            args=a.Composite(state=a.StandardSave(state), meta=a.JsonSave(meta)),
            force=True,
        )
        self.last_saved = step

    def meta(self, step: int) -> dict[str, Any]:
        """The JSON written beside the state of checkpoint ``step``."""
        a = self._ocp.args
        got = self._manager.restore(step, args=a.Composite(meta=a.JsonRestore()))
        return dict(got["meta"])

    def restore(self, step: int, target: Any) -> Any:
        """The state of checkpoint ``step`` laid out as ``target`` (a pytree of
        ``jax.ShapeDtypeStruct`` with shardings: this run's plan, whatever plan saved it).
        A shape or dtype other than the checkpoint's is :class:`PlanError`."""
        try:
            a = self._ocp.args
            got = self._manager.restore(step, args=a.Composite(state=a.StandardRestore(target)))
        except (ValueError, TypeError, KeyError) as e:
            text = " ".join(str(e).split())[:300]
            raise PlanError(
                f"checkpoint {self.path(step)} does not fit this run's state ({text}): resume "
                "the model and options it was saved with"
            ) from None
        return got["state"]

    def wait(self) -> None:
        """Until every save started has been written."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
