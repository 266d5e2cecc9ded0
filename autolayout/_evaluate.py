"""``al.evaluate``: the predicted cost of a given layout (Mesh-TF rules on a mesh), no search.

Rules map dim names to mesh axes and apply to every tensor of the step, Mesh-TF style: an
axis of a tensor is split over its dim's mesh axes unless an earlier rule already took one
of them for another axis of that tensor (the order of the rules is their priority). Each op
splits its groups the same way, so where a tensor's layout and the layout its consumer
splits it in differ (FSDP: weights stored split on ``d_model``, read whole because the batch
took the axis), the consumer pays the resharding. A dim merged by a reshape (``batch*seq``)
follows the rule of its leading part. Dims without a rule stay whole.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import MeshError, RuleError
from ._hardware import Hardware, hardware
from ._ir import Graph, Tensor, model_named, op_index, per_graph
from ._plan import Plan
from ._workload import Workload
from .cost_models.memory import aliased_outputs
from .cost_models.sharding import (
    Comm,
    OpCost,
    copied_inputs,
    local_bytes,
    op_cost,
    op_groups,
    op_kind,
    op_template,
    reshard,
)

RuleSpec = Mapping[str, Any] | Sequence[tuple[str, Any]]


def _close(name: str, known: Sequence[str]) -> str:
    m = difflib.get_close_matches(name, list(known), n=3)
    return f" (did you mean {', '.join(repr(x) for x in m)}?)" if m else ""


def normalize_rules(rules: RuleSpec | None) -> list[tuple[str, tuple[str, ...]]]:
    """``{"batch": "data", "heads": ("model",)}`` -> ``[("batch", ("data",)), ...]``."""
    if rules is None:
        return []
    items = list(rules.items()) if isinstance(rules, Mapping) else list(rules)
    out = []
    for item in items:
        try:
            dim, axes = item
        except (TypeError, ValueError):
            raise RuleError(f"a rule is a (dim, mesh axes) pair, got {item!r}") from None
        if axes is None:
            axes = ()
        elif isinstance(axes, str):
            axes = (axes,)
        axes = tuple(axes)
        if not isinstance(dim, str) or not all(isinstance(a, str) for a in axes):
            raise RuleError(f"rule {item!r}: dims and mesh axes are names (strings)")
        if len(set(axes)) != len(axes):
            raise RuleError(f"rule {dim!r} -> {axes}: names a mesh axis twice")
        out.append((dim, axes))
    dims = [d for d, _ in out]
    dup = sorted({d for d in dims if dims.count(d) > 1})
    if dup:
        raise RuleError(f"two rules for dim {dup[0]!r}; give one per dim")
    return out


def check_mesh(hw: Hardware, mesh: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(mesh, Mapping) or not mesh:
        raise MeshError(f"mesh must be a dict of axis name -> size, got {mesh!r}")
    out = {}
    for k, v in mesh.items():
        if not isinstance(k, str) or not k:
            raise MeshError(f"mesh axis names must be non-empty strings, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MeshError(f"mesh axis {k!r} must have a positive integer size, got {v!r}")
        out[k] = v
    from .cost_models.collectives import place_mesh

    place_mesh(hw, out)  # the device count, and each axis against the topology
    return out


def _carried(g: Graph) -> dict[str, Tensor]:
    """The dims a rule may name, each with a tensor that carries it: the inputs' dims and
    the dims the model named inside the step (``al.name_dims``). Cached on the graph (the
    search builds hundreds of rule sets over one 36k-tensor graph)."""
    return g.derived("carried", lambda: _find_carried(g))


def _find_carried(g: Graph) -> dict[str, Tensor]:
    carried: dict[str, Tensor] = {}
    for t in g.inputs:
        for d in g.tensors[t].dims:
            if d is not None:
                carried.setdefault(d, g.tensors[t])
    for t in g.tensors.values():  # dims the model named inside the step (al.name_dims)
        for d in t.dims:
            if model_named(d):
                carried.setdefault(d, t)
    return carried


class RuleSet:
    """Resolved rules: each dim's mesh axes and priority, checked against a graph and mesh."""

    def __init__(self, g: Graph, mesh: Mapping[str, int], rules: RuleSpec | None) -> None:
        self.rules = normalize_rules(rules)
        self.mesh = dict(mesh)
        carried = _carried(g)
        self.axes: dict[str, tuple[str, ...]] = {}
        self.priority: dict[str, int] = {}
        for k, (dim, axes) in enumerate(self.rules):
            if dim not in carried:
                where = (
                    "no input carries it and it is an inferred name (al.name_dims names one)"
                    if dim in g.dims
                    else "the workload has no such dim"
                )
                raise RuleError(
                    f"rule {dim!r} -> {'x'.join(axes) or '()'}: {where}{_close(dim, list(carried))}"
                )
            for a in axes:
                if a not in self.mesh:
                    raise RuleError(
                        f"rule {dim!r} -> {a!r}: the mesh has no axis {a!r} "
                        f"(axes: {', '.join(self.mesh)})"
                    )
            n = math.prod(self.mesh[a] for a in axes)
            size = g.dims[dim]
            if size % n:
                t = carried[dim]
                raise RuleError(
                    f"rule {dim!r} -> {'x'.join(axes)}: {t.path or t.name} has {dim!r} of size "
                    f"{size}, which {'x'.join(axes)} = {n} does not divide"
                )
            self.axes[dim] = axes
            self.priority[dim] = k
        for dim, size in g.dims.items():  # a reshape's merged dim follows its leading part
            if dim not in self.axes and "*" in dim:
                lead = dim.split("*", 1)[0]
                if (
                    lead in self.axes
                    and size % math.prod(self.mesh[a] for a in self.axes[lead]) == 0
                ):
                    self.axes[dim] = self.axes[lead]
                    self.priority[dim] = self.priority[lead]

    def layout(self, t: Tensor) -> tuple[tuple[str, ...], ...]:
        """The tensor's layout: each axis its dim's mesh axes, earlier rules first."""
        out: list[tuple[str, ...]] = [()] * len(t.shape)
        used: set[str] = set()
        order = sorted(
            (self.priority[d], i) for i, d in enumerate(t.dims) if d is not None and d in self.axes
        )
        for _, i in order:
            axes = self.axes[t.dims[i]]
            if (
                axes
                and used.isdisjoint(axes)
                and t.shape[i] % math.prod(self.mesh[a] for a in axes) == 0
            ):
                out[i] = axes
                used.update(axes)
        return tuple(out)

    def assign(self, g: Graph, groups) -> list[tuple[str, ...]]:
        """Mesh axes of each op group, by the same priority; fixed groups stay whole."""
        out: list[tuple[str, ...]] = [()] * len(groups)
        used: set[str] = set()
        order = sorted(
            (self.priority[grp.dim], k)
            for k, grp in enumerate(groups)
            if grp.kind != "fixed" and grp.dim in self.axes
        )
        for _, k in order:
            grp = groups[k]
            axes = self.axes[grp.dim]
            n = math.prod(self.mesh[a] for a in axes)
            sizes = [g.tensors[t].shape[a] for t, a in grp.members]
            if axes and used.isdisjoint(axes) and all(s % n == 0 for s in sizes):
                out[k] = axes
                used.update(axes)
        return out


