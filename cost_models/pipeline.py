"""The price of a pipeline: a layer stack split over a ``stage`` axis, the batch cut into
microbatches.

A pipelined layout is priced from the plan of *one stage's step* (``core.stage_workload``:
the stack's layers / stages, the batch / microbatches) on *one stage's devices*
(:func:`stage_hardware`), laid out as the rest of the mesh says. Its ops fall in three parts:

- **stack**: the ops of the scans over the layer stack (forward and backward), one
  microbatch through one stage's layers: run ``M + P - 1`` times in a GPipe or 1F1B schedule
  of ``P`` stages and ``M`` microbatches, the bubble being ``(P - 1) / (M + P - 1)``; a circular
  schedule with ``R`` repeats runs ``M R + P - 1`` chunks of ``1/R`` of it;
- **edge**: the rest of the forward and backward (embedding, head, loss): once per microbatch,
  outside the pipeline and on every stage (the runtime runs them on the whole batch laid out
  over the other axes, as MaxText runs its embedding and head); 1F1B as Megatron-LM runs it
  puts them in the first and last stages, where they lengthen each slot;
- **once**: the optimizer and the gradients' reductions (accumulated over microbatches, reduced
  once a step).

Between neighbouring stages each microbatch's carry (the residual stream, and its cotangent in
the backward pass) is sent point to point on the links the stage axis spans (:func:`stage_link`:
the slowest, the stage axis being outermost). Memory: the stage's state, plus the activations of
every microbatch in flight: all ``M`` for GPipe and a circular schedule run as an
autodiff'd loop (what the runtime does), ``min(M, P)`` for 1F1B.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autolayout.core import (
    Cluster,
    Graph,
    Hardware,
    Plan,
    Stack,
    Torus,
    Workload,
    local_bytes,
    op_layers,
    scan_parts,
)

from .compute import peak_flops
from .plans import evaluate, output_layouts
from .pricing import step_time
from .sharding import Machine, index_alignment

SCHEDULES = ("gpipe", "1f1b", "circular")
RUNNABLE = ("gpipe",)  # schedules al.apply runs (a pipelined scan, forward then backward)
_REDUCTIONS = ("all-reduce", "reduce-scatter")


def stage_hardware(hw: Hardware, stages: int) -> Hardware | None:
    """The devices of one stage when the outermost (slowest) level of ``hw`` is cut into
    ``stages``: nodes of a GPU cluster, slices of a multi-slice TPU job, else the longest
    dim of one torus (or one node's GPUs). ``None`` where it does not divide."""
    t = hw.topology
    if stages < 2 or hw.num_devices % stages:
        return None
    if isinstance(t, Cluster):
        if t.nodes > 1:
            if t.nodes % stages:
                return None
            topo = dataclasses.replace(t, nodes=t.nodes // stages)
        elif t.per_node % stages == 0:
            topo = dataclasses.replace(t, per_node=t.per_node // stages)
        else:
            return None
    elif isinstance(t, Torus):
        if t.slices > 1:
            if t.slices % stages:
                return None
            topo = dataclasses.replace(t, slices=t.slices // stages)
        else:
            i = max(range(len(t.shape)), key=lambda k: t.shape[k])
            if t.shape[i] % stages:
                return None
            shape = tuple(n // stages if k == i else n for k, n in enumerate(t.shape))
            wrap = tuple(False if k == i else w for k, w in enumerate(t.wraparound))
            topo = dataclasses.replace(t, shape=shape, wraparound=wrap)
    else:
        return None
    return dataclasses.replace(
        hw, name=f"{hw.name} (one of {stages} stages)", num_devices=hw.num_devices // stages,
        topology=topo,
    )  # fmt: skip


def stage_link(hw: Hardware, stages: int) -> tuple[float, float, str]:
    """(bytes/s per device, latency s, what) of a transfer between neighbouring stages."""
    t = hw.topology
    eff = hw.efficiency.collective
    if isinstance(t, Cluster):
        if t.nodes > 1 and t.inter_bandwidth:
            return t.inter_bandwidth * eff, t.inter_latency_s or t.intra_latency_s, "network"
        return t.intra_bandwidth * eff, t.intra_latency_s, "intra-node"
    if isinstance(t, Torus) and t.slices > 1 and t.dcn_bandwidth:
        return t.dcn_bandwidth * eff, t.dcn_latency_s, "DCN"
    return t.link_bandwidth * eff, t.latency_s, "ICI"


def stack_ops(g: Graph, stack: Stack) -> set[str]:
    """Names of the ops that run once per layer of the stack (the scans' bodies, the scans)."""
    loops = set(stack.loops)
    out = set(loops)
    for lp in g.loops:
        if lp.name in loops:
            out.update(lp.ops)
    return out


def part_of(stage: Plan, stack: Stack) -> dict[str, str]:
    """Each op of one stage's step: ``stack`` (runs per layer of the stack), ``once`` (the
    optimizer) or ``edge`` (the rest of the forward and backward)."""
    body = stack_ops(stage.graph, stack)
    layer = op_layers(stage.graph)
    return {
        r["op"]: "stack" if r["op"] in body else "once" if layer.get(r["op"]) == "optimizer"
        else "edge"
        for r in stage.ops
    }  # fmt: skip


def edge_conflict(stage: Plan, stack: Stack) -> str | None:
    """Why a pipelined plan of ``stage`` is not priced as XLA compiles it, else ``None``: an
    edge matmul (outside the pipelined scans) whose result has a dim on a mesh axis that
    also splits the batch it contracts. Outside the scans the ``stage`` axis is free, and
    XLA's dot partitioner uses it (the head's weight gradient with ``vocab`` and ``batch`` on
    one axis, 4 stages of 2 CPU devices: FLOPs 0.90x, permutes 1.29x), where the price
    assumes one stage's mesh. The search does not pick such a plan."""
    g, where = stage.graph, part_of(stage, stack)
    for op in g.ops:
        if op.primitive != "dot_general" or where.get(op.name, "edge") != "edge":
            continue
        batch_axes = {
            a
            for t in op.inputs
            for d, axes in zip(g.tensors[t].dims, stage.layouts[t], strict=True)
            if d == stack.batch
            for a in axes
        }
        out = g.tensors[op.outputs[0]]
        if stack.batch in out.dims:
            continue  # the batch is kept, not contracted
        for d, axes in zip(out.dims, stage.layouts[op.outputs[0]], strict=True):
            shared = batch_axes & set(axes)
            if d is not None and shared:
                return (
                    f"{op.name}: its result's {d} and the batch it sums over share mesh axis "
                    f"{sorted(shared)[0]}; outside the pipelined scans XLA splits it over the "
                    "stage axis too, which the price does not follow"
                )
    return None


def _parts(
    stage: Plan, stack: Stack, reduce_once: bool, hw: Hardware, stages: int
) -> dict[str, list[float]]:
    """Per part (stack, edge, once): [compute s, comm s, FLOPs] per device of one stage's step
    on one microbatch; ``reduce_once``: the gradients' reductions moved to ``once`` (1F1B as
    Megatron-LM runs it accumulates gradients over microbatches; the runtime's pipelined scan
    reduces each microbatch's, as XLA partitions a sum carried by a loop). The edge's gathers
    and scatters are partitioned on the whole mesh (:func:`edge_alignment`): their tables'
    moves are the whole mesh's, once a step where they carry no batch."""
    where = part_of(stage, stack)
    parts = {"stack": [0.0, 0.0, 0.0], "edge": [0.0, 0.0, 0.0], "once": [0.0, 0.0, 0.0]}
    for r in stage.ops:
        p = where[r["op"]]
        parts[p][0] += r["compute_s"] * r["trips"]
        parts[p][1] += r["comm_s"] * r["trips"]
        parts[p][2] += r["flops"] * r["trips"]
    for c in stage.collectives_:  # the edge's indexed tables as the whole mesh moves them
        if c["why"] == "align" and where.get(c["op"], "edge") == "edge":
            parts["edge"][1] -= c["time_s"] * c["count"]
    for c in edge_alignment(stage, stack, hw, stages):
        batch = stack.batch in stage.graph.tensors[c["tensor"]].dims
        parts["edge" if batch else "once"][1] += c["time_s"] * (1 if batch else c["count"])
    for c in stage.collectives_ if reduce_once else ():
        if c["combined"] and c["kind"] in _REDUCTIONS:  # a gradient: reduced once a step
            p = where.get(c["op"], "edge")
            if p != "once":
                parts[p][1] -= c["time_s"] * c["count"]
                parts["once"][1] += c["time_s"] * c["count"]
    return parts


def edge_alignment(stage: Plan, stack: Stack, hw: Hardware, stages: int) -> list[dict]:
    """The collective-permutes (:func:`index_alignment`) of the edge's gathers and scatters
    as XLA partitions them on the whole mesh, ``stage`` outermost: outside the pipelined scans
    the stage axis is one more mesh axis their tables are replicated on (the pipelined GPT's
    vocab-split embedding on stage x data x model: its block moved onto ``stage`` and its
    gradient back, measured), one row per move, bytes per microbatch where they carry the
    batch (``step_collectives`` scales them)."""
    g = stage.graph
    where = part_of(stage, stack)
    m = Machine(hw, {"stage": stages, **stage.mesh})
    out = []
    for op in g.ops:
        if where.get(op.name, "edge") != "edge":
            continue
        reads = stage.reads.get(op.name, {})
        wanted = {t: reads.get(t, stage.layouts[t]) for t in op.inputs}
        produced = {t: stage.layouts[t] for t in op.outputs}
        for c in index_alignment(m, g, op, wanted, produced):
            out.append({"op": op.name, "kind": c.kind, "axes": c.axes, "bytes": c.bytes,
                        "time_s": c.time_s, "count": 1, "tensor": c.tensor, "why": c.why,
                        "combined": c.combined})  # fmt: skip
    return out


def residual_bytes(stage: Plan, stack: Stack) -> int:
    """Bytes per device one microbatch leaves for the backward pass in one stage: what the
    forward scans over the stack return per layer with a batch dim, as the stage lays it out."""
    g = stage.graph
    total = 0
    for op in g.ops:
        if op.name in stack.loops and not op.param("reverse", False):
            nk = op.param("num_carry", 0)
            for t in op.outputs[nk:]:
                if stack.batch in g.tensors[t].dims:
                    total += local_bytes(g.tensors[t], stage.layouts[t], stage.mesh)
    return total


def carry_bytes(stage: Plan, stack: Stack) -> int:
    """Bytes per device one stage sends the next per microbatch: the carries of the stack's
    scans (the residual stream forward, its cotangent backward), as the stage lays them out."""
    g = stage.graph
    total = 0
    for op in g.ops:
        if op.name in stack.loops:
            for t in scan_parts(op)[1]:
                total += local_bytes(g.tensors[t], stage.layouts[t], stage.mesh)
    return total


def price_pipeline(
    stage: Plan,
    stack: Stack,
    hw: Hardware,
    stages: int,
    microbatches: int,
    schedule: str = "gpipe",
    repeats: int = 1,
    *,
    model_flops: float,
    data_args: tuple[str, ...] = ("batch",),
) -> dict[str, Any]:
    """The predicted step of the pipeline whose one stage on one microbatch is ``stage``
    (priced on ``stage_hardware(hw, stages)``): ``price``'s keys, for the whole step on all of
    ``hw``, and ``pipeline`` (the schedule, its bubble and its parts)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    P, M, R = stages, microbatches, max(1, repeats if schedule == "circular" else 1)
    ov = hw.efficiency.overlap
    parts = _parts(stage, stack, schedule == "1f1b", hw, stages)
    t = {k: step_time(c, m, ov)[0] for k, (c, m, _) in parts.items()}
    bw, lat, link = stage_link(hw, P)
    sent = carry_bytes(stage, stack)
    n_scans = max(1, len([op for op in stage.graph.ops if op.name in stack.loops]))
    per_send = lat * n_scans + sent / bw  # one microbatch over one stage boundary, both ways
    # the last stage's results (the whole batch's carry) to every stage, once a scan
    exit_s = 0.0 if schedule == "1f1b" else lat * n_scans + 2 * (P - 1) / P * sent * M / bw
    st, ed, on = parts["stack"], parts["edge"], parts["once"]
    if schedule == "1f1b":  # Megatron-LM: embedding and head in the first and last stages;
        slots = M + P - 1  # the bubble idles
        step = slots * (t["stack"] + t["edge"] + per_send) + t["once"]
        in_flight = min(M, P)
        compute = slots * (st[0] + ed[0]) + on[0]
        comm = slots * (st[1] + ed[1] + per_send) + on[1]
        flops = M * (st[2] + ed[2]) + on[2]
    else:  # the bubble computes on nothing (masked), as the runtime's pipelined scan does
        slots = M * R + P - 1
        step = M * t["edge"] + slots * (t["stack"] / R + per_send) + t["once"] + exit_s
        in_flight = M
        compute = slots * st[0] / R + M * ed[0] + on[0]
        comm = slots * (st[1] / R + per_send) + M * ed[1] + on[1] + exit_s
        flops = slots * st[2] / R + M * ed[2] + on[2]
    ideal = M * (t["stack"] + t["edge"]) + t["once"]
    s = stage.predicted
    by = dict(s["memory_by_category"])
    act = by.get("activations", 0)
    if schedule == "1f1b":  # the saved residuals of each microbatch in flight, one's working set
        by["activations"] = act + (in_flight - 1) * residual_bytes(stage, stack)
    else:  # every microbatch's, and the edge's on the whole batch: the whole peak M times
        by["activations"] = act * in_flight
    for k in data_args:  # the whole batch is an input of the step
        if k in by:
            by[k] = by[k] * M
    mem = s["memory_bytes_per_device"] + sum(by.values()) - sum(s["memory_by_category"].values())
    peak = peak_flops(hw, s["dtype"]) * hw.num_devices
    limit = s["memory_limit_bytes"]
    bubble = (P - 1) / slots
    return {
        **s,
        "step_time_s": step,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": max(0.0, step - compute),
        "step_time_no_overlap_s": step,
        "step_time_full_overlap_s": step,
        "flops_per_device": flops,
        "model_flops": model_flops,
        "memory_bytes_per_device": mem,
        "memory_by_category": by,
        "fits": mem <= limit,
        "mfu": model_flops / (step * peak) if step > 0 else 0.0,
        "hfu": flops * hw.num_devices / (step * peak) if step > 0 else 0.0,
        "peak_flops_per_device": peak / hw.num_devices,
        "pipeline": {
            "stages": P,
            "microbatches": M,
            "schedule": schedule,
            "repeats": R,
            "bubble": bubble,
            "slots": slots,
            "stage_microbatch_s": t["stack"],
            "edge_microbatch_s": t["edge"],
            "once_s": t["once"],
            "transfer_bytes_per_microbatch": sent,
            "transfer_s_per_microbatch": per_send,
            "exit_s": exit_s,
            "link": link,
            "bubble_s": max(0.0, step - ideal - slots * per_send - exit_s),
            "activations_in_flight": in_flight,
        },
    }


def pipelined_plan(
    workload: Workload,
    g: Graph,
    hw: Hardware,
    stage: Plan,
    stack: Stack,
    stages: int,
    microbatches: int,
    schedule: str = "gpipe",
    repeats: int = 1,
    *,
    memory_limit: float | None = None,
) -> Plan:
    """The whole step's plan on ``hw`` whose one stage on one microbatch is ``stage``: the mesh
    ``{"stage": P, **stage.mesh}``, the rules ``stack.dim -> stage`` and the stage's, every
    tensor laid out by them (the runtime pins what lies outside the pipelined scans), the
    prediction of :func:`price_pipeline`. Its report rows and collectives are the stage's on
    one microbatch, and the transfers between stages."""
    mesh = {"stage": stages, **stage.mesh}
    rules = [(stack.dim, ("stage",))] + [(d, a) for d, a in stage.rules() if d != stack.dim]
    whole = evaluate(workload, hw, mesh=mesh, rules=rules, graph=g)
    mapped = stage_layouts_on(g, stage, stack)
    reads: dict = {}
    if mapped is not None:  # the stage's layout exactly, exceptions to its rules too
        whole = dataclasses.replace(
            whole, layouts=mapped, outputs=output_layouts(workload, g, mapped),
            inputs=[dict(i, layout=mapped[t]) for i, t in zip(whole.inputs, g.inputs, strict=True)],
        )  # fmt: skip
        # and where an op reads a tensor in another layout, that layout (FSDP's gathers)
        reads = {op: {t: _staged(g, t, lay, stack) for t, lay in r.items()}
                 for op, r in stage.reads.items()}  # fmt: skip
    names = workload.argnames
    data = tuple(names[i] for i in range(len(names)) if i not in workload.donate_argnums)
    pred = price_pipeline(
        stage, stack, hw, stages, microbatches, schedule, repeats,
        model_flops=whole.predicted["model_flops"], data_args=data,
    )  # fmt: skip
    if memory_limit is not None:
        pred["memory_limit_bytes"] = memory_limit
        pred["fits"] = pred["memory_bytes_per_device"] <= memory_limit
    pipe = pred["pipeline"]
    colls = step_collectives(stage, stack, pred["pipeline"], schedule, hw)
    status = stage.status if stage.status in ("OPTIMAL", "FEASIBLE") else "FEASIBLE"
    if not pred["fits"]:
        status = "INFEASIBLE"
    elif status == "OPTIMAL":
        status = "FEASIBLE"  # optimal for one stage's layout, not over stages and microbatches
    solver = {k: v for k, v in stage.solver.items() if k not in ("lower_bound_s", "gap")}
    solver["pipeline"] = {**pipe, "dim": stack.dim, "batch": stack.batch, "loops": list(stack.loops),
                          "stage_hardware": stage.hardware, "stage_mesh": dict(stage.mesh),
                          "stage_step_s": stage.predicted["step_time_s"],
                          "rows": "the report's rows are one stage's step on one microbatch",
                          "whole_batch_ops": whole_batch_ops(stage, stack)}  # fmt: skip
    solver["status"] = status
    return dataclasses.replace(
        whole, status=status, predicted=pred, ops=list(stage.ops),
        collectives_=colls, solver=solver, reads=reads,
    )  # fmt: skip


def stage_layouts_on(g: Graph, stage: Plan, stack: Stack) -> dict | None:
    """One stage's layouts on the whole step's tensors, the stack's dim split over ``stage``
    too: the two traces are of one program at other sizes, so their tensors correspond by name
    where every tensor has the same dims (``None`` where they do not)."""
    sg = stage.graph
    if sg is None or len(sg.tensors) != len(g.tensors):
        return None
    out = {}
    for t, tt in g.tensors.items():
        st = sg.tensors.get(t)
        if st is None or len(st.dims) != len(tt.dims):
            return None
        out[t] = _staged(g, t, stage.layouts[t], stack)
    return out


def _staged(g: Graph, t: str, lay, stack: Stack):
    """A stage's layout of tensor ``t`` on the whole step: the stack's dim split over
    ``stage`` too."""
    dims = g.tensors[t].dims
    if stack.dim not in dims:
        return lay
    i = dims.index(stack.dim)
    return tuple(("stage", *a) if k == i else tuple(a) for k, a in enumerate(lay))


def step_collectives(
    stage: Plan, stack: Stack, pipe: dict, schedule: str, hw: Hardware
) -> list[dict]:
    """The whole pipelined step's collectives from one stage's on one microbatch: the stack's
    run in every slot, the edge's once on the whole batch (a tensor with the batch dim moves
    ``M`` times the bytes), the optimizer's once; then each scan's carries sent between
    stages every slot and, but in 1F1B, the last stage's results all-reduced over ``stage``."""
    g, M, slots = stage.graph, pipe["microbatches"], pipe["slots"]
    where = part_of(stage, stack)
    out = []
    own = [c for c in stage.collectives_  # the edge's table moves: the whole mesh's instead
           if c["why"] != "align" or where.get(c["op"], "edge") != "edge"]  # fmt: skip
    for c in own + edge_alignment(stage, stack, hw, pipe["stages"]):
        p = where.get(c["op"], "edge")
        c = dict(c)
        if p == "stack":
            c["count"] = c["count"] * slots // pipe["repeats"]
        elif p == "edge" and stack.batch in g.tensors[c["tensor"]].dims:
            c["bytes"] = c["bytes"] * M
            c["time_s"] = c["time_s"] * M
        out.append(c)
    share = pipe["transfer_s_per_microbatch"]
    for op in g.ops:
        if op.name not in stack.loops:
            continue
        for t in scan_parts(op)[1]:
            b = local_bytes(g.tensors[t], stage.layouts[t], stage.mesh)
            frac = b / max(1, pipe["transfer_bytes_per_microbatch"])
            out.append({"op": op.name, "kind": "collective-permute", "axes": ("stage",),
                        "bytes": b, "time_s": share * frac, "count": slots, "tensor": t,
                        "why": "a microbatch's carry to the next stage", "combined": False})  # fmt: skip
            if schedule != "1f1b":
                out.append({"op": op.name, "kind": "all-reduce", "axes": ("stage",),
                            "bytes": b * M, "time_s": pipe["exit_s"] * frac, "count": 1,
                            "tensor": t, "why": "the last stage's results to every stage",
                            "combined": False})  # fmt: skip
    return out


def whole_batch_ops(stage: Plan, stack: Stack) -> list[str]:
    """The edge ops of one stage's step that run on the whole batch in the pipelined step
    (an output or input with the batch dim): their work is ``M`` times the row's."""
    g, where = stage.graph, part_of(stage, stack)
    by_name = {op.name: op for op in g.ops}
    out = []
    for name, p in where.items():
        op = by_name.get(name)
        if (
            p == "edge"
            and op is not None
            and any(stack.batch in g.tensors[t].dims for t in (*op.outputs, *op.inputs))
        ):
            out.append(name)
    return out


def flops_as_compiled(plan: Plan) -> float:
    """The report's FLOPs as XLA's ``cost_analysis`` counts the step (a loop body once): a
    pipelined plan's edge ops on the whole batch count ``M`` times their one-microbatch row."""
    pipe = plan.solver.get("pipeline")
    scaled = set(pipe.get("whole_batch_ops", ())) if pipe else set()
    m = pipe["microbatches"] if pipe else 1
    return float(sum(r["flops"] * (m if r["op"] in scaled else 1) for r in plan.ops))
