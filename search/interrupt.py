"""Ctrl-C and SIGTERM during a search: the first ends it with the best plan found so far, a
second ends the process at once.

:func:`stoppable` installs the handlers (in the main thread; the outermost block only): a
signal sets a process-wide flag that :func:`interrupted` reads, so every deadline of the
search reads as passed (the clock's ``now()``) and a CP-SAT solve under way is stopped
(:func:`on_interrupt` registers ``solver.stop_search``). The handlers are Python's, but the
work is done by a thread that reads the signal numbers Python's C-level handler writes to a
wakeup pipe: it runs while the main thread is inside CP-SAT or XLA, where a Python-level
handler would wait for the call to return. The first signal prints one line on stderr;
the second prints one and exits with 128 + its number (130, 143), no traceback, no cleanup.

CP-SAT catches SIGINT itself during a solve (and ends it FEASIBLE, unseen by us) and leaves
SIG_DFL behind at the C level (OR-Tools 9.15): the ILP turns that off
(``catch_sigint_signal``) and calls :func:`restore_handlers` after every solve.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from autolayout.core import Plan

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stop:
    """What one :func:`stoppable` block received: ``signal`` (its number, or None), and the
    callables to call at the first signal (a solve's ``stop_search``)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.count = 0
        self.hooks: list[Callable[[], Any]] = []
        self.lock = threading.Lock()

    @property
    def name(self) -> str | None:
        return None if self.signal is None else signal.Signals(self.signal).name

    @property
    def exit_code(self) -> int:
        """The shell's status for a process ended by the signal: 130 (SIGINT), 143 (SIGTERM)."""
        return 128 + (self.signal or 0)


_ACTIVE: list[Stop] = []  # the outermost block's, while one is open


def interrupted() -> bool:
    """Whether a SIGINT or SIGTERM came inside the open :func:`stoppable` block."""
    return bool(_ACTIVE) and _ACTIVE[0].signal is not None


def signal_name() -> str | None:
    """``"SIGINT"`` or ``"SIGTERM"`` once one came inside the open block, else None."""
    return _ACTIVE[0].name if _ACTIVE else None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stoppable() -> Iterator[Stop]:
    """The block runs with SIGINT/SIGTERM handled as the module says; yields its
    :class:`Stop` (still readable after the block). Nested blocks share the outermost one's;
    outside the main thread nothing is installed (signals keep their handlers)."""
    if _ACTIVE:
        yield _ACTIVE[0]
        return
    stop = Stop()
    if not _in_main_thread():
        yield stop
        return
    r, w = os.pipe()
    os.set_blocking(w, False)  # the C handler must never block on it
    old_fd = signal.set_wakeup_fd(w)
    old = {s: signal.signal(s, functools.partial(_noted, stop)) for s in SIGNALS}
    watcher = threading.Thread(target=_watch, args=(r, stop), name="autolayout-signals",
                               daemon=True)  # fmt: skip
    watcher.start()
    _ACTIVE.append(stop)
    try:
        yield stop
    finally:
        _ACTIVE.clear()
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        os.close(w)  # the watcher reads end-of-file and returns
        watcher.join(timeout=1.0)
        os.close(r)


def _noted(stop: Stop, signum: int, frame: Any) -> None:
    """The Python-level handler (main thread): the flag, at once where the watcher has not
    run yet; the watcher counts and acts."""
    if stop.signal is None:
        stop.signal = signum


def _watch(fd: int, stop: Stop) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in SIGNALS:
                _received(stop, signum)


def _received(stop: Stop, signum: int) -> None:
    name = signal.Signals(signum).name
    with stop.lock:
        stop.count += 1
        first = stop.count == 1
        if first:
            stop.signal = stop.signal or signum
            hooks = list(stop.hooks)
    if not first:  # no cleanup: the user asked twice
        lead = "\n" if os.isatty(2) else ""  # below a progress bar's line
        os.write(2, f"{lead}autolayout: {name} again: stopped at once\n".encode())
        os._exit(128 + signum)
    print(f"autolayout: {name}: ending the search with the best plan found so far "
          f"({name} again stops at once)", file=sys.stderr, flush=True)  # fmt: skip
    for hook in hooks:
        hook()


@contextlib.contextmanager
def on_interrupt(hook: Callable[[], Any]) -> Iterator[None]:
    """``hook()`` is called (from the watcher thread) at the first signal while the block
    runs, or at once where one came already."""
    stop = _ACTIVE[0] if _ACTIVE else None
    if stop is None:
        yield
        return
    with stop.lock:
        stop.hooks.append(hook)
        now = stop.signal is not None
    if now:
        hook()
    try:
        yield
    finally:
        with stop.lock:
            stop.hooks.remove(hook)


def restore_handlers() -> None:
    """Re-installs Python's handlers of SIGINT and SIGTERM at the C level (a library that
    leaves SIG_DFL there, as CP-SAT's solve does, turns a Ctrl-C into instant death)."""
    if not _in_main_thread():
        return
    for s in SIGNALS:
        h = signal.getsignal(s)
        if h is not None:
            signal.signal(s, h)


def mark(result: Any) -> Any:
    """A plan made while a signal came says so: ``solver["interrupted"]`` and
    ``solver["stopped"]``; its status stays its own."""
    if isinstance(result, Plan) and interrupted():
        result.solver["interrupted"] = True
        result.solver["stopped"] = (
            f"interrupted by {signal_name()}: the best plan found before it, not the end of "
            "the search"
        )
        if result.solver.get("deterministic"):
            result.solver["deterministic"] = False  # where the signal came is not reproducible
    return result


def interruptible(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` runs inside :func:`stoppable`, and a plan it returns is :func:`mark`-ed."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with stoppable():
            return mark(fn(*args, **kwargs))

    return wrapper