def _step_time(compute: float, comm: float, overlap: float) -> tuple[float, float, float]:
    """(used, no-overlap bound, full-overlap bound): the profile's overlap factor interpolates."""
    worst, best = compute + comm, max(compute, comm)
    return best + (1.0 - overlap) * (worst - best), worst, best


def price(
    g: Graph,
    hw: Hardware,
    mesh: dict[str, int],
    layouts: dict[str, tuple[tuple[str, ...], ...]],
    assign_of,
    *,
    donated: Sequence[str] = (),
    reuse: bool = True,
) -> dict[str, Any]:
    """Prices a whole step: ``layouts`` of every tensor, ``assign_of(op, groups)`` each op's
    strategy (or a mapping op name -> strategy). Returns the per-op costs and the totals.
    ``reuse=False`` prices every op on its own instead of reusing the cost of an op alike
    (the tests hold the two equal)."""
    from .cost_models.compute import peak_flops
    from .cost_models.memory import liveness_peak
    from .cost_models.sharding import LOOP_OPS, Machine, free_tensors, fused_ops

    m = Machine(hw, mesh)
    costs: list[OpCost] = []
    resharded: set = set()
    free, fused = free_tensors(g), fused_ops(g)
    alike: dict[tuple, tuple] = {}
    static = g.derived("alike ops", dict)  # op -> the part of its alike key the graph fixes
    given = assign_of if isinstance(assign_of, Mapping) else None
    index = op_index(g)
    spans: dict[tuple, list[int]] = {}  # (tensor, layout) read in another layout: op span
    for op in g.ops:
        if op.primitive in LOOP_OPS:  # its body's ops carry the cost
            continue
        kind = static.get(op.name) if reuse else False
        if kind is None:
            kind = static[op.name] = _alike_kind(g, op, free, fused)
        if kind is False:
            groups = op_groups(g, op)
            assign = given[op.name] if given is not None else assign_of(op, groups)
            c = op_cost(m, g, op, groups, assign, layouts, resharded, free, fused)
            read = _copied(op, c, layouts, free)
        else:  # groups are made only for the first op of each key
            assign = given[op.name] if given is not None else assign_of(op, op_groups(g, op))
            c, read = _op_cost_alike(m, g, op, kind, assign, layouts, resharded, free, fused, alike)
        costs.append(c)
        if read:
            i = index[op.name]
            for key in read:
                span = spans.setdefault(key, [i, i])
                span[1] = i
    costs += _boundary_costs(m, g, layouts, aliased_outputs(g, donated))
    compute = sum(c.compute_s * c.op.trip_count for c in costs)
    comm = sum(c.comm_s * c.op.trip_count for c in costs)
    used, worst, best = _step_time(compute, comm, hw.efficiency.overlap)
    flops = sum(c.flops * c.op.trip_count for c in costs)
    model_flops = _model_flops(g)
    nbytes = _bytes_of(g, mesh)
    copies = [(a, b, nbytes(t, w)) for (t, w), (a, b) in spans.items()]
    mem = liveness_peak(g, lambda t: nbytes(t, layouts[t]), donated, copies)
    main_dtype = _main_dtype(g)
    peak = peak_flops(hw, main_dtype) * hw.num_devices
    predicted = {
        "step_time_s": used,
        "compute_s": compute,
        "comm_s": comm,
        "exposed_comm_s": used - compute,
        "step_time_no_overlap_s": worst,
        "step_time_full_overlap_s": best,
        "flops_per_device": flops,
        "model_flops": model_flops,
        "memory_bytes_per_device": mem.peak_bytes,
        "memory_limit_bytes": hw.hbm_limit_bytes,
        "memory_by_category": mem.by_category,
        "fits": mem.peak_bytes <= hw.hbm_limit_bytes,
        "mfu": model_flops / (used * peak) if used > 0 else 0.0,
        "hfu": flops * hw.num_devices / (used * peak) if used > 0 else 0.0,
        "dtype": main_dtype,
        # the chip's rooflines (per device), for reports
        "peak_flops_per_device": peak / hw.num_devices,
        "hbm_bandwidth_bytes_per_s": hw.chip.hbm_bandwidth,
        "hbm_bytes_per_device": hw.chip.hbm_bytes,
        "matmul_efficiency": hw.efficiency.matmul,
        "memory_efficiency": hw.efficiency.memory,
    }
    return {"costs": costs, "predicted": predicted}


