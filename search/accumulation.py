"""Gradient accumulation as one more decision of the search: the step's batch cut into ``k``
microbatches whose gradients a ``lax.scan`` sums before one optimizer update
(``core.accumulate``), chosen where memory binds.

The accumulated step is planned as it runs: a scan over microbatches whose body is one
microbatch's forward and backward, so the ordinary planner prices it as XLA compiles it (the
body's ops, FSDP's weight gathers and the gradients' reductions included, once per microbatch;
the optimizer once; one microbatch's activations alive, beside the gradient accumulators).
Candidates ``(k, remat policy)`` share the budget they are given in equal parts (the
deterministic work clock, :mod:`.clock`): microbatch counts from the least the as-written
plan's memory says could fit, up, as-written before the policy ``remat="auto"`` chose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from autolayout.core import (
    AutolayoutError,
    Graph,
    Hardware,
    Plan,
    Workload,
    accumulate,
    accumulation_batch,
    accumulation_refusal,
)
from autolayout.core import remat as remat_workload

from .clock import Clock, clock
from .interrupt import interrupted

AS_WRITTEN = "as_written"
COUNTS = 3  # microbatch counts tried at most, from the least that may fit
GIB = 2**30


def microbatch_counts(batch: int, base: Plan | None = None, fixed: int | None = None) -> list[int]:
    """Microbatch counts to try: ``fixed``; else powers of two dividing ``batch``, from the
    least whose memory, estimated from ``base`` (the step's activations divided by ``k``, the
    rest unchanged), fits its limit (from 2 where ``base`` fits), :data:`COUNTS` of them."""
    if fixed:
        return [fixed]
    ks = [2**i for i in range(1, 31) if 2**i <= batch and batch % 2**i == 0]
    if base is None or not ks:
        return ks[:COUNTS]
    if base.status != "INFEASIBLE":  # it fits: accumulation competes on time, least first
        return ks[:COUNTS]
    limit, memory = base.predicted["memory_limit_bytes"], written_memory(base)
    first = next((i for i, k in enumerate(ks) if estimate(memory, k) <= limit), None)
    if first is None:  # no count fits by the estimate: the largest ones
        return ks[-COUNTS:]
    return ks[first : first + COUNTS]


def written_memory(p: Plan) -> tuple[float, float]:
    """The bytes a device needs for ``p``'s step at the least (the plan that needs least
    memory, where the search found one) and its activations, by ``p``'s figures."""
    s = p.predicted
    need = p.solver.get("least_memory_bytes", s["memory_bytes_per_device"])
    act = s.get("memory_by_category", {}).get("activations", 0)
    return need, act * need / max(1.0, s["memory_bytes_per_device"])


def estimate(memory: tuple[float, float], k: int) -> float:
    """The memory a device needs for a step that needs ``memory`` (bytes, activations)
    accumulated over ``k`` microbatches, at the least: its activations divided by ``k``,
    the rest unchanged."""
    need, act = memory
    return need - act + act / k


# an as-written candidate is skipped where the as-written step's estimate at its count is
# this many times the limit (the estimate is rough: no candidate near the limit is skipped)
HOPELESS = 1.5


def _inner(tag: str) -> Callable[[Workload], Workload] | None:
    return None if tag in (None, AS_WRITTEN) else functools.partial(remat_workload, policy=tag)


def _rank(p: Plan) -> tuple[bool, float]:
    s = p.predicted
    fits = p.status != "INFEASIBLE"
    return (not fits, s["step_time_s"] if fits else s["memory_bytes_per_device"])


