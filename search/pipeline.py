"""Pipeline stages as one more choice of the search: stages x microbatches x schedule, each
with its own intra-stage layout and mesh.

A candidate ``(P, M)`` is one stage's step (``core.stage_workload``) on one stage's devices
(``cost_models.stage_hardware``: the outermost, slowest level cut into ``P``), priced as a
pipeline by ``cost_models.price_pipeline``. First every candidate is priced with the standard
hand layouts of its stage (cheap: a scanned stage traces in a fraction of a second), then the
best few are searched in full with the planner, under the memory the pipeline leaves one
stage's step (the activations of every microbatch in flight come on top of one's).
"""

from __future__ import annotations

import time
from typing import Any

from autolayout.core import (
    AutolayoutError,
    Graph,
    Hardware,
    Plan,
    Stack,
    Workload,
    find_stack,
    stage_workload,
    trace,
)
from autolayout.cost_models import (
    RUNNABLE,
    edge_conflict,
    evaluate,
    pipelined_plan,
    stage_hardware,
)

from .baselines import standard_layouts
from .clock import Clock, charge, now

FULL = 3  # candidates searched in full after the hand-layout pass
MICROBATCHES = (1, 2, 4, 8)  # microbatches per stage tried: M = P x these
FIRST = 3  # stage counts whose microbatch counts are all priced, after one each


def stage_counts(g: Graph, stack: Stack, hw: Hardware, stages: int | None = None) -> list[int]:
    """Stage counts dividing the layers and the slowest level of ``hw``."""
    ps = [stages] if stages else range(2, stack.length + 1)
    return [p for p in ps if stack.length % p == 0 and stage_hardware(hw, p) is not None]