def _alike_kind(g: Graph, op, free, fused) -> tuple | bool:
    """The part of an op's alike key (``_op_cost_alike``) the graph fixes, or ``False`` for
    an op priced on its own: a conv (halos), parameters that do not hash, an unnamed group."""
    tpl = op_template(g, op)
    if tpl is None or not tpl[1]:
        return False
    key = (tpl[2], op.flops, op.name in fused, tuple([t in free for t in op.inputs]))
    interned = g.derived("alike keys", dict)  # ops alike share one (fewer objects to collect)
    return interned.setdefault(key, key)


def _op_cost_alike(m, g: Graph, op, kind, assign, layouts, resharded, free, fused, alike):
    """``op_cost``, reused for an op alike in everything the cost depends on (primitive,
    parameters, FLOPs, fusion, shapes, groups, strategy and the layouts of its tensors) to one
    priced before: the 96 layers of a stack are priced once each kind. Tensor names are
    renamed to the op's own. A copy of an input is charged as ``op_cost`` charges it: once
    per tensor, layout and trip count (``resharded``). ``kind``: ``_alike_kind``. Returns the
    cost and its ``_copied`` inputs."""
    ins, outs = op.inputs, op.outputs
    key = (kind, tuple(assign), tuple([layouts[t] for t in ins]), tuple([layouts[t] for t in outs]))
    try:
        made = alike.get(key)
    except TypeError:  # layouts given as lists
        c = op_cost(m, g, op, op_groups(g, op), assign, layouts, resharded, free, fused)
        return c, _copied(op, c, layouts, free)
    if made is None:  # priced with no copy shared; the copies' collectives apart
        c0 = op_cost(m, g, op, op_groups(g, op), assign, layouts, None, free, fused)
        copies = []
        for t in copied_inputs(op, c0.wanted, layouts, free):
            copies.append(
                (ins.index(t), c0.wanted[t], reshard(m, g.tensors[t], layouts[t], c0.wanted[t]))
            )
        rest = c0.comms[sum(len(cc) for _, _, cc in copies) :]
        made = alike[key] = (c0, copies, rest)
    c0, copies, rest = made
    ins0, outs0 = c0.op.inputs, c0.op.outputs
    same = ins0 is ins and outs0 is outs
    # the copies by position hold for this op too: the key holds the inputs' layouts and
    # which inputs are free
    reads = [(ins[pos], w) for pos, w, _ in copies]
    comms: list = []
    for pos, w, cc in copies:
        t = ins[pos]
        k = (t, w, op.trip_count)
        if k in resharded:
            continue
        resharded.add(k)
        comms += cc if t == ins0[pos] else [_on(x, t) for x in cc]
    if same:
        return OpCost(op, c0.strategy, c0.wanted, c0.produced, c0.partial, c0.flops, c0.bytes,
                      c0.compute_s, comms + rest), reads  # fmt: skip
    rename = dict(zip(outs0, outs, strict=True))
    comms += [_on(x, rename.get(x.tensor, x.tensor)) for x in rest]
    return OpCost(
        op, c0.strategy,
        {t: c0.wanted[t0] for t, t0 in zip(ins, ins0, strict=True)},
        {t: c0.produced[t0] for t, t0 in zip(outs, outs0, strict=True)},
        c0.partial, c0.flops, c0.bytes, c0.compute_s, comms,
    ), reads  # fmt: skip


