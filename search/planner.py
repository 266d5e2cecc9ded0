"""``al.plan``: the layout and mesh shape with the least predicted step time that fits.

Per mesh shape (:mod:`.meshes`):

1. **Seeds.** Mesh-TF rule sets (dim -> mesh axes) priced from the request: no rules, the
   hand layouts that fit the shape (DP, FSDP, Megatron, 2-D, Megatron+FSDP, spatial), expert
   parallelism where there are experts, and a greedy descent that adds or removes one (dim,
   mesh axis) at a time while the step time falls (a layout that does not fit in memory
   counts as slower than any that does).
2. **ILP** (:mod:`.ilp`). Where the whole formulation is small (``full_limit`` strategy
   pairs) one CP-SAT model over every strategy of every node, exact: ``OPTIMAL`` means no
   layout in the search space is faster. Elsewhere a neighbourhood search: CP-SAT over, per
   node, the incumbent's strategy, every strategy that moves one mesh axis to another group,
   and the seeds' strategies; repeated while it improves. The result is then ``FEASIBLE``.
3. **Memory rows** are added where a solution breaks the limit (at its liveness peak) and
   the model solved again, until the solution fits or the model is infeasible.

Shapes are refined best seed first; a shape whose lower bound (``Request.lower_bound``, where
the request is small) is no better than the best found is ``PRUNED``, and one whose best
seed is more than ``prune`` times the best refined step time is recorded with its seed and
not refined (where its lower bound is not known). Every shape tried is kept in
``plan.solver["mesh_shapes_tried"]``. The plan is ``OPTIMAL`` only where its shape's whole
ILP is, and every other shape's too or its bound rules it out.
"""

from __future__ import annotations

import contextvars
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autolayout.core import (
    DEFAULT_GAP,
    DEFAULT_REMAT,
    DEFAULT_SCHEDULE,
    DEFAULT_TIME_LIMIT_S,
    AutolayoutError,
    Graph,
    Hardware,
    Plan,
    PlanError,
    Workload,
    accumulation_refusal,
    check_gap,
    check_limit,
    checkpoint_names,
    gc_paused,
    hardware,
    mesh_text,
    names_policy,
    parse_remat,
    target_mismatch,
    trace,
)
from autolayout.core import remat as remat_workload
from autolayout.cost_models import (
    check_mesh,
    donated_inputs,
    evaluate,
    liveness_peak,
    recomputed_ops,
)

from .accumulation import better as accumulation_better
from .accumulation import plan_accumulation, written_memory
from .accumulation import record as record_accumulation
from .accumulation import why_chosen as accumulation_why
from .baselines import layouts_and_misses
from .bound import lp_bound
from .clock import WORK_SHARE, Clock, active, charge, clock, now, using, wall_slack
from .final import LP_SHARE, _to_plan, tighten_bound
from .interrupt import interrupted, interruptible
from .meshes import mesh_shapes
from .pipeline import plan_pipelined, rank
from .refine import FULL_LIMIT, least_memory, refine
from .request import build
from .seeds import ShapeResult, _score, seeds
from .structure import analyse_on

AS_WRITTEN = "as_written"  # a nested search plans the step it is given, as it is
# remat="auto"'s first search: the clock time by which the step as written must have a fitting
# layout from the hand layouts or the greedy descent, else it ends (None: search in full)
_PROBE: contextvars.ContextVar[float | None] = contextvars.ContextVar("probe", default=None)
REFINE = 3  # shapes refined by the ILP (best seeds first)
# past those, a shape whose best seed is within this factor of the best answer so far is
# refined too while time is left: refinement can take a seed past the others' answers (a
# Llama-8B shape on h100-64: 8x8's seed, unrefined, lost to 4x4x4's answer; refined, 8x8
# wins), and the plan must not be worse than the answer on a mesh the user could fix
REFINE_MORE = 1.25
LEAST_MEMORY_S = 1.0  # time left below which nothing-fits skips the least-memory search
FINAL_SHARE = 0.5  # of the time limit kept for pricing the winner exactly, at most
# the time kept for the final pricing, from the analysis's: pricing the winner, the report's
# rows and the collection after the pause take 1.1-1.4x it (GPT-3 96 layers), a fixed part
# (a 1-layer step's 0.1 s), and a fitting hand layout priced exactly besides 0.5x more
FINAL_FACTOR, FINAL_FIXED_S, FINAL_HAND_FACTOR = 1.4, 0.1, 0.5
SEED_SHARE = 0.5  # of the time left that pricing the hand layouts on every shape may take
SWEEP_SHARE = 0.5  # of the time left for the greedy descent on every shape, when nothing fits


