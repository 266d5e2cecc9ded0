"""The planner's clock: wall time, or (deterministic) a count of work, with the wall clock
as a backstop; every deadline of the search reads it, and every CP-SAT solve is charged to it
(``solve``). ``using`` makes one the current clock for a plan."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from . import ilp
from .request import Request


class Clock:
    """Wall time, or (deterministic) a count of work: each CP-SAT solve's deterministic time
    and its model's size, and a fixed charge per priced candidate and per mesh shape, so
    deadlines fall at the same point of the search on any machine and any load."""

    PRICE_S = 0.02  # a priced rule-set candidate
    SHAPE_S = 0.2  # a request built for a mesh shape
    # an ILP's variable or constraint, built in Python: CP-SAT's deterministic time leaves
    # out the model's building, which was most of the wall time (GPT-3 shapes, 2 layers,
    # least-memory models of 150k elements: 3-4 s built, 0.1-0.5 s deterministic; a 20 s
    # limit ran 57-120 s); measured 1.4e-5-2e-5 s an element on the 2-core machine
    ELEMENT_S = 2e-5

    def __init__(self, deterministic: bool = False) -> None:
        self.deterministic = deterministic
        self.virtual = 0.0
        # deterministic: past this wall time every deadline has passed (the limit holds),
        # and ``walled`` says the plan may differ between runs
        self.wall_end = math.inf
        self.walled = False
        self.phases: dict[str, float] = {}  # wall seconds per phase of the plan
        self._mark = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Adds the wall time since the last mark to ``phase``."""
        t = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + t - self._mark
        self._mark = t

    def now(self) -> float:
        if not self.deterministic:
            return time.perf_counter()
        if time.perf_counter() > self.wall_end:
            self.walled = True
            return self.virtual + 1e9  # beyond any deadline
        return self.virtual

    def charge(self, seconds: float) -> None:
        self.virtual += seconds


_CURRENT = [Clock()]


def clock() -> Clock:
    """The clock of the plan being made."""
    return _CURRENT[0]


@contextlib.contextmanager
def using(c: Clock) -> Iterator[Clock]:
    """``c`` is the current clock inside the block (the one before it after)."""
    saved, _CURRENT[0] = _CURRENT[0], c
    try:
        yield c
    finally:
        _CURRENT[0] = saved


def now() -> float:
    return clock().now()


def charged_solve(req: Request, **kw) -> ilp.Solution:
    if clock().deterministic:
        kw["wall_limit_s"] = max(0.05, clock().wall_end - time.perf_counter())
        kw["element_s"] = Clock.ELEMENT_S  # charged below: the model's building is in the limit
    sol = ilp.solve(req, deterministic=clock().deterministic, **kw)
    if clock().deterministic and time.perf_counter() >= clock().wall_end:
        clock().walled = True  # the backstop, not the work, ended this solve
    clock().charge(sol.deterministic_s + Clock.ELEMENT_S * (sol.variables + sol.constraints))
    return sol