def _copied(op, c: OpCost, layouts, free) -> list[tuple[str, Any]]:
    """``(tensor, layout)`` of each input ``c`` reads in another layout (``copied_inputs``)."""
    return [(t, c.wanted[t]) for t in copied_inputs(op, c.wanted, layouts, free)]


def _on(x: Comm, t: str) -> Comm:
    """Collective ``x`` on tensor ``t`` (``x`` itself when it is on ``t``: comms are frozen)."""
    return x if x.tensor == t else Comm(x.kind, x.axes, x.bytes, x.time_s, t, x.why)


def _boundary_costs(m, g: Graph, layouts, aliased: dict[str, str]) -> list:
    """Resharding where a loop, a branch or donated state hands a tensor over in another
    layout, as one row per (op, trips): a carry is handed over every iteration."""
    from .cost_models.sharding import OpCost, boundaries, boundary_comms

    rows: dict[tuple[str, int], OpCost] = {}
    ops = {op.name: op for op in g.ops}
    for b in boundaries(g, aliased):
        comms = boundary_comms(m, g, b, layouts[b.src], layouts[b.dst])
        if not comms:
            continue
        key = (b.owner, b.trips)
        if key not in rows:
            op = dataclasses.replace(ops.get(b.owner, g.ops[-1]), trip_count=b.trips)
            rows[key] = OpCost(op, {}, {}, {}, (), 0.0, 0.0, 0.0, [])
        rows[key].comms.extend(comms)
    return list(rows.values())