@interruptible
def plan(
    workload: Workload,
    hw: Hardware | str,
    *,
    mesh: Mapping[str, int] | None = None,
    memory_limit: int | None = None,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    share: bool = True,
    graph: Graph | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    prune: float = 1.5,
    full_limit: int = FULL_LIMIT,
    refine_shapes: int = REFINE,
    objective: str = "time",
    deterministic: bool = True,
    remat: str = DEFAULT_REMAT,
    pipeline: bool = False,
    stages: int | None = None,
    microbatches: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    started_at: float | None = None,
    gap: float = DEFAULT_GAP,
) -> Plan:
    """Searches layouts and mesh shapes for the least predicted step time that fits in
    memory (``memory_limit`` bytes per device; default the profile's HBM x headroom).

    ``time_limit_s`` bounds the whole call, tracing included, on the wall clock (from
    ``started_at``, a ``time.perf_counter()`` reading, where the caller began earlier: the
    CLI before loading the model). ``deterministic`` (the default): the search's budget
    counts work, not seconds (CP-SAT's deterministic time with one worker and a fixed seed,
    a fixed charge per candidate priced, request built and op traced; :mod:`.clock`), so one
    question gives one plan on an idle or a busy machine; the wall clock is a safety stop
    only: where it ends the search, ``plan.solver["deterministic"]`` is False and
    ``plan.solver["stopped"]`` says so. ``deterministic=False``: the search uses the wall
    clock's seconds (an answer that may depend on the machine's load).

    ``remat``: ``"auto"`` (the default, the command line's too), ``"as_written"`` (the step
    as it is), a policy of :func:`al.remat` (``"dots_saveable"``,
    ``"nothing_saveable+regather"``, ...). ``"auto"``: the step as
    written where a plan of it fits, else each policy ranked on a share of the budget, and
    the fastest that fits searched with the rest (``plan.solver["remat"]`` says what was
    chosen, the FLOPs recomputed and what was tried).

    ``pipeline``: also try pipeline stages (a scanned layer stack split over a ``stage``
    axis, the batch cut into microbatches; ``stages`` / ``microbatches`` fix them, and imply
    it); half the budget goes to each, and the faster that fits is returned
    (``plan.solver["pipeline"]`` on a pipelined plan, ``plan.solver["pipeline_choice"]`` on
    both: what each would take).

    ``objective="memory"`` is Mesh-TF's auto_mtf objective instead: the least peak memory
    per device (ties: the faster), whether or not it fits.

    ``gap``: the stopping rule (default 2%): a mesh shape's whole ILP ends once its plan is
    within ``gap`` of its bound, and a shape whose lower bound is within ``gap`` of the best
    plan is not searched; ``"OPTIMAL"`` means proven within it over every mesh shape (as a
    MIP solver's relative gap), and ``plan.solver["gap"]`` says the gap on the plan's mesh.
    ``gap=0``: proven exactly.
    """
    if objective not in ("time", "memory"):
        raise ValueError(f"objective must be 'time' or 'memory', got {objective!r}")
    hw = hardware(hw) if isinstance(hw, str) else hw
    if active() is None:  # the call itself: its clock, and the limit made a budget
        return _call(workload, hw, time_limit_s, deterministic, started_at, gap, dict(
            mesh=mesh, memory_limit=memory_limit, share=share, graph=graph,
            progress=progress, prune=prune, full_limit=full_limit,
            refine_shapes=refine_shapes, objective=objective, remat=remat,
            pipeline=pipeline, stages=stages, microbatches=microbatches, schedule=schedule))  # fmt: skip
    # inside a call: ``time_limit_s`` is this part's share of its budget, in clock units
    kw = dict(mesh=mesh, memory_limit=memory_limit, time_limit_s=time_limit_s, share=share,
              progress=progress, prune=prune, full_limit=full_limit,
              refine_shapes=refine_shapes, objective=objective)  # fmt: skip
    if pipeline or stages:
        return _with_pipeline(workload, hw, graph, kw, remat, stages, microbatches, schedule)
    if microbatches:  # without stages: gradient accumulation over that many (search/accumulation)
        return _fixed_accumulation(workload, hw, graph, kw, remat, microbatches)
    if remat == "auto":
        return _auto_remat(workload, hw, graph, kw)
    if remat != AS_WRITTEN:
        return plan(remat_workload(workload, *parse_remat(remat)), hw, remat=AS_WRITTEN, **kw)
    # (the collector is paused for the whole call: _call)
    p = _plan(workload, hw, mesh, memory_limit, time_limit_s, share, graph, progress, prune,
              full_limit, refine_shapes, objective)  # fmt: skip
    clock().mark("final")  # pricing the winner exactly, the report's tables
    _record_remat(p, workload.options.get("remat_policy", "as_written"))
    return p


def _call(workload, hw, time_limit_s, deterministic, started_at, gap, kw) -> Plan:
    """One ``al.plan`` call: a clock whose wall-clock stop is the time limit from
    ``started_at``, and a budget of :data:`WORK_SHARE` of the limit in work (deterministic)
    or the seconds left (wall clock)."""
    check_limit("time_limit_s", time_limit_s, "seconds")
    check_gap("gap", gap)
    if kw["memory_limit"] is not None:
        check_limit("memory_limit", kw["memory_limit"], "bytes")
    if (why := target_mismatch(workload, hw.kind)) is not None:
        warnings.warn(why, stacklevel=4)  # past _call, plan and its interruptible wrapper
    start = time.perf_counter() if started_at is None else started_at
    # the collector off for the whole call (not each phase): after a phase, each collection
    # walked every graph, request and table it kept; GPT-3 175B at 96 layers, remat=auto:
    # 20.9-22.0 s with it, 16.9-18.6 s without, the same peak memory (0.63 GiB)
    with (
        gc_paused(),
        using(Clock(deterministic, wall_end=start + time_limit_s * wall_slack(), gap=gap)) as c,
    ):
        budget = (
            WORK_SHARE * time_limit_s
            if deterministic
            else start + time_limit_s - time.perf_counter()
        )
        c.end = c.now() + budget
        c.limit_s = float(time_limit_s)
        p = plan(workload, hw, time_limit_s=budget, **kw)
        # the plan's bound from the work the search left (at least what the winner's had),
        # ending by the wall-clock stop
        work = max(LP_SHARE * time_limit_s, c.end - c.now())
        tighten_bound(p, gap, min(work, c.wall_left()) if not c.walled else 0.0)
        c.mark("bound")
    p.solver["phases_s"] = dict(c.phases)
    p.solver["wall_s"] = time.perf_counter() - start
    p.solver["time_limit_s"] = float(time_limit_s)
    p.solver["gap_limit"] = float(gap)
    p.solver["deterministic"] = deterministic and not c.walled
    if deterministic:
        p.solver["work_s"] = c.virtual
    if c.walled:
        p.solver["stopped"] = (
            f"the wall-clock limit ({time_limit_s:g} s) came before the search's work was done: "
            "this plan may differ between runs (a larger --time-limit gives a reproducible one)"
        )
    return p


