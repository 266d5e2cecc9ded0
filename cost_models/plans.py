"""A priced layout as a :class:`Plan` (its report rows, collectives and input layouts), and
``evaluate``: the price of a given layout, no search."""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

from autolayout.core import (
    Graph,
    Hardware,
    Plan,
    Workload,
    check_layout,
    hardware,
    op_layers,
    target_mismatch,
    trace,
)

from .memory import aliased_outputs
from .pricing import _bytes_of, price
from .replicating import opaque_ops
from .rules import RuleSet, RuleSpec, check_mesh
from .sharding import op_kind


def plan_from_costs(
    workload: Workload | None,
    g: Graph,
    hw: Hardware,
    mesh: dict[str, int],
    rules: list[tuple[str, tuple[str, ...]]],
    layouts: dict,
    priced: dict[str, Any],
    status: str,
    solver: dict[str, Any],
) -> Plan:
    nbytes = _bytes_of(g, mesh)
    ops, colls = [], []
    reads: dict[str, dict] = {}
    layer = op_layers(g)
    dims_of: dict[int, str] = {}
    # per cost template: an op alike to one priced before shares its cost's strategy object
    # (``_op_cost_alike``), and with it the strategy text, the dims, the outputs' bytes and
    # which inputs it reads in another layout (by position)
    shared: dict[int, tuple[str, str, int, list[int]]] = {}
    joined: dict[tuple[str, ...], str] = {}
    for c in priced["costs"]:
        op = c.op
        row = shared.get(id(c.strategy))
        if row is None:
            text = ",".join(f"{d}:{'x'.join(a)}" for d, a in c.strategy.items())
            dims = _op_dims(g, op, dims_of)
            memory = sum(nbytes(t, layouts[t]) for t in op.outputs)
            at = [j for j, t in enumerate(op.inputs) if t in c.wanted and c.wanted[t] != layouts[t]]
            row = shared[id(c.strategy)] = (text, dims, memory, at)
        text, dims, memory, at = row
        if at:
            ins = op.inputs
            reads[op.name] = {ins[j]: c.wanted[ins[j]] for j in at}
        comms = c.comms
        kinds = ",".join(sorted({x.kind for x in comms})) if comms else ""
        scope = joined.get(op.scope)
        if scope is None:
            scope = joined[op.scope] = "/".join(op.scope)
        ops.append(
            {
                "op": op.name,
                "kind": op.primitive,
                "layer": layer.get(op.name, ""),
                "scope": scope,
                "dims": dims,
                "strategy": text,
                "trips": op.trip_count,
                "flops": c.flops,
                "bytes": c.bytes,
                "compute_s": c.compute_s,
                "comm_s": sum([x.time_s for x in comms]) if comms else 0.0,
                "collective": kinds,
                "memory": memory,
            }
        )
        for x in c.comms:
            colls.append(
                {
                    "op": op.name,
                    "kind": x.kind,
                    "axes": x.axes,
                    "bytes": x.bytes,
                    "time_s": x.time_s,
                    "count": op.trip_count,
                    "tensor": x.tensor,
                    "why": x.why,
                    "combined": x.combined,
                }
            )
    outputs = output_layouts(workload, g, layouts)
    inputs = [
        {
            "path": g.tensors[t].path,
            "shape": g.tensors[t].shape,
            "dtype": g.tensors[t].dtype,
            "dims": g.tensors[t].dims,
            "layout": layouts[t],
        }
        for t in g.inputs
    ]
    if any(op.opaque for op in g.ops):  # each op run whole on every device, and its share
        solver = {**solver, "opaque": opaque_ops(g, ops)}
    return Plan(
        status=status,
        model=g.name,
        hardware=hw.name,
        mesh=dict(mesh),
        rules_=rules,
        inputs=inputs,
        outputs=outputs,
        layouts=dict(layouts),
        predicted=priced["predicted"],
        ops=ops,
        collectives_=colls,
        solver=solver,
        reads=reads,
        options=dict(getattr(workload, "options", {}) or {}),
        workload=workload,
        graph=g,
    )


def _op_dims(g: Graph, op, memo: dict[int, str]) -> str:
    """The dims an op's tensors carry, outputs first (the same for ops alike, see op_kind)."""
    k = op_kind(g, op)
    v = memo.get(k) if k is not None else None
    if v is None:
        ts = op.outputs + op.inputs
        v = ",".join(dict.fromkeys(d for t in ts for d in g.tensors[t].dims if d is not None))
        if k is not None:
            memo[k] = v
    return v


def donated_inputs(workload: Workload | None, g: Graph) -> list[str]:
    if workload is None or not workload.donate_argnums:
        return []
    names = workload.argnames
    roots = {names[i] for i in workload.donate_argnums if i < len(names)}
    return [t for t in g.inputs if (g.tensors[t].path or "").split("/", 1)[0] in roots]


def output_layouts(workload: Workload | None, g: Graph, layouts: Mapping[str, Any]) -> list:
    """The layout each step output comes back in, in output order: an output that takes a
    donated input's buffer (new parameters, new optimizer state) in that input's layout, so
    a step's outputs are the next step's inputs as they are (the resharding into it is what
    the cost model charges as the ``alias`` hand-over); any other output as computed."""
    aliased = aliased_outputs(g, donated_inputs(workload, g))
    return [layouts[aliased.get(t, t)] for t in g.outputs]


def evaluate(
    workload: Workload,
    hw: Hardware | str,
    *,
    mesh: Mapping[str, int],
    rules: RuleSpec | None = None,
    graph: Graph | None = None,
) -> Plan:
    """The predicted cost of one layout: ``rules`` (dim -> mesh axes) on ``mesh``.

    Example:
      >>> import autolayout as al, jax, jax.numpy as jnp
      >>> def step(w, x):
      ...     return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
      >>> wl = al.Workload(step, (al.spec((256, 512), ("d_in", "d_out")),
      ...                         al.spec((64, 256), ("batch", "d_in"))))
      >>> p = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
      >>> p.status, sorted(set(p.collectives()["kind"]))
      ('EVALUATED', ['all-reduce'])
    """
    t0 = time.perf_counter()
    hw = hardware(hw) if isinstance(hw, str) else hw
    if (why := target_mismatch(workload, hw.kind)) is not None:
        warnings.warn(why, stacklevel=2)
    mesh = check_mesh(hw, mesh)
    if graph is None:
        graph = trace(workload)
    rs = RuleSet(graph, mesh, rules)
    layouts = {t: rs.layout(tt) for t, tt in graph.tensors.items()}
    for t in graph.inputs:
        check_layout(graph.tensors[t], layouts[t], mesh)
    priced = price(
        graph,
        hw,
        mesh,
        layouts,
        lambda op, groups: rs.assign(graph, groups),
        donated=donated_inputs(workload, graph),
    )
    solver = {"status": "EVALUATED", "wall_s": time.perf_counter() - t0, "variables": 0}
    solver["mesh_shapes_tried"] = [
        {"mesh": dict(mesh), "step_time_s": priced["predicted"]["step_time_s"]}
    ]
    return plan_from_costs(
        workload, graph, hw, mesh, rs.rules, layouts, priced, "EVALUATED", solver
    )