def plan_accumulation(
    workload: Workload,
    hw: Hardware,
    *,
    plan_fn: Callable[..., Plan],
    kw: dict[str, Any],
    budget: float,
    graph: Graph | None = None,
    base: Plan | None = None,
    fixed: int | None = None,
    policies: tuple[str, ...] = (AS_WRITTEN,),
    written: tuple[float, float] | None = None,
) -> tuple[Plan | None, list[dict[str, Any]], str]:
    """The best accumulated plan of ``workload`` (``None`` where there is none), one row per
    candidate tried, and why there is none. ``plan_fn``: the planner (``search.plan``);
    ``kw`` its arguments; ``budget``: this part's share of the call's budget, in its clock;
    ``base``: the plan of the step as written (its memory picks the counts); ``fixed``: the
    count ``--microbatches`` gives; ``policies``: remat inside each microbatch, tried in order
    for each count; ``written``: what the step as written needs a device (bytes,
    activations) at the least, where known (with ``base``, whose limit it is read against,
    an as-written candidate it says is :data:`HOPELESS` is not tried)."""
    why = accumulation_refusal(workload)
    if why is not None:
        return None, [], why
    batch = accumulation_batch(workload)
    if batch is None:
        return None, [], f"{workload.name}: the batch's arrays disagree in their batch size"
    if fixed and batch % fixed:
        return None, [], f"{fixed} microbatches do not divide the batch of {batch}"
    ks = microbatch_counts(batch, base, fixed)
    if not ks:
        return None, [], f"a batch of {batch} cannot be cut into microbatches"
    cands = [(k, pol) for k in ks for pol in dict.fromkeys(policies)]
    tried: list[dict[str, Any]] = []
    if written is not None and base is not None and not fixed:
        limit = base.predicted["memory_limit_bytes"]  # the call's (a user's limit too)
        for k, pol in list(cands):
            if pol == AS_WRITTEN and (need := estimate(written, k)) > HOPELESS * limit:
                cands.remove((k, pol))
                tried.append({"microbatches": k, "remat": pol, "error": (
                    f"not tried: the step as written needs at least {_gib(need)} per "
                    f"device over {k} microbatches, of {_gib(limit)}")})  # fmt: skip
    if not cands:
        return None, tried, "the step as written would not fit at any count tried"
    ops = len(graph.ops) if graph is not None else 0
    least = Clock.least_work(ops) if ops and clock().deterministic else 0.0
    fit = max(1, min(len(cands), int(budget // least))) if least > 0 else len(cands)
    each = budget / fit
    best: Plan | None = None
    done_k = None
    for k, pol in cands[:fit]:
        if interrupted() or clock().walled or (done_k is not None and k != done_k):
            break
        try:
            wl = accumulate(workload, k, remat=_inner(pol))
            p = plan_fn(wl, hw, remat=AS_WRITTEN, **dict(kw, time_limit_s=each))
        except AutolayoutError as e:
            tried.append({"microbatches": k, "remat": pol, "error": str(e)})
            continue
        s = p.predicted
        fits = p.status != "INFEASIBLE"
        tried.append({"microbatches": k, "remat": pol, "fits": fits, "mesh": dict(p.mesh),
                      "step_time_s": s["step_time_s"],
                      "memory_bytes_per_device": s["memory_bytes_per_device"]})  # fmt: skip
        if best is None or _rank(p) < _rank(best):
            best = p
        if fits and done_k is None:  # the smallest count that fits: its other policies, no more
            done_k = k
    for k, pol in cands[fit:]:
        tried.append({"microbatches": k, "remat": pol,
                      "error": "not tried: the time limit leaves no budget for it"})  # fmt: skip
    if best is None:
        return None, tried, "no accumulated step could be planned"
    return best, tried, ""


def record(p: Plan, k: int, why: str, tried: list[dict[str, Any]] | None = None) -> Plan:
    """``plan.solver["accumulation"]``: the microbatches the step accumulates over (1: none),
    why, and the candidates tried."""
    p.solver["accumulation"] = {"microbatches": k, "why": why, "tried": list(tried or [])}
    return p


def _gib(b: float) -> str:
    return f"{b / GIB:.1f} GiB"


def why_chosen(p: Plan, base: Plan | None, fixed: int | None) -> str:
    """One line: why ``p`` accumulates over its microbatches."""
    k = p.options.get("accumulation", 1)
    s = p.predicted
    got = f"{k} microbatches of {accumulation_batch(p.workload) // k if p.workload else '?'}"
    tail = f"{_gib(s['memory_bytes_per_device'])} per device of {_gib(s['memory_limit_bytes'])}"
    if fixed:
        return f"--microbatches {fixed} fixes it: {got}, {tail}"
    if base is None:
        return f"{got}: {tail}"
    bs = base.predicted
    if base.status == "INFEASIBLE":
        need = base.solver.get("least_memory_bytes", bs["memory_bytes_per_device"])
        pol = base.solver.get("remat", {}).get("policy", AS_WRITTEN)
        return (f"the step does not fit ({_gib(need)} per device at the least, remat "
                f"{pol}); {got} fit: {tail}")  # fmt: skip
    return (f"faster than the step without it ({bs['step_time_s']:.4g} s, remat "
            f"{base.solver.get('remat', {}).get('policy', AS_WRITTEN)}): {got}, "
            f"{s['step_time_s']:.4g} s, {tail}")  # fmt: skip


def better(base: Plan, acc: Plan | None) -> bool:
    """Whether the accumulated plan ``acc`` wins over ``base``: it fits where ``base`` does
    not, or both fit and it is faster."""
    return acc is not None and _rank(acc) < _rank(base)