def microbatch_counts(g: Graph, stack: Stack, hw: Hardware, p: int) -> list[int]:
    """Microbatch counts for ``p`` stages: multiples of ``p`` (the bubble at most half the step)
    and one sequence per replica of a stage whose devices are data-parallel over all but a
    tensor axis of 1 to 8 (Megatron-LM's microbatch of one)."""
    B, n = g.dims[stack.batch], hw.num_devices // p
    ms = {p * k for k in MICROBATCHES}
    ms |= {B // (n // t) for t in (1, 2, 4, 8) if n % t == 0 and B % (n // t) == 0}
    return sorted(m for m in ms if p <= m <= B and B % m == 0)


def candidates(
    g: Graph, stack: Stack, hw: Hardware, stages: int | None = None,
    microbatches: int | None = None,
) -> list[tuple[int, int]]:  # fmt: skip
    """``(P, M)`` pairs: ``P`` dividing the layers and the slowest level of ``hw``, ``M``
    dividing the batch, at least ``P``."""
    B = g.dims[stack.batch]
    out = []
    for p in stage_counts(g, stack, hw, stages):
        ms = [microbatches] if microbatches else microbatch_counts(g, stack, hw, p)
        out += [(p, m) for m in ms if m >= 1 and B % m == 0]
    return out


def rank(s: dict) -> tuple[bool, float]:
    """A prediction's rank (lower first): what fits, fastest; else the least memory."""
    return (not s["fits"], s["step_time_s"] if s["fits"] else s["memory_bytes_per_device"])


def _row(status: str, P: int, M: int, stage: Plan, pp: Plan) -> dict[str, Any]:
    """A candidate tried: its stages, microbatches, stage mesh and the pipeline's prediction."""
    s = pp.predicted
    return {"stages": P, "microbatches": M, "status": status, "stage_mesh": dict(stage.mesh),
            "step_time_s": s["step_time_s"], "memory_bytes_per_device": s["memory_bytes_per_device"],
            "fits": bool(s["fits"]), "bubble": s["pipeline"]["bubble"]}  # fmt: skip


def _hand_best(swl: Workload, sg: Graph, sub: Hardware, stack) -> Plan | None:
    """The fastest fitting standard layout of one stage's step (else the least memory), of
    those priced as XLA compiles them pipelined (:func:`edge_conflict`)."""
    best, key = None, None
    for mesh, rules in standard_layouts(sg, sub.num_devices).values():
        charge(Clock.final_work(len(sg.ops)))  # priced exactly, as a plan's winner is
        try:
            p = evaluate(swl, sub, mesh=mesh, rules=rules, graph=sg)
        except AutolayoutError:
            continue
        if edge_conflict(p, stack) is not None:
            continue
        s = p.predicted
        k = rank(s)
        if key is None or k < key:
            best, key = p, k
    return best


def plan_pipelined(
    workload: Workload,
    hw: Hardware,
    *,
    graph: Graph | None = None,
    time_limit_s: float = 30.0,
    memory_limit: float | None = None,
    stages: int | None = None,
    microbatches: int | None = None,
    schedule: str = "gpipe",
    plan_fn: Any = None,
) -> tuple[Plan | None, list[dict[str, Any]], str]:
    """The best pipelined plan of ``workload`` on ``hw`` (``None`` where there is none), what
    was tried (one row per candidate), and why there is none. ``plan_fn``: the planner, for a
    stage's full search. ``time_limit_s`` is in the plan's clock (:mod:`.clock`): work, or
    wall seconds."""
    t0, start = time.perf_counter(), now()
    g = graph
    if g is None:
        g = trace(workload)
        charge(Clock.TRACE_OP_S * len(g.ops))
    stack = find_stack(g)
    if isinstance(stack, str):
        return None, [], stack
    if schedule not in RUNNABLE and schedule != "1f1b":
        raise ValueError(f"schedule must be one of {', '.join(RUNNABLE)} or 1f1b")
    cands = candidates(g, stack, hw, stages, microbatches)
    if not cands:
        return (
            None,
            [],
            (
                f"no stage count divides both the {stack.length} {stack.dim} and the slowest level "
                f"of {hw.name}, with a batch of {g.dims[stack.batch]} cut into microbatches"
            ),
        )
    limit = memory_limit if memory_limit is not None else hw.hbm_limit_bytes
    tried, priced = [], []

    def hand(P: int, M: int) -> None:
        if now() - start > time_limit_s / 2 and priced:
            tried.append({"stages": P, "microbatches": M, "status": "SKIPPED"})
            return
        sub = stage_hardware(hw, P)
        try:
            swl = stage_workload(workload, g, stack, P, M)
            sg = trace(swl)
            charge(Clock.TRACE_OP_S * len(sg.ops))
        except Exception as e:  # a model that does not trace at a stage's shapes
            tried.append({"stages": P, "microbatches": M, "status": "ERROR",
                          "error": f"{type(e).__name__}: {e}"[:200]})  # fmt: skip
            return
        best = _hand_best(swl, sg, sub, stack)
        if best is None:
            return
        pp = pipelined_plan(workload, g, hw, best, stack, P, M, schedule, memory_limit=limit)
        tried.append(_row("HAND", P, M, best, pp))
        priced.append((*rank(pp.predicted), P, M, swl, sg, sub, best, pp))

    # one microbatch count per stage count first (the middle one), then all of the best few
    by_p: dict[int, list[int]] = {}
    for P, M in cands:
        by_p.setdefault(P, []).append(M)
    for P, ms in by_p.items():
        hand(P, ms[len(ms) // 2])
    ranked = sorted(priced, key=lambda r: r[:2])
    for P in dict.fromkeys(r[2] for r in ranked[:FIRST]):
        for M in by_p[P]:
            if M != by_p[P][len(by_p[P]) // 2]:
                hand(P, M)
    if not priced:
        return None, tried, "no candidate stage layout could be priced"
    priced.sort(key=lambda r: r[:2])
    best = priced[0][-1]
    top = priced[:FULL]
    share = (time_limit_s - (now() - start)) / len(top)
    for _, _, P, M, swl, sg, sub, hand, pp in top:
        if plan_fn is None:
            break
        s, hs = pp.predicted, hand.predicted
        # what the pipeline adds to one stage's step, as the hand layout has it
        extra = s["memory_bytes_per_device"] - hs["memory_bytes_per_device"]
        if limit - extra <= 0 or share <= 0:
            continue
        try:
            inner = plan_fn(swl, sub, graph=sg, memory_limit=limit - extra,
                            time_limit_s=share)  # fmt: skip
        except AutolayoutError as e:
            tried.append({"stages": P, "microbatches": M, "status": "ERROR", "error": str(e)})
            continue
        if inner.status == "INFEASIBLE":
            continue
        if (why := edge_conflict(inner, stack)) is not None:  # not priced as XLA compiles it
            tried.append({"stages": P, "microbatches": M, "status": "REFUSED", "error": why})
            continue
        full = pipelined_plan(workload, g, hw, inner, stack, P, M, schedule, memory_limit=limit)
        tried.append(_row("SEARCHED", P, M, inner, full))
        if rank(full.predicted) < rank(best.predicted):
            best = full
    best.solver["pipeline"]["tried"] = tried
    best.solver["wall_s"] = time.perf_counter() - t0
    return best, tried, ""
