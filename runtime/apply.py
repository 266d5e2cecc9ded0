"""``al.apply``: a plan as a ``jax.jit`` function whose shardings are the plan's.

Inputs and outputs get ``NamedSharding``s on a ``jax.sharding.Mesh`` over the devices. The
plan's intermediate layouts are pinned by re-interpreting the traced jaxpr equation by
equation: every value the plan lays out is passed through ``jax.lax.with_sharding_constraint``
with its layout, and where an op reads a tensor in another layout (FSDP's gathered weights)
the operand is constrained to that layout first. XLA's SPMD partitioner then has nothing left
to choose, and inserts the collectives the plan predicted. Calls are inlined, ``remat``
regions stay ``jax.checkpoint`` regions (so XLA does not merge the recomputation away), and
``scan``/``while``/``cond`` are rebuilt around their interpreted bodies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.core import Literal
from jax.sharding import Mesh, NamedSharding

from autolayout.core import (
    Graph,
    MeshError,
    Plan,
    PlanError,
    Workload,
    accumulation_for_plan,
    closed_parts,
    mesh_text,
    partition_spec,
    path_str,
    remat_for_plan,
    trace_with_jaxpr,
)
from autolayout.cost_models import RUNNABLE, output_layouts

from .kernels import (
    CUDNN,
    SPLASH,
    check_kernels,
    composed,
    run_grouped,
    run_in_place,
    run_sharded,
    runs_grouped,
)
from .pipeline import INLINE, pipelined_scan, stage_scans


def make_mesh(plan: Plan, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``Mesh`` of the plan's shape over ``devices`` (default: all of ``jax.devices()``)."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) != plan.devices:
        shown = mesh_text(plan.mesh)
        raise MeshError(
            f"the plan's mesh {shown} needs {plan.devices} devices but {len(devices)} are "
            f"available (on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{plan.devices} before jax starts)"
        )
    return Mesh(np.array(devices).reshape(tuple(plan.mesh.values())), tuple(plan.mesh))


class _Interpreter:
    def __init__(
        self, plan: Plan, mesh: Mesh, visits: dict, producer: dict[str, str], graph: Graph
    ):
        self.plan, self.mesh, self.visits, self.producer = plan, mesh, visits, producer
        self.graph = graph
        self.stage_eqns: dict[str, Any] = {}  # the stack's scans as one stage traces them
        self._shardings: dict[tuple, NamedSharding] = {}
        self.in_place = False  # cuDNN attention run as JAX's composition (runtime.kernels)

    def sharding(self, layout) -> NamedSharding:
        s = self._shardings.get(layout)
        if s is None:
            s = self._shardings[layout] = NamedSharding(self.mesh, partition_spec(layout))
        return s

    def pin(self, x: Any, layout) -> Any:
        if layout is None or not hasattr(x, "shape") or len(layout) != len(x.shape):
            return x
        return jax.lax.with_sharding_constraint(x, self.sharding(layout))

    def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], path: tuple) -> list:
        env: dict[Any, Any] = {}
        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for v, x in zip(jaxpr.invars, args, strict=True):
            env[v] = x

        def read(v: Any) -> Any:
            return v.val if isinstance(v, Literal) else env[v]

        layouts = self.plan.layouts
        for index, eqn in enumerate(jaxpr.eqns):
            key = path + (index,)
            ins = [read(v) for v in eqn.invars]
            prim = eqn.primitive.name
            if prim in INLINE:
                sub, sub_consts = closed_parts(eqn.params[INLINE[prim]])
                outs = self.run(sub, sub_consts, ins, key)
            elif prim in ("remat2", "checkpoint"):
                outs = self._remat(eqn, ins, key)
            elif prim == "scan":
                outs = self._scan(eqn, ins, key)
            elif prim == "while":
                outs = self._while(eqn, ins, key)
            elif prim == "cond":
                outs = self._cond(eqn, ins, key)
            else:
                in_names, out_names = self.visits.get(key, ([], []))
                op = next((self.producer[n] for n in out_names if n in self.producer), None)
                reads = self.plan.reads.get(op, {}) if op else {}
                ins = [
                    self.pin(x, reads.get(n)) if n in reads else x
                    for x, n in zip(ins, in_names, strict=False)
                ]
                if self.in_place and eqn.primitive.name in CUDNN:  # no cuDNN on these devices
                    res = run_in_place(eqn.primitive.name, eqn.params, ins)
                elif prim in SPLASH:  # a Pallas kernel XLA cannot split: on each shard
                    lay = [reads.get(n, layouts.get(n)) for n in in_names]
                    res = run_sharded(eqn, ins, lay, self.mesh)
                elif not self.stage_eqns and (batch := runs_grouped(eqn)):  # XLA: whole
                    lay = [reads.get(n, layouts.get(n)) for n in in_names]
                    res = run_grouped(eqn, batch, ins, lay, self.mesh)
                else:
                    res = eqn.primitive.bind(*ins, **eqn.params)
                outs = list(res) if eqn.primitive.multiple_results else [res]
                outs = [
                    self.pin(x, layouts.get(n)) if n is not None else x
                    for x, n in zip(outs, out_names, strict=False)
                ]
            for v, x in zip(eqn.outvars, outs, strict=True):
                env[v] = x
        return [read(v) for v in jaxpr.outvars]

    def _remat(self, eqn: Any, ins: list, key: tuple) -> list:
        sub, sub_consts = closed_parts(eqn.params["jaxpr"])

        def body(*a):
            return self.run(sub, sub_consts, a, key)

        p = eqn.params
        return list(jax.checkpoint(body, prevent_cse=p.get("prevent_cse", True))(*ins))

    def _scan(self, eqn: Any, ins: list, key: tuple) -> list:
        pipe = self.plan.solver.get("pipeline")
        if pipe and key in self.visits:  # a scan over the layer stack, run as a pipeline
            names = self.visits[key]
            op = next((self.producer[n] for n in names[1] if n in self.producer), None)
            if op in pipe["loops"]:
                outs = pipelined_scan(
                    eqn, ins, names, self.graph, self.mesh, pipe, self.stage_eqns[op]
                )
                layouts = self.plan.layouts
                return [self.pin(x, layouts.get(n)) if n is not None else x
                        for x, n in zip(outs, names[1], strict=False)]  # fmt: skip
        p = eqn.params
        body, body_consts = closed_parts(p["jaxpr"])
        nc, nk = p["num_consts"], p["num_carry"]
        consts, init, xs = ins[:nc], ins[nc : nc + nk], ins[nc + nk :]

        def step(carry, x):
            out = self.run(body, body_consts, [*consts, *carry, *x], key)
            return out[:nk], out[nk:]

        carry, ys = jax.lax.scan(
            step, list(init), list(xs), length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
        )
        return [*carry, *ys]

    def _while(self, eqn: Any, ins: list, key: tuple) -> list:
        p = eqn.params
        cj, cjc = closed_parts(p["cond_jaxpr"])
        bj, bjc = closed_parts(p["body_jaxpr"])
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cc, bc, init = ins[:cn], ins[cn : cn + bn], ins[cn + bn :]
        return list(
            jax.lax.while_loop(
                lambda c: self.run(cj, cjc, [*cc, *c], key + ("cond",))[0],
                lambda c: self.run(bj, bjc, [*bc, *c], key + ("body",)),
                list(init),
            )
        )

    def _cond(self, eqn: Any, ins: list, key: tuple) -> list:
        branches = []
        for k, br in enumerate(eqn.params["branches"]):
            j, jc = closed_parts(br)
            branches.append(lambda *a, j=j, jc=jc, k=k: self.run(j, jc, a, key + (k,)))
        return list(jax.lax.switch(ins[0], branches, *ins[1:]))


def check_inputs(plan: Plan, leaves: Sequence[Any], paths: Sequence[str]) -> None:
    """Refuses arguments that are not the ones the plan was made for."""
    if len(leaves) != len(plan.inputs):
        raise PlanError(
            f"the plan for {plan.model!r} has {len(plan.inputs)} inputs, the function's arguments "
            f"have {len(leaves)}: it was made for another model"
        )
    for leaf, path, want in zip(leaves, paths, plan.inputs, strict=True):
        shape = tuple(getattr(leaf, "shape", ()))
        if shape != tuple(want["shape"]) or path != want["path"]:
            raise PlanError(
                f"argument {path} has shape {shape} but the plan for {plan.model!r} expects "
                f"{want['path']} of shape {tuple(want['shape'])}: it was made for another model "
                f"or size"
            )


def apply(
    plan: Plan,
    fn: Any,
    devices: Sequence[Any] | None = None,
    *,
    workload: Workload | None = None,
):
    """``fn`` as a ``jax.jit`` function laid out as ``plan`` says.

    The result is called like ``fn`` (with real arrays) or lowered and compiled on abstract
    arguments (``.lower(*workload.args).compile()``). The plan's mesh must have as many
    devices as ``devices`` (default ``jax.devices()``).
    """

    wl = workload or plan.workload
    if wl is None:
        raise PlanError(
            "al.apply needs the plan's workload: pass workload=al.load_workload(...) for a plan "
            "read from a file"
        )
    mesh = make_mesh(plan, devices)
    # a plan made with a remat policy lays out the step rewritten with it (al.remat)
    # (and one accumulating gradients over microbatches, the step rebuilt as a scan over them)
    wl_fn = remat_for_plan(plan, accumulation_for_plan(
        plan, Workload(fn, wl.args, donate_argnums=wl.donate_argnums, name=wl.name)
    ))  # fmt: skip
    fn = wl_fn.fn
    flat, treedef = jax.tree_util.tree_flatten_with_path(wl.args)
    paths = [path_str(p, wl.argnames) for p, _ in flat]
    check_inputs(plan, [leaf for _, leaf in flat], paths)
    graph, closed, visits = trace_with_jaxpr(wl_fn)
    in_place = check_kernels(graph, mesh)  # a note where cuDNN attention runs as JAX's own
    if not plan.layouts:
        raise PlanError(f"the plan for {plan.model!r} holds no tensor layouts; re-run the planner")
    missing = [t for t in graph.tensors if t not in plan.layouts]
    if missing or len(graph.tensors) != len(plan.layouts):
        raise PlanError(
            f"the plan's traced step for {plan.model!r} has {len(plan.layouts)} tensors, this "
            f"function has {len(graph.tensors)}: the plan was made for another function"
        )
    producer = {o: op.name for op in graph.ops for o in op.outputs}
    interp = _Interpreter(plan, mesh, visits, producer, graph)
    interp.in_place = composed(graph, mesh) > 0
    pipe = plan.solver.get("pipeline")
    if pipe and interp.in_place:
        raise PlanError(
            f"the pipelined plan's stages call cuDNN attention, which runs only on NVIDIA GPUs, "
            f"and these devices are {mesh.devices.flat[0].platform}: run it on GPUs"
        )
    if pipe and any(op.primitive in SPLASH for op in graph.ops):
        raise PlanError(
            "the pipelined plan's stages call splash attention, which al.apply does not run "
            "inside a pipeline stage yet: plan it without --pipeline"
        )
    if pipe:
        if pipe["schedule"] not in RUNNABLE:
            raise PlanError(
                f"the plan's pipeline schedule is {pipe['schedule']} (priced as Megatron-LM runs "
                f"it), which al.apply does not run: it runs {', '.join(RUNNABLE)}; plan with "
                f"--schedule gpipe to run it here"
            )
        interp.stage_eqns = stage_scans(wl_fn, graph, pipe)
    in_shardings = jax.tree_util.tree_unflatten(
        treedef, [interp.sharding(i["layout"]) for i in plan.inputs]
    )
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *wl.args))
    # new state comes back in its input's layout (the resharding into it is priced), so the
    # donated buffers are reused and the outputs are the next step's inputs as they are
    out_shardings = jax.tree_util.tree_unflatten(
        out_tree, [interp.sharding(lay) for lay in output_layouts(wl, graph, plan.layouts)]
    )
    jaxpr, consts = closed.jaxpr, closed.consts

    def laid_out(*args):
        leaves = jax.tree_util.tree_leaves(args)
        outs = interp.run(jaxpr, consts, leaves, ())
        return jax.tree_util.tree_unflatten(out_tree, outs)

    laid_out.__name__ = getattr(fn, "__name__", "step")
    jitted = jax.jit(
        laid_out,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        donate_argnums=wl.donate_argnums,
    )
    jitted.notes = [in_place] if in_place else []  # what runs other than as planned
    return jitted