@per_graph
def recomputed_ops(g: Graph) -> set[str]:
    """The ops that redo forward work in the backward pass (remat), for MFU's model FLOPs.

    The backward pass is what follows the op that writes the loss (the step's last scalar
    float output). A remat region there holds the recomputed forward and the region's own
    backward; an op of it is a recomputation when none of its inputs depends on a cotangent,
    i.e. on a value the backward pass made outside the recomputation.
    """
    index = op_index(g)
    producer = {o: op.name for op in g.ops for o in op.outputs}
    losses = [
        producer[o]
        for o in g.outputs
        if o in producer and g.tensors[o].size == 1 and "float" in g.tensors[o].dtype
    ]
    if not losses:
        return set()
    end = max(index[p] for p in losses)
    outer: dict[str, str] = {}  # a loop body's input -> the tensor the loop feeds it
    for op in g.ops:
        for o, b in op.param("body_inputs", ()):
            outer[b] = o
    again: set[str] = set()
    cot: dict[str, bool] = {}

    def is_cot(t: str) -> bool:
        while t not in cot and t in outer:  # a loop: a closure calling itself is a cycle
            t = outer[t]
        if t in cot:
            return cot[t]
        p = producer.get(t)
        return p is not None and index[p] > end and p not in again

    for i, op in enumerate(g.ops):
        if i > end and op.remat and not any(is_cot(t) for t in op.inputs):
            again.add(op.name)
        for o in op.outputs:
            cot[o] = i > end and op.name not in again
    return again


@per_graph
def _model_flops(g: Graph) -> float:
    """The step's FLOPs without the recomputed ones (what MFU counts)."""
    again = recomputed_ops(g)
    return sum(op.flops * op.trip_count for op in g.ops if op.name not in again)


@per_graph
def _main_dtype(g: Graph) -> str:
    """The element type of most matmul FLOPs (what the MFU's peak is taken at)."""
    by: dict[str, float] = {}
    for op in g.ops:
        if op.primitive in ("dot_general", "conv_general_dilated") and op.inputs:
            d = g.tensors[op.inputs[0]].dtype
            by[d] = by.get(d, 0.0) + op.flops * op.trip_count
    return max(by, key=by.get) if by else "float32"


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
    from ._report import op_layers

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


def _bytes_of(g: Graph, mesh: Mapping[str, int]):
    """``local_bytes`` of a tensor in a layout, memoised by shape, dtype and layout (a
    96-layer step has 38k tensors of a few dozen shapes)."""
    memo: dict[tuple, int] = {}

    def nbytes(t: str, layout) -> int:
        tt = g.tensors[t]
        try:
            key = (tt.shape, tt.dtype, layout)
            v = memo.get(key)
        except TypeError:  # a layout given as lists
            return local_bytes(tt, layout, mesh)
        if v is None:
            v = memo[key] = local_bytes(tt, layout, mesh)
        return v

    return nbytes


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
    from .cost_models.sharding import check_layout

    t0 = time.perf_counter()
    hw = hardware(hw) if isinstance(hw, str) else hw
    mesh = check_mesh(hw, mesh)
    if graph is None:
        from ._trace import trace

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