def _with_pipeline(workload, hw, graph, kw, remat, stages, microbatches, schedule) -> Plan:
    """``plan(pipeline=True)``: the plan without stages and the best pipelined one, half the
    time each; the faster that fits (a pipeline where ``stages`` is given and one fits)."""
    hw = hardware(hw) if isinstance(hw, str) else hw
    half = dict(kw, time_limit_s=kw["time_limit_s"] / 2)
    mesh = half.pop("mesh")
    if mesh and "stage" in mesh:
        stages = stages or mesh["stage"]
    inner_mesh = {a: n for a, n in mesh.items() if a != "stage"} if mesh else None
    base = None
    if not stages:
        base = plan(workload, hw, graph=graph, mesh=mesh, remat=remat, **half)

    def stage_plan(swl, sub, **k):  # one stage's step, searched in full
        return plan(swl, sub, mesh=inner_mesh, objective=kw["objective"], remat=AS_WRITTEN, **k)

    pp, tried, why = plan_pipelined(
        workload, hw, graph=graph, time_limit_s=half["time_limit_s"],
        memory_limit=kw["memory_limit"], stages=stages, microbatches=microbatches,
        schedule=schedule, plan_fn=stage_plan,
    )  # fmt: skip
    if pp is None and base is None:
        raise PlanError(f"cannot pipeline: {why}")

    better = pp is not None and (base is None or rank(pp.predicted) < rank(base.predicted))
    chosen = pp if better else base
    side = {
        "without": None if base is None else {
            "mesh": dict(base.mesh), "step_time_s": base.predicted["step_time_s"],
            "memory_bytes_per_device": base.predicted["memory_bytes_per_device"],
            "fits": bool(base.predicted["fits"]), "mfu": base.predicted["mfu"]},
        "with": None if pp is None else {
            "mesh": dict(pp.mesh), "step_time_s": pp.predicted["step_time_s"],
            "memory_bytes_per_device": pp.predicted["memory_bytes_per_device"],
            "fits": bool(pp.predicted["fits"]), "mfu": pp.predicted["mfu"],
            "microbatches": pp.solver["pipeline"]["microbatches"]},
        "why_none": why,
        "tried": tried,
    }  # fmt: skip
    chosen.solver["pipeline_choice"] = side
    return chosen


# the policies remat="auto" tries where the step as written does not fit: each saves less
# or gathers again; with and without the re-gather (it costs all-gathers where the saved
# activations already fit: gpt3-xl scan=true on tpu-v4-256, dots_saveable MFU 0.63 against
# dots_saveable+regather 0.62)
REMAT_CANDIDATES = ("dots_saveable", "regather", "dots_saveable+regather", "nothing_saveable",
                    "nothing_saveable+regather")  # fmt: skip
# remat="auto" splits its budget: the step as written first (AUTO_FIRST of it); where that
# fits, the rest searches it again from scratch and the faster plan is kept; where it does
# not, AUTO_RANK of what is left ranks the candidates (each its equal part: a search of its
# own, since priced in the as-written plan's layout none fitted there and the least memory
# won, nothing_saveable+regather at MFU 0.56 where dots_saveable fits at 0.63, gpt3-xl
# scan=true on tpu-v4-256), and the fastest that fits is searched with the rest
AUTO_FIRST, AUTO_RANK = 0.3, 0.5


def remat_candidates(graph: Graph | None, hw: Hardware | str) -> tuple[str, ...]:
    """The policies ``remat="auto"`` tries: :data:`REMAT_CANDIDATES`; where the step has
    matmuls over a batch dim (attention's scores and probabilities, materialised), saving
    only the weight matmuls' results (Megatron-LM's selective recomputation); where the
    step tags values with ``checkpoint_name``, saving those (with and without the
    re-gather); where the profile has a host link, what dots_saveable / nothing_saveable
    save kept in host memory."""
    batched = graph is not None and any(
        op.primitive == "dot_general" and op.param("batch") for op in graph.ops
    )
    selective = ("dots_with_no_batch_dims_saveable",) if batched else ()
    tags = checkpoint_names(graph) if graph is not None else []
    named = (names_policy(tags), names_policy(tags) + "+regather") if tags else ()
    host = (hw if isinstance(hw, Hardware) else hardware(hw)).chip.host_bandwidth
    offloaded = ("dots_saveable+offload", "nothing_saveable+offload") if host else ()
    return REMAT_CANDIDATES + selective + named + offloaded


