"""A scan over a layer stack run as a pipeline: ``shard_map`` over the ``stage`` axis,
``ppermute`` between neighbouring stages.

The step is already differentiated, so its forward scan over the layers and the backward
scan (the forward's transpose, in reverse) are each pipelined as they stand: stage ``s`` holds
layers ``s L/P .. (s+1) L/P - 1`` (the stacked weights split over ``stage``, as the plan's rule
``layers -> stage`` lays them out), the batch is cut into ``M`` microbatches, and in iteration
``t`` stage ``s`` runs microbatch ``t - s`` through its layers and sends the carry on: ``M + P -
1`` iterations (GPipe's order, forward then backward). What the scan reads or writes per layer
with a batch dim (the backward's residuals) is cut the same way; a per-layer result without one
is a sum over the batch (a weight's gradient), summed over microbatches, or a function of the
weights alone, the same for every microbatch. The other mesh axes stay GSPMD's, laid out by the
plan's rules. Iterations where a stage has no microbatch (the bubble) compute on zeros and are
masked.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Literal
from jax.sharding import PartitionSpec

from autolayout.core import (
    Graph,
    PlanError,
    Stack,
    Workload,
    closed_parts,
    stage_workload,
    trace_with_jaxpr,
)

# call primitives whose bodies the interpreter inlines: primitive -> the param holding the body
INLINE = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


def _batch_fed(body: Any, fed: list[bool]) -> list[bool]:
    """Which outputs of ``body`` depend on an input marked in ``fed``."""
    dep = {v: f for v, f in zip(body.invars, fed, strict=True)}
    for eqn in body.eqns:
        d = any(dep.get(v, False) for v in eqn.invars if not isinstance(v, Literal))
        for v in eqn.outvars:
            dep[v] = d
    return [False if isinstance(v, Literal) else dep.get(v, False) for v in body.outvars]


def stage_scans(workload: Workload, graph: Graph, pipe: dict) -> dict[str, Any]:
    """The stack's scan equations as one stage traces them (``stage_workload``: its layers, one
    microbatch), by op name: their bodies are what each stage runs (a jaxpr's shapes are
    fixed, so the whole batch's body cannot run a microbatch)."""
    stack = Stack(pipe["dim"], graph.dims[pipe["dim"]], tuple(pipe["loops"]), pipe["batch"])
    swl = stage_workload(workload, graph, stack, pipe["stages"], pipe["microbatches"])
    sg, closed, visits = trace_with_jaxpr(swl)
    producer = {o: op.name for op in sg.ops for o in op.outputs}
    out: dict[str, Any] = {}

    def walk(jaxpr: Any, path: tuple) -> None:
        for i, eqn in enumerate(jaxpr.eqns):
            key = path + (i,)
            if eqn.primitive.name == "scan" and key in visits:
                op = next((producer[n] for n in visits[key][1] if n in producer), None)
                if op in stack.loops:
                    out[op] = eqn
            elif eqn.primitive.name in INLINE:
                walk(closed_parts(eqn.params[INLINE[eqn.primitive.name]])[0], key)

    walk(closed.jaxpr, ())
    missing = [n for n in stack.loops if n not in out]
    if missing:
        raise PlanError(
            f"one stage's step has no scan {missing[0]}: the model's structure changes with its "
            "batch or layer count, so it cannot be pipelined as planned"
        )
    return out


def pipelined_scan(
    eqn: Any, ins: list, names: tuple[list, list], graph: Graph, mesh: Any, pipe: dict,
    stage_eqn: Any,
) -> list:  # fmt: skip
    """The results of scan ``eqn`` on ``ins``, computed as a pipeline (``pipe``: the plan's
    ``options["pipeline"]``; ``stage_eqn``: the same scan as one stage traces it).
    ``names``: the graph tensors of its inputs and outputs."""
    p = eqn.params
    nc, nk, L = p["num_consts"], p["num_carry"], p["length"]
    P, M, batch = pipe["stages"], pipe["microbatches"], pipe["batch"]
    if L % P:
        raise PlanError(f"the scan over {L} layers does not split into {P} stages")
    k = L // P
    sp = stage_eqn.params
    if (sp["num_consts"], sp["num_carry"], sp["length"]) != (nc, nk, k):
        raise PlanError("one stage's scan differs from the whole step's: cannot pipeline it")
    body, body_consts = closed_parts(sp["jaxpr"])
    in_names, out_names = names

    def axis(name: str | None, lead: int = 0) -> int | None:
        if name is None or name not in graph.tensors:
            return None
        dims = graph.tensors[name].dims
        return dims.index(batch) - lead if batch in dims else None

    consts, init, xs = ins[:nc], ins[nc : nc + nk], ins[nc + nk :]
    ca = [axis(n) for n in in_names[:nc]]
    ka = [axis(n) for n in in_names[nc : nc + nk]]
    xa = [axis(n, 1) for n in in_names[nc + nk :]]  # per layer
    ya = [axis(n, 1) for n in out_names[nk:]]
    if any(a is None for a in ka):
        raise PlanError("a pipelined scan must carry only per-example state (a batch dim)")
    n = [x.shape[a] if a is not None else None for x, a in zip(init, ka, strict=True)]
    if any(b % M for b in n):
        raise PlanError(f"a batch of {n[0]} does not cut into {M} microbatches")
    fed = [a is not None for a in ca] + [True] * nk + [a is not None for a in xa]
    y_fed = _batch_fed(body, fed)[nk:]
    rev = p["reverse"]  # the backward's scan: microbatches enter at the last stage

    def cut(x: Any, a: int) -> Any:  # batch axis a -> [M, B/M, rest...]
        # microbatch m is rows m, M + m, 2M + m, ...: the batch's split over the other axes
        # stays on the rows within a microbatch (a major M would put whole microbatches on
        # devices, and each stage's read of one would gather it)
        x = jnp.moveaxis(x, a, 0)
        return jnp.moveaxis(x.reshape(x.shape[0] // M, M, *x.shape[1:]), 1, 0)

    def join(x: Any, a: int) -> Any:  # [M, B/M, rest...] -> batch axis a (cut's inverse)
        x = jnp.moveaxis(x, 0, 1)
        return jnp.moveaxis(x.reshape(x.shape[0] * x.shape[1], *x.shape[2:]), 0, a)

    def per_stage(x: Any, a: int | None) -> Any:  # [L, ...] -> [P, k, ...] or [P, k, M, mb, ...]
        x = x.reshape(P, k, *x.shape[1:])
        return x if a is None else jax.vmap(jax.vmap(lambda v: cut(v, a)))(x)

    consts_m = [c if a is None else cut(c, a) for c, a in zip(consts, ca, strict=True)]
    init_m = [cut(c, a) for c, a in zip(init, ka, strict=True)]
    xs_s = [per_stage(x, a) for x, a in zip(xs, xa, strict=True)]
    y_avals = [v.aval for v in eqn.outvars[nk:]]

    def stage_fn(consts_m, init_m, xs_s):
        s = jax.lax.axis_index("stage")
        pos = P - 1 - s if rev else s  # the stage's place in the pipeline's order
        w = [x[0] for x in xs_s]
        state = [jnp.zeros(c.shape[1:], c.dtype) for c in init_m]
        outbuf = [jnp.zeros(c.shape, c.dtype) for c in init_m]
        ybuf = []
        for av, a in zip(y_avals, ya, strict=True):
            shape = list(av.shape[1:])
            if a is not None:  # [k, M, mb, rest]
                b = shape.pop(a)
                shape = [M, b // M, *shape]
            ybuf.append(jnp.zeros((k, *shape), av.dtype))

        def iteration(c, t):
            state, outbuf, ybuf = c
            m = t - pos
            valid = (m >= 0) & (m < M)
            mc = jnp.clip(m, 0, M - 1)
            first = jnp.clip(t, 0, M - 1)
            inp = [jnp.where(pos == 0, i[first], st) for i, st in zip(init_m, state, strict=True)]
            cs = [cc if a is None else cc[mc] for cc, a in zip(consts_m, ca, strict=True)]
            xw = [x if a is None else x[:, mc] for x, a in zip(w, xa, strict=True)]

            def layer(carry, xl):
                out = jax.core.eval_jaxpr(body, body_consts, *cs, *carry, *xl)
                return out[:nk], out[nk:]

            new, ys = jax.lax.scan(layer, inp, xw, reverse=rev)
            ys_out = []
            for y, buf, a, f in zip(ys, ybuf, ya, y_fed, strict=True):
                if a is not None:
                    y = jnp.moveaxis(y, a + 1, 1)
                    ys_out.append(buf.at[:, mc].set(jnp.where(valid, y, buf[:, mc])))
                elif f:  # a sum over the batch: over microbatches
                    ys_out.append(buf + jnp.where(valid, y, jnp.zeros_like(y)))
                else:  # the same for every microbatch
                    ys_out.append(jnp.where(valid, y, buf))
            last = valid & (pos == P - 1)
            outbuf = [
                jnp.where(last, ob.at[mc].set(v), ob) for ob, v in zip(outbuf, new, strict=True)
            ]
            perm = [(i + 1, i) if rev else (i, i + 1) for i in range(P - 1)]
            state = [jax.lax.ppermute(v, "stage", perm) for v in new]
            return (state, outbuf, ys_out), None

        (state, outbuf, ybuf), _ = jax.lax.scan(
            iteration, (state, outbuf, ybuf), jnp.arange(M + P - 1)
        )
        # the last stage's results to every stage (what follows the stack runs on all)
        outbuf = [jax.lax.psum(jnp.where(pos == P - 1, ob, jnp.zeros_like(ob)), "stage")
                  for ob in outbuf]  # fmt: skip
        return outbuf, [yb[None] for yb in ybuf]

    rep, split = PartitionSpec(), PartitionSpec("stage")
    outbuf, ybuf = jax.shard_map(
        stage_fn,
        mesh=mesh,
        in_specs=([rep] * nc, [rep] * nk, [split] * len(xs_s)),
        out_specs=([rep] * nk, [split] * len(ya)),
        axis_names={"stage"},
        check_vma=False,
    )(consts_m, init_m, xs_s)
    carry = []
    for ob, a in zip(outbuf, ka, strict=True):
        carry.append(join(ob, a))
    ys = []
    for y, a in zip(ybuf, ya, strict=True):
        if a is not None:  # [P, k, M, mb, rest] -> [L, ..., B at a, ...]
            y = jax.vmap(functools.partial(join, a=a))(y.reshape(L, *y.shape[2:]))
        else:
            y = y.reshape(L, *y.shape[2:])
        ys.append(y)
    return [*carry, *ys]
