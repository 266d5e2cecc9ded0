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
from autolayout.cost_models import RUNNABLE, evaluate, pipelined_plan, stage_hardware

from .baselines import standard_layouts

FULL = 3  # candidates searched in full after the hand-layout pass
MICROBATCHES = (1, 2, 4, 8)  # microbatches per stage tried: M = P x these


def candidates(
    g: Graph, stack: Stack, hw: Hardware, stages: int | None = None,
    microbatches: int | None = None,
) -> list[tuple[int, int]]:  # fmt: skip
    """``(P, M)`` pairs: ``P`` dividing the layers and the slowest level of ``hw``, ``M``
    dividing the batch (``M >= P``, so the bubble is at most half the step)."""
    L, B = stack.length, g.dims[stack.batch]
    ps = [stages] if stages else [p for p in range(2, L + 1) if L % p == 0]
    out = []
    for p in ps:
        if L % p or stage_hardware(hw, p) is None:
            continue
        ms = [microbatches] if microbatches else [p * k for k in MICROBATCHES]
        out += [(p, m) for m in ms if m >= 1 and B % m == 0]
    return out


def _hand_best(swl: Workload, sg: Graph, sub: Hardware) -> Plan | None:
    """The fastest fitting standard layout of one stage's step (else the least memory)."""
    best, key = None, None
    for mesh, rules in standard_layouts(sg, sub.num_devices).values():
        try:
            p = evaluate(swl, sub, mesh=mesh, rules=rules, graph=sg)
        except AutolayoutError:
            continue
        s = p.predicted
        k = (not s["fits"], s["step_time_s"] if s["fits"] else s["memory_bytes_per_device"])
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
    deterministic: bool = False,
) -> tuple[Plan | None, list[dict[str, Any]], str]:
    """The best pipelined plan of ``workload`` on ``hw`` (``None`` where there is none), what
    was tried (one row per candidate), and why there is none. ``plan_fn``: the planner, for a
    stage's full search."""
    t0 = time.perf_counter()
    g = trace(workload) if graph is None else graph
    stack = find_stack(g)
    if isinstance(stack, str):
        return None, [], stack
    if schedule not in RUNNABLE and schedule != "1f1b":
        raise ValueError(f"schedule must be one of {', '.join(RUNNABLE)} or 1f1b")
    cands = candidates(g, stack, hw, stages, microbatches)
    if not cands:
        return None, [], (
            f"no stage count divides both the {stack.length} {stack.dim} and the slowest level "
            f"of {hw.name}, with a batch of {g.dims[stack.batch]} cut into microbatches"
        )
    limit = memory_limit if memory_limit is not None else hw.hbm_limit_bytes
    tried, priced = [], []
    for P, M in cands:
        if time.perf_counter() - t0 > time_limit_s / 2 and priced:
            tried.append({"stages": P, "microbatches": M, "status": "SKIPPED"})
            continue
        sub = stage_hardware(hw, P)
        try:
            swl = stage_workload(workload, g, stack, P, M)
            sg = trace(swl)
        except Exception as e:  # a model that does not trace at a stage's shapes
            tried.append({"stages": P, "microbatches": M, "status": "ERROR",
                          "error": f"{type(e).__name__}: {e}"[:200]})  # fmt: skip
            continue
        hand = _hand_best(swl, sg, sub)
        if hand is None:
            continue
        pp = pipelined_plan(workload, g, hw, hand, stack, P, M, schedule, memory_limit=limit)
        s = pp.predicted
        tried.append({"stages": P, "microbatches": M, "status": "HAND",
                      "stage_mesh": dict(hand.mesh), "step_time_s": s["step_time_s"],
                      "memory_bytes_per_device": s["memory_bytes_per_device"],
                      "fits": bool(s["fits"]), "bubble": s["pipeline"]["bubble"]})  # fmt: skip
        priced.append((not s["fits"], s["step_time_s"], P, M, swl, sg, sub, hand, pp))
    if not priced:
        return None, tried, "no candidate stage layout could be priced"
    priced.sort(key=lambda r: r[:2])
    best = priced[0][-1]
    top = priced[:FULL]
    share = max(1.0, (time_limit_s - (time.perf_counter() - t0)) / len(top))
    for _, _, P, M, swl, sg, sub, hand, pp in top:
        if plan_fn is None:
            break
        s, hs = pp.predicted, hand.predicted
        # what the pipeline adds to one stage's step, as the hand layout has it
        extra = s["memory_bytes_per_device"] - hs["memory_bytes_per_device"]
        if limit - extra <= 0:
            continue
        try:
            inner = plan_fn(swl, sub, graph=sg, memory_limit=limit - extra,
                            time_limit_s=share, deterministic=deterministic)  # fmt: skip
        except AutolayoutError as e:
            tried.append({"stages": P, "microbatches": M, "status": "ERROR", "error": str(e)})
            continue
        if inner.status == "INFEASIBLE":
            continue
        full = pipelined_plan(workload, g, hw, inner, stack, P, M, schedule, memory_limit=limit)
        f = full.predicted
        tried.append({"stages": P, "microbatches": M, "status": "SEARCHED",
                      "stage_mesh": dict(inner.mesh), "step_time_s": f["step_time_s"],
                      "memory_bytes_per_device": f["memory_bytes_per_device"],
                      "fits": bool(f["fits"]), "bubble": f["pipeline"]["bubble"]})  # fmt: skip
        b = best.predicted
        if (not f["fits"], f["step_time_s"]) < (not b["fits"], b["step_time_s"]):
            best = full
    best.solver["pipeline"]["tried"] = tried
    best.solver["wall_s"] = time.perf_counter() - t0
    return best, tried, ""