def memory_floor(workload: Workload | None, graph: Graph, hw: Hardware) -> tuple[int, int]:
    """The least bytes a device needs for ``graph``'s step under any layout, and its
    activations at that peak: every tensor split evenly over every device, in the schedule
    XLA runs (a layout splits no tensor finer, and its resharded copies only add)."""
    n = max(1, hw.num_devices)
    mem = liveness_peak(
        graph, lambda t: -(-graph.tensors[t].nbytes // n), donated_inputs(workload, graph),
        compiler=hw.efficiency,
    )  # fmt: skip
    return mem.peak_bytes, mem.by_category.get("activations", 0)


def _auto_remat(workload: Workload, hw: Hardware | str, graph: Graph | None, kw: dict) -> Plan:
    """``plan(remat="auto")``: the step as written if it fits; else the policies of
    :func:`remat_candidates` the budget can plan ranked on an equal part of a share of it,
    and the fastest that fits (else the one that needs least memory) searched with the
    rest."""
    budget = kw["time_limit_s"]
    end = now() + budget
    if graph is None:
        graph = trace(workload)
        charge(Clock.TRACE_OP_S * len(graph.ops))
    # what one plan of this step takes at the least: traced, seeded on a shape, priced
    least = Clock.least_work(len(graph.ops)) if clock().deterministic else 0.0
    hw = hardware(hw) if isinstance(hw, str) else hw
    limit = kw["memory_limit"] if kw["memory_limit"] is not None else hw.hbm_limit_bytes
    floor = memory_floor(workload, graph, hw)

    def as_written(seconds: float) -> Plan:
        return plan(workload, hw, graph=graph, remat=AS_WRITTEN, **dict(kw, time_limit_s=seconds))

    first = None
    if floor[0] <= limit:
        # the step as written with the whole budget: a step that fits is searched as remat=
        # "as_written" searches it; one whose hand layouts and greedy descent fit nowhere by
        # AUTO_FIRST of the budget ends there, and the candidates share the rest
        token = _PROBE.set(now() + min(budget, max(AUTO_FIRST * budget, least)))
        try:
            first = as_written(budget)
        finally:
            _PROBE.reset(token)
        if interrupted() or first.status != "INFEASIBLE":  # a Ctrl-C: the answer so far
            return first
    # else no layout fits it (its tensors split evenly over every device need more): the
    # candidates have the whole budget (HF Mistral-7B on h100-64: 5 s of a 30 s limit)
    # gradient accumulation takes ACCUMULATION_SHARE of what is left (search/accumulation)
    acc_end, end = end, _accumulation_split(workload, end)
    cands = remat_candidates(graph, hw)
    share = AUTO_RANK * max(0.0, end - now())  # nothing where the wall-clock stop has come
    fit = max(1, min(len(cands), int(share // least))) if least > 0 else len(cands)
    each = share / fit
    order = list(cands)
    written = floor if first is None else written_memory(first)
    if fit < len(cands) and written[0] > 2 * limit:
        order.sort(key=_saving_rank)  # far from fitting: the policies that save most first
    tried: dict[str, dict] = {}
    best = None

    def rank(tag: str, seconds: float) -> None:
        nonlocal best
        try:
            wl = remat_workload(workload, *parse_remat(tag))
            p = plan(wl, hw, remat=AS_WRITTEN, **dict(kw, time_limit_s=seconds))
        except AutolayoutError as e:  # a step the rewrite or the search refuses
            tried[tag] = {"policy": tag, "error": str(e)}
            return
        s = p.summary()
        fits = p.status != "INFEASIBLE"
        tried[tag] = {"policy": tag, "fits": fits, "step_time_s": s["step_time_s"],
                      "memory_bytes_per_device": s["memory_bytes_per_device"],
                      "mesh": dict(p.mesh)}  # fmt: skip
        key = (not fits, s["step_time_s"] if fits else s["memory_bytes_per_device"])
        if best is None or key < best[0]:
            best = (key, wl, p)

    for tag in order[:fit]:
        if interrupted() or clock().walled:  # the stop came: the answer so far
            break
        rank(tag, each)
    # none of those fits: the budget kept for searching one further, and half of gradient
    # accumulation's, go to ranking the policies that save more, most first (bloom-7b1 on
    # tpu-v5p-128 ranked dots_saveable alone and answered INFEASIBLE, most budget unused)
    extra_end = end + 0.5 * max(0.0, acc_end - end)
    for tag in sorted(order[fit:], key=_saving_rank):
        left = extra_end - now()
        if (
            (best is not None and not best[0][0])
            or interrupted()
            or clock().walled
            or left <= least
        ):
            break
        rank(tag, min(each, left))
    for tag in order:
        tried.setdefault(tag, {"policy": tag,
                               "error": "not ranked: the time limit leaves no budget for it"})  # fmt: skip
    in_order = [tried[t] for t in cands]
    if best is None:
        if first is None:  # the answer: the step as written, with what is left
            first = as_written(max(0.0, end - now()))
        first.solver["remat"]["tried"] = in_order
        return _then_accumulate(first, workload, hw, graph, kw, acc_end, written)
    # the chosen step searched with the rest, on the graph its ranking traced; the ranking's
    # own plan where that search came out slower, where the wall-clock stop has come, or
    # where the rest is no more than the ranking had (a search on less budget does no more:
    # GPT-3 175B's 96 layers at 60 s searched again on none, 2.9 s to price the same plan)
    ranked = chosen = best[2]
    if not clock().walled and end - now() > each:
        chosen = _faster(
            ranked, plan(best[1], hw, graph=ranked.graph, remat=AS_WRITTEN, **dict(kw, time_limit_s=end - now()))
        )  # fmt: skip
    chosen.solver["remat"]["tried"] = in_order
    chosen.solver["remat"]["ranked_s"] = each
    return _then_accumulate(chosen, workload, hw, graph, kw, acc_end, written)


ACCUMULATION_SHARE = 0.5  # of what remat="auto" has left where the step as written does not fit


def _accumulation_split(workload: Workload, end: float) -> float:
    """Where ``remat="auto"``'s candidates end when gradient accumulation is tried after
    them: :data:`ACCUMULATION_SHARE` of the budget left goes to it (none where the step
    cannot accumulate)."""
    if accumulation_refusal(workload) is not None:
        return end
    return now() + (1 - ACCUMULATION_SHARE) * max(0.0, end - now())


def _then_accumulate(chosen, workload, hw, graph, kw, acc_end, written) -> Plan:
    """``remat="auto"``'s plan ``chosen`` (where the step as written does not fit: it needs
    ``written``, bytes and activations a device, at the least), or the step accumulated over
    microbatches where that fits where ``chosen`` does not, or is faster; searched until
    ``acc_end``."""
    why = accumulation_refusal(workload)
    if why is None and interrupted():
        why = "interrupted"
    elif why is None and clock().walled:
        why = "not tried: the wall-clock limit came first"
    elif why is None and chosen.status != "INFEASIBLE" and acc_end - now() <= 0:
        # it would compete on time alone; where ``chosen`` does not fit it is tried whatever
        # is left (the least it takes): it is the step's one way left to fit
        why = "not tried: the time limit leaves no budget for it (the step without it fits)"
    if why is not None:
        return record_accumulation(chosen, 1, why)
    pol = chosen.solver.get("remat", {}).get("policy", AS_WRITTEN)
    # where ``chosen`` fits, accumulating can win only by sparing its recomputation: the
    # step as written; its own policy over microbatches recomputes as much, and gathers more.
    # Where it does not, its policy first (it saves more: the likelier to fit)
    policies = (pol, AS_WRITTEN) if chosen.status == "INFEASIBLE" else (AS_WRITTEN,)
    acc, tried, none = plan_accumulation(
        workload, hw, plan_fn=plan, kw=kw, budget=max(0.0, acc_end - now()), graph=graph,
        base=chosen, policies=policies, written=written,
    )  # fmt: skip
    if accumulation_better(chosen, acc):
        # the policies remat="auto" ranked for the step without accumulation
        acc.solver["remat"]["tried"] = (
            acc.solver["remat"]["tried"] or chosen.solver["remat"]["tried"]
        )
        return record_accumulation(acc, acc.options["accumulation"],
                                   accumulation_why(acc, chosen, None), tried)  # fmt: skip
    if chosen.status != "INFEASIBLE":
        why = "the step without accumulation fits"
    else:
        why = none or "no microbatch count tried fits either"
    return record_accumulation(chosen, 1, why, tried)


def _fixed_accumulation(workload, hw, graph, kw, remat, microbatches) -> Plan:
    """``plan(microbatches=k)`` without stages: the step's gradients accumulated over ``k``
    microbatches; remat as asked (``"auto"``: as written, else the policies that save most,
    the budget split between them, the fastest that fits)."""
    if remat == "auto":
        policies = (AS_WRITTEN, "dots_saveable", "nothing_saveable")
    else:
        policies = (remat,)
    acc, tried, why = plan_accumulation(
        workload, hw, plan_fn=plan, kw=kw, budget=kw["time_limit_s"], graph=graph,
        fixed=microbatches, policies=policies,
    )  # fmt: skip
    if acc is None:
        raise PlanError(f"cannot accumulate gradients over {microbatches} microbatches: {why}")
    return record_accumulation(acc, microbatches, accumulation_why(acc, None, microbatches), tried)


# the policies by what they save, most first (where few can be ranked and the step as
# written needs more than twice the memory: one that saves little would not fit); the
# re-gather first (it keeps no gathered weight: GPT-3 175B on tpu-v4-1024 at 60 s ranked
# nothing_saveable alone, 53 GiB of 28.8, and answered 128 microbatches at MFU 0.065, where
# nothing_saveable+regather fits at 0.55); offload after the others that save much (the
# host link is slow: it fits where nothing else does)
SAVING = ("nothing_saveable+regather", "nothing_saveable", "save_only_these_names",
          "dots_with_no_batch_dims_saveable", "nothing_saveable+offload",
          "dots_saveable+regather", "dots_saveable", "dots_saveable+offload", "regather")  # fmt: skip


def _saving_rank(tag: str) -> int:
    base = tag.split(":")[0]  # save_only_these_names:a,b[+regather]
    return SAVING.index(base) if base in SAVING else SAVING.index("save_only_these_names")


def _faster(a: Plan, b: Plan) -> Plan:
    """The plan that fits (``b`` where both or neither do) and is faster (``a`` on a tie)."""
    if (a.status == "INFEASIBLE") != (b.status == "INFEASIBLE"):
        return b if a.status == "INFEASIBLE" else a
    if b.status == "INFEASIBLE":
        return b
    return b if b.predicted["step_time_s"] < a.predicted["step_time_s"] else a


def _record_remat(p: Plan, tag: str) -> None:
    """``plan.solver["remat"]``: the policy the step was planned with, the FLOPs its
    recomputation adds per device, and the policies ``remat="auto"`` tried (none here)."""
    again = recomputed_ops(p.graph) if p.graph is not None else set()
    flops = (
        sum(op.flops * op.trip_count for op in p.graph.ops if op.name in again) if again else 0.0
    )
    p.solver["remat"] = {"policy": tag, "recompute_flops_per_device": flops / max(p.devices, 1),
                         "tried": []}  # fmt: skip


def _plan(workload, hw, mesh, memory_limit, time_limit_s, share, graph, progress, prune,
          full_limit, refine_shapes, objective) -> Plan:  # fmt: skip
    t0 = time.perf_counter()
    c = clock()
    # a part's share may come negative where the budget or the stop has passed: none left
    # (a negative share made the reserves below negative and moved the wall stop past them)
    time_limit_s = max(0.0, time_limit_s)
    deadline = min(now() + time_limit_s, c.end)
    hw = hardware(hw) if isinstance(hw, str) else hw
    if graph is None:
        graph = trace(workload)
        charge(Clock.TRACE_OP_S * len(graph.ops))
    t_trace = time.perf_counter() - t0
    c.mark("trace")
    limit = int(memory_limit if memory_limit is not None else hw.hbm_limit_bytes)
    donated = donated_inputs(workload, graph)
    ta = time.perf_counter()
    st = analyse_on(graph, hw, share=share, donated=donated)
    charge(Clock.ANALYSE_OP_S * len(graph.ops))
    c.mark("analyse")
    shapes = [check_mesh(hw, mesh)] if mesh is not None else mesh_shapes(hw)
    # kept for the final exact pricing (walks like analyse's), and for pricing a fitting hand
    # layout exactly while one may fit: in work where the clock counts work, and on the wall
    # clock (the safety stop) either way
    analyse_s = time.perf_counter() - ta
    final = min(FINAL_FIXED_S + FINAL_FACTOR * analyse_s, FINAL_SHARE * time_limit_s)
    hand_s = min(FINAL_HAND_FACTOR * analyse_s, FINAL_SHARE * time_limit_s - final)
    if c.deterministic:
        work = min(Clock.final_work(len(graph.ops)), FINAL_SHARE * time_limit_s)
        final_res, hand_res = work, min(FINAL_HAND_FACTOR * work, FINAL_SHARE * time_limit_s - work)
    else:
        final_res, hand_res = final, hand_s
    deadline -= final_res + hand_res
    wall_end = c.wall_end
    c.wall_end = wall_end - final - hand_s  # the search's own safety stop
    try:
        win, results, status, stopped = _search(
            graph, hw, st, shapes, mesh, limit, deadline, hand_res, progress, prune,
            full_limit, refine_shapes, objective, workload, t0, t_trace,
        )  # fmt: skip
    finally:
        c.wall_end = wall_end
    if isinstance(win, Plan):  # objective="memory" answers with a plan
        return win
    p = _to_plan(workload, graph, hw, win, results, status, limit, t0, t_trace, st)
    charge(Clock.final_work(len(graph.ops)))
    p.solver["stopped"] = stopped
    return p


def _search(graph, hw, st, shapes, mesh, limit, deadline, hand_s, progress, prune, full_limit,
            refine_shapes, objective, workload, t0, t_trace):  # fmt: skip
    """Seeds every shape, refines the best, and picks the winner: ``(winner, every shape's
    result, status, why the search stopped early)``; a plan where ``objective="memory"``.
    ``hand_s``: kept from the budget for pricing a fitting hand layout exactly at the end,
    given back where none fits."""
    slots: list[ShapeResult | None] = [None] * len(shapes)
    # 1. the hand layouts on every shape, in half the time left at most (the rest refines)
    seed_deadline = now() + SEED_SHARE * (deadline - now())
    for k, i in enumerate(seed_order(shapes)):
        shape = shapes[i]
        ts = time.perf_counter()
        if now() > seed_deadline and k:
            note = f"time limit (seeding takes {SEED_SHARE:.0%} of the time limit at most)"
            slots[i] = ShapeResult(dict(shape), None, "SKIPPED", 0.0, note=note)
            continue
        req = build(st, hw, shape)
        charge(Clock.BUILD_STRATEGY_S * sum(len(n.strategies) for n in req.nodes))
        sd = seeds(req, limit, deadline, greedy=False)
        best = min(sd.values(), key=lambda c: _score(c, limit)) if sd else None
        r = ShapeResult(dict(shape), best, "SEEDED", time.perf_counter() - ts, request=req,
                        named=mesh is not None)  # fmt: skip
        r.seeds = {name: c.step_time_s for name, c in sd.items()}
        r.hand = dict(sd)
        slots[i] = r
        if progress:
            progress({"stage": "seed", "mesh": dict(shape), "done": k + 1, "of": len(shapes)})
    results: list[ShapeResult] = slots  # type: ignore[assignment]  # in enumeration order
    clock().mark("seed")
    if not any(c.fits(limit) for r in results for c in (r.hand or {}).values()):
        deadline += hand_s  # no hand layout to price exactly at the end (_hand_exactly)
    if objective == "memory":
        p = _least_memory_plan(workload, graph, hw, results, limit, deadline, t0, t_trace, st,
                               refine_shapes, progress)  # fmt: skip
        return p, results, p.status, ""
    # 2. greedy rules and the ILP on the shapes with the best seeds
    order = sorted((r for r in results if r.best is not None), key=lambda r: _score(r.best, limit))
    if order and not any(r.best.fits(limit) for r in order):
        probe = _PROBE.get()  # remat="auto" asks first whether the step as written fits
        order = _sweep(order, limit, deadline if probe is None else max(now(), probe))
        if probe is not None and not any(r.best.fits(limit) for r in order):
            win = min(order, key=lambda r: r.best.memory_bytes)
            win.least_memory = win.best.memory_bytes
            win.note = "nothing fits as written (hand layouts and the greedy descent): no ILP"
            return win, results, "INFEASIBLE", "no layout of the step as written fits"
    best_time = math.inf
    refined = 0  # shapes refined so far (a pruned one takes no turn)

    # the best fitting seed until a shape is refined (answers only fall below it)
    seeded_best = min((r.best.step_time_s for r in order if r.best.fits(limit)), default=math.inf)

    def near(q: ShapeResult) -> bool:  # a seed close enough to the best answer to refine
        ref = min(best_time, seeded_best)
        return q.best.fits(limit) and q.best.step_time_s <= REFINE_MORE * ref

    for k, r in enumerate(order):
        ts = time.perf_counter()
        if now() < deadline and _pruned(r, best_time, full_limit, clock().gap):
            continue
        if refined >= refine_shapes and not near(r):  # past the best few, near ones too
            r.status, r.note = "SEEDED", f"not among the {refine_shapes} best seeded shapes"
            continue
        if r.lower_bound is None and r.best.fits(limit) and r.best.step_time_s > prune * best_time:
            r.status, r.note = "SEEDED", f"best seed {r.best.step_time_s / best_time:.2f}x the best"
            continue
        left = deadline - now()
        if left <= 0.1:
            r.status, r.note = "SEEDED", "time limit"
            continue
        # this one and those to come share what time is left: the best few, then the near
        # ones (counting only the best few left 2x4's near seed on cpu-8 no time after a
        # 2x2x2 ILP took the rest: 2x4 refined alone is 1.3% faster than the plan was)
        rest = order[k + 1 :]
        ahead = max(0, refine_shapes - refined - 1)
        turns = 1 + min(len(rest), ahead) + sum(near(q) for q in rest[ahead:])
        refined += 1
        if r.greedy is None:  # made already where the sweep reached the shape
            r.greedy = seeds(r.request, limit, now() + left / turns / 3)
            r.seeds.update({name: c.step_time_s for name, c in r.greedy.items()})
        sd = r.greedy
        start = min(sd.values(), key=lambda c: _score(c, limit))
        best, status, nv, nc = refine(
            r.request, limit, start, list(sd.values()), (deadline - now()) / turns, full_limit
        )
        r.best, r.status, r.variables, r.constraints = best, status, nv, nc
        r.wall_s += time.perf_counter() - ts
        if best.fits(limit):
            best_time = min(best_time, best.step_time_s)
        if progress:
            progress({"stage": "solve", "mesh": r.mesh, "done": refined,
                      "of": min(len(order), refine_shapes), "step_time_s": best.step_time_s})  # fmt: skip
    clock().mark("refine")
    feasible = [r for r in results if r.best is not None and r.best.fits(limit)]
    if feasible:
        win = min(feasible, key=lambda r: r.best.step_time_s)
        status = win.status if win.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT") else "FEASIBLE"
        # optimal on its shape; optimal overall where every other shape was solved exactly
        # or its lower bound rules it out (not where one was only seeded, or skipped)
        if status == "OPTIMAL" and any(
            r is not win and r.status not in ("OPTIMAL", "PRUNED") for r in results
        ):
            status = "FEASIBLE"
    else:
        # nothing fits: report the layout that needs the least memory, and how much
        win = min((r for r in results if r.best is not None), key=lambda r: r.best.memory_bytes)
        left = deadline - now()
        if left >= LEAST_MEMORY_S:  # the ILP's model alone takes seconds to build on 25k nodes
            win.best = least_memory(win.request, win.best, time_limit_s=left)
        else:
            win.note = "time limit: least memory of the layouts tried (no least-memory search)"
        win.least_memory = win.best.memory_bytes
        status = "INFEASIBLE"
        clock().mark("least_memory")
    if status == "TIMEOUT" and now() < deadline - 0.05:  # TIMEOUT is the time limit alone
        status = "FEASIBLE"
    return win, results, status, why_ended(results, win, status, now() >= deadline - 0.05)


def why_ended(results: Sequence[ShapeResult], win: ShapeResult, status: str, spent: bool) -> str:
    """Why the search ended, in one clause a user reads once (``plan.solver["stopped"]``):
    proven, its rounds done, or the budget spent; and the mesh shapes that left unreached."""
    n, skipped = len(results), sum(r.status == "SKIPPED" for r in results)
    if status == "OPTIMAL":
        return "proven over every mesh shape" if n > 1 else "proven"
    if status == "INFEASIBLE":
        head = "no layout tried fits the memory limit"
    elif spent:
        head = "the time limit ended the search"
    else:
        head = "the search's rounds ended before the time limit"
    return head + (f" ({skipped} of {n} mesh shapes not reached)" if skipped else "")


PRUNE_LP_PAIRS = 16_000  # strategy pairs up to which a shape's LP bound may prune it (~0.5 s)
PRUNE_LP_SHARE = 0.02  # of the time limit, the work each shape's LP may take


def _pruned(r: ShapeResult, best_time: float, full_limit: int, gap: float = 0.0) -> bool:
    """Marks ``r`` PRUNED when no layout on its shape can beat ``best_time`` by more than
    ``gap`` (the call's stopping rule): its request's lower bound (every node at its cheapest
    strategy, resharding free) is at least ``best_time / (1 + gap)``.
    Computed where the request is small enough for the whole ILP (whose node costs it
    shares); the bound ignores resharding and memory, so it rules out few shapes of a large
    model, and pricing every strategy there takes seconds."""
    req = r.request
    if req is None or not math.isfinite(best_time) or req.size() > PRUNE_LP_PAIRS:
        return False
    if r.lower_bound is None and req.size() <= full_limit:
        r.lower_bound = req.lower_bound()
    if (r.lower_bound or 0.0) * (1.0 + gap) < best_time and not r.lp_tried:
        # the LP relaxation with resharding (search/bound.py), where per-op does not prune
        r.lp_tried = True
        lp = lp_bound(req, PRUNE_LP_SHARE * clock().limit_s)
        if lp is not None:
            r.lp_bound = lp.bound_s
            r.lower_bound = max(r.lower_bound or 0.0, lp.bound_s)
    if r.lower_bound is None or r.lower_bound * (1.0 + gap) < best_time:
        return False
    r.status = "PRUNED"
    r.note = f"lower bound {r.lower_bound:.4g} s >= the best found {best_time:.4g} s" + (
        f" / (1 + {gap:g})" if r.lower_bound < best_time else ""
    )
    return True


def seed_order(shapes: Sequence[Mapping[str, int]]) -> list[int]:
    """The order mesh shapes are seeded in (indices into ``shapes``): two axes first, then
    one, then three; within each, the balanced ones (largest axis over smallest) first, then
    those with the smaller last axis (the hand layouts' model axis: 32 x 16 before 16 x 32).

    A short time limit seeds only the first few (GPT-3 at 96 layers on tpu-v4-1024 at 5 s:
    one). A 2-D shape's seeds hold the 1-D layouts too (DP, FSDP and Megatron over both
    axes) besides 2-D and Megatron+FSDP, and a large model's best shape is a balanced 2-D
    one (GPT-3 24-96 layers: 32 x 16), which 1-D first left unseeded at 96 layers (the
    5 s plan reported 357 GiB where 32 x 16 needs 58)."""
    rank = {2: 0, 1: 1}
    return sorted(
        range(len(shapes)),
        key=lambda i: (
            rank.get(len(shapes[i]), len(shapes[i])),
            max(shapes[i].values()) / min(shapes[i].values()),
            list(shapes[i].values())[-1],
            i,
        ),
    )


def _sweep(order: list[ShapeResult], limit: int, deadline: float) -> list[ShapeResult]:
    """Nothing the hand layouts give fits on any shape: the shapes ranked by what the greedy
    descent from them reaches, in ``SWEEP_SHARE`` of the time left. A hand seed's memory says
    little about that (GPT-3 24 layers on tpu-v4-1024: a 101.6 GiB seed descends to 31.3 GiB,
    a 56.0 GiB one to 44.3), so refining the best hand seeds reported 44.3 GiB as the least.
    Shapes whose hand seeds agree in memory and time (32x16, 2x16x16, 4x8x16, ...: they
    descend alike) go after one of each; a shape not reached keeps its hand seed."""
    end = now() + SWEEP_SHARE * (deadline - now())
    seen: set[tuple] = set()
    first, rest = [], []
    for r in order:
        key = (r.best.memory_bytes, r.best.step_time_s)
        (rest if key in seen else first).append(r)
        seen.add(key)
    for r in first + rest:
        if now() > end:
            break
        sd = r.greedy = seeds(r.request, limit, end)
        r.seeds.update({name: c.step_time_s for name, c in sd.items()})
        best = min(sd.values(), key=lambda c: _score(c, limit))
        if _score(best, limit) < _score(r.best, limit):
            r.best = best
    return sorted(order, key=lambda r: _score(r.best, limit))


def _least_memory_plan(workload, g, hw, results, limit, deadline, t0, t_trace, st, refine_shapes,
                       progress) -> Plan:  # fmt: skip
    """``objective="memory"``: on the shapes whose seeds need least memory, the ILP that
    minimises the peak memory row (rows added lazily)."""
    seeded = [r for r in results if r.best is not None]
    for r in seeded:  # the seed needing least memory (ties: the faster)
        r.best = min(r.hand.values(), key=lambda c: (c.memory_bytes, c.step_time_s))
    order = sorted(seeded, key=lambda r: (r.best.memory_bytes, r.best.step_time_s))
    for k, r in enumerate(order[:refine_shapes]):
        left = deadline - now()
        ts = time.perf_counter()
        if left <= 0.1:
            r.note = "time limit"
            continue
        r.best = least_memory(
            r.request, r.best, time_limit_s=left / (min(len(order), refine_shapes) - k)
        )
        r.status = "FEASIBLE"
        r.wall_s += time.perf_counter() - ts
        if progress:
            progress({"stage": "solve", "mesh": r.mesh, "done": k + 1,
                      "of": min(len(order), refine_shapes), "step_time_s": r.best.step_time_s})  # fmt: skip
    win = min(order, key=lambda r: (r.best.memory_bytes, r.best.step_time_s))
    plan = _to_plan(workload, g, hw, win, results, "FEASIBLE", limit, t0, t_trace, st,
                    check_hand=False)  # fmt: skip
    plan.solver["objective"] = "memory"
    plan.solver["stopped"] = (
        f"least memory: the ILP on the {min(len(order), refine_shapes)} mesh shapes whose hand "
        "layouts need least memory"
    )
    if not plan.predicted["fits"]:
        plan.status = "INFEASIBLE"
        plan.solver["status"] = "INFEASIBLE"
        plan.solver["least_memory_bytes"] = plan.predicted["memory_bytes_per_device"]
    return plan


@interruptible
def compare(
    workload: Workload,
    hw: Hardware | str,
    *,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    graph: Graph | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
    auto: Plan | None = None,
):
    """One row per layout: the planner's and each standard one (``search.baselines``), all
    priced by the same cost model. Columns: layout, mesh, status, step_time_s, compute_s,
    comm_s, exposed_comm_share, memory_gib, fits, mfu, note (why a layout was skipped: status
    SKIPPED, where the dims do not divide over the devices or the model has nothing it
    splits)."""
    import pandas as pd  # heavy (pandas): only where a table is asked for

    hw = hardware(hw) if isinstance(hw, str) else hw
    if graph is None:
        graph = trace(workload)
    if auto is None:
        # the hand layouts beside it price the step as written
        auto = plan(workload, hw, time_limit_s=time_limit_s, graph=graph, progress=progress,
                    remat=AS_WRITTEN)  # fmt: skip
    plans = {"auto": auto}
    layouts, missed = layouts_and_misses(graph, hw.num_devices)
    for name, (mesh, rules) in layouts.items():
        plans[name] = evaluate(workload, hw, mesh=mesh, rules=rules, graph=graph)
    rows = []
    for name, p in plans.items():
        s = p.predicted
        rows.append(
            {
                "layout": name,
                "mesh": mesh_text(p.mesh),
                "status": p.status,
                "step_time_s": s["step_time_s"],
                "compute_s": s["compute_s"],
                "comm_s": s["comm_s"],
                "exposed_comm_share": s["exposed_comm_s"] / s["step_time_s"]
                if s["step_time_s"] > 0
                else 0.0,
                "memory_gib": s["memory_bytes_per_device"] / 2**30,
                "fits": bool(s["fits"]),
                "mfu": s["mfu"],
                "note": "",
            }
        )
    nan = float("nan")
    for name, why in missed.items():  # a layout that cannot be laid on this many devices
        rows.append({"layout": name, "mesh": "", "status": "SKIPPED", "step_time_s": nan,
                     "compute_s": nan, "comm_s": nan, "exposed_comm_share": nan,
                     "memory_gib": nan, "fits": False, "mfu": nan, "note": why})  # fmt: skip
    return pd.DataFrame(rows)
