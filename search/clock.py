"""The planner's clock. By default it counts **work**, not wall time: each CP-SAT solve's
deterministic time and its model's size, each candidate priced, each request built and each
op traced, charged at what it costs on the reference machine (:data:`Clock` constants,
fitted by ``experiments/clock_calibration.py``). Every deadline of the search reads it, so a
plan is the same on an idle and on a busy machine, and on the next one.

The wall clock stays as a safety stop: the whole call ends by its time limit (from the
moment the caller started it, loading the model included), and a plan cut by it says so
(``plan.solver["deterministic"]`` False, ``plan.solver["stopped"]``). The work budget is
:data:`WORK_SHARE` of the time limit, so the stop fires only on a machine that runs the
search more than ``1 / WORK_SHARE`` times slower than the reference.

``deterministic=False`` makes the clock the wall clock (the search then uses every second
of its limit, and its answer may depend on the machine's load).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator

from autolayout.core import PlanError

from .interrupt import interrupted

# of a time limit, the work the search is given: the rest is the margin for a machine slower
# or busier than the reference (two busy-loop processes beside a plan on two cores run it
# ~1.5x slower) and for work the charges below miss
WORK_SHARE = 0.5
# of a time limit, what the wall-clock stop leaves for the work that follows it (the plan it
# had priced exactly, written and printed: 1-3 s on 14k-op graphs, 1.5x that beside two busy
# loops), so that the whole command ends near its limit
WALL_RESERVE = 0.1


def wall_slack() -> float:
    """How many time limits the wall-clock stop waits, less :data:`WALL_RESERVE`: 1, or
    ``AUTOLAYOUT_WALL_SLACK`` (the test suite sets 10, so that a busy CI machine does not
    cut the plans it checks)."""
    text = os.environ.get("AUTOLAYOUT_WALL_SLACK", "1")
    try:
        slack = float(text)
    except ValueError:
        slack = math.nan
    if not 1 <= slack < math.inf:
        raise PlanError(f"AUTOLAYOUT_WALL_SLACK must be a number >= 1, got {text!r}")
    return slack - WALL_RESERVE


class Clock:
    """Wall time, or (deterministic) a count of work in reference seconds: the charges below,
    each fitted to this project's reference machine (2 cores; ``experiments/
    clock_calibration.py``, CPU seconds of the plans of the example models)."""

    # CP-SAT: its deterministic time undercounts large layout models (one unit took 0.8 s of
    # CPU on 4k-element models and 5 s on 40k ones): charged per unit by the model's size
    SAT_S = 0.6
    SAT_PER_ELEMENT_S = 1.1e-4
    SAT_MAX = 6.0  # measured up to 46k elements (5x); not extrapolated past it
    # an ILP's variable or constraint, built in Python and loaded into CP-SAT
    ELEMENT_S = 3.5e-5
    PRICE_NODE_S = 9e-6  # a candidate priced (step time and memory walk), per request node
    NODE_COST_S = 3.5e-5  # a node's cost under a strategy, priced the first time it is read
    # a resharding's cost, priced the first time it is read, per doubling of the devices
    # (XLA's reshard replayed on the tile assignments: 69 / 111 / 242 us on 8 / 64 / 512)
    READ_COST_S = 3e-5
    BUILD_STRATEGY_S = 3.5e-6  # a mesh shape's request built, per strategy of its nodes
    TRACE_OP_S = 2.5e-4  # an op traced (the step's jaxpr made and walked, names given)
    ANALYSE_OP_S = 3e-5  # the mesh-independent analysis, per op
    # the winner priced exactly and its report's rows: 23-37 us an op on 8k-14k-op graphs,
    # 0.02-0.1 s on the examples' 300-600
    FINAL_S, FINAL_OP_S = 0.05, 4e-5

    def __init__(
        self, deterministic: bool = True, wall_end: float = math.inf, gap: float = 0.0
    ) -> None:
        self.deterministic = deterministic
        # the call's stopping rule: a plan within this fraction of every mesh shape's bound
        # is proven (``al.plan(gap=)``); a shape whose bound is within it of the best is done
        self.gap = gap
        self.limit_s = 0.0  # the call's time limit (``al.plan``'s), seconds
        self.virtual = 0.0
        self.end = math.inf  # the call's budget ends here, in this clock's units
        # past this wall time every deadline has passed (the limit holds), and ``walled``
        # says the plan may differ between runs
        self.wall_end = wall_end
        self.walled = False
        self.late = 0.0  # the last reading after the stop
        self.phases: dict[str, float] = {}  # wall seconds per phase of the plan
        self._mark = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Adds the wall time since the last mark to ``phase``."""
        t = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + t - self._mark
        self._mark = t

    def now(self) -> float:
        if interrupted() or time.perf_counter() > self.wall_end:
            self.walled = True
            # each reading 1e9 s past the last: past every deadline, also one set from a
            # reading after the stop (with math.inf, now() + share * (deadline - now()) is nan,
            # which no comparison passes)
            self.late = max(self.late, self.virtual, time.perf_counter()) + 1e9
            return self.late
        return self.virtual if self.deterministic else time.perf_counter()

    def charge(self, seconds: float) -> None:
        self.virtual += seconds

    @staticmethod
    def least_work(ops: int) -> float:
        """The work a plan of a graph of ``ops`` ops takes at the least: traced, analysed,
        one mesh shape's request built (some 20 strategies an op), the winner priced."""
        per_op = Clock.TRACE_OP_S + Clock.ANALYSE_OP_S + Clock.FINAL_OP_S
        return Clock.FINAL_S + ops * (per_op + 20 * Clock.BUILD_STRATEGY_S)

    @staticmethod
    def final_work(ops: int) -> float:
        """Pricing a plan of ``ops`` ops exactly, with its report's rows."""
        return Clock.FINAL_S + Clock.FINAL_OP_S * ops

    def wall_left(self) -> float:
        return self.wall_end - time.perf_counter()

    @staticmethod
    def sat_work(deterministic_s: float, elements: int) -> float:
        """What a CP-SAT solve is charged: its deterministic time, scaled by its model's
        size, and the model's building."""
        return deterministic_s * Clock.sat_unit(elements) + Clock.ELEMENT_S * elements

    @staticmethod
    def sat_unit(elements: int) -> float:
        """What a unit of CP-SAT's deterministic time is charged, on a model this size."""
        return min(Clock.SAT_MAX, Clock.SAT_S + Clock.SAT_PER_ELEMENT_S * elements)


_CURRENT: list[Clock | None] = [None]


def clock() -> Clock:
    """The clock of the plan being made (a wall clock outside a plan)."""
    return _CURRENT[0] or Clock(deterministic=False)


def active() -> Clock | None:
    """The clock of an enclosing plan call, if any."""
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


def charge(seconds: float) -> None:
    """Charges work to the current plan's clock (nothing outside a plan)."""
    if _CURRENT[0] is not None:
        _CURRENT[0].charge(seconds)
