"""The tracer: ``jax.make_jaxpr`` of a whole train step, then named dims by union-find.

Every (variable, axis) of the jaxpr is a node. Per-primitive rules (``_dim_rules.py``) link
the axes that are one iteration axis of an equation; higher-order primitives are walked
here (``jit``, ``remat``, custom derivatives inlined; ``scan`` bodies once, with their trip
count; ``while`` and ``cond`` bodies once each; an inlined call of a jaxpr already walked,
such as every remat layer after the first, is stamped from that walk). Two union-finds then
run over the links in program order:

* *families*: every link unites. Axes of one family are the same index space.
* *dims*: a link unites only when the merged class would still hold at most one axis of any
  tensor, and at most one user-given name. Attention's scores ``[b, h, s, s]`` thus carry
  two dims of the ``seq`` family, and a user's ``heads`` never becomes their ``d_ff``.

The same place in every copy of a layer is one dim (``_roles.copy_groups``). Dims are
named, in order of preference, by the user's ``al.spec`` names, by their role found from the
program's structure (``_roles.role_names``: ``batch``, ``vocab``, ``heads``, ``d_ff``...), by
the dims a reshape merged (``heads*head_dim``), by a weight's path without its layer index
and axis (``down_proj.1``), as a further member of a named family (``seq#2``), or by the op
that produced them.
"""

from __future__ import annotations

import contextlib
import gc as _gc
import re
from collections.abc import Sequence
from typing import Any

import jax
from jax._src.cudnn import fused_attention_stablehlo as _cudnn_attention  # (jax is pinned)
from jax.extend.core import Literal

from ._builder import _Builder
from ._dim_rules import DIM_RULES, Opaque, storage_dtype
from ._errors import TraceError, WorkloadError
from ._ir import Graph, Loop, Tensor, hoist_ops
from ._naming import _eliminate_dead, _name_dims
from ._workload import _TARGET, Spec, Workload, path_str

# --- walking ----------------------------------------------------------------------------------


def _walk(b: _Builder, jaxpr: Any, ins: Sequence[int | None], consts: Sequence[int]) -> list[int]:
    env: dict[Any, int] = {}
    for v, t in zip(jaxpr.constvars, consts, strict=True):
        env[v] = t
    for v, t in zip(jaxpr.invars, ins, strict=True):
        env[v] = t if t is not None else b.new(v.aval, "const")

    for index, eqn in enumerate(jaxpr.eqns):
        ins_ = [None if isinstance(v, Literal) else env[v] for v in eqn.invars]
        prim = eqn.primitive.name
        walker = CALL_RULES.get(prim)
        b.path.append(index)
        n = _user_names(eqn)
        b.joined.append(_join_stack(b.joined[-1] if b.joined else "", n))
        if walker is not None:
            outs = walker(b, eqn, ins_)
        else:
            outs = [b.new(v.aval) for v in eqn.outvars]
            number = b.begin()
            rule = DIM_RULES.get(prim)
            try:
                if rule is None:
                    raise KeyError(prim)
                params, flops = rule(b, eqn, ins_, outs)
                opaque = False
            except Exception as e:  # no rule, or one that cannot read this equation
                b.drop_links()
                params, flops, opaque = {"reason": _reason(prim, e)}, 0.0, True
            b.emit(number, prim, ins_, outs, params, flops, opaque)
        if b.visiting:
            b.visit(tuple(b.path), ins_, outs)
        b.path.pop()
        b.joined.pop()
        for v, t in zip(eqn.outvars, outs, strict=True):
            env[v] = t
    return [env[v] if not isinstance(v, Literal) else b.new(v.aval, "const") for v in jaxpr.outvars]


_TRANSFORM = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\(")
_USER_NAMES: dict[Any, str] = {}  # name stack -> its user names (many equations share one)


def _user_names(eqn: Any) -> str:
    """The equation's ``jax.named_scope`` names, without the transforms JAX wraps them in:
    ``transpose(jvp(layers.3))/mlp`` -> ``layers.3/mlp`` (relative to the enclosing call)."""
    stack = getattr(getattr(eqn, "source_info", None), "name_stack", None)
    if stack is None:
        return ""
    try:
        v = _USER_NAMES.get(stack)
    except TypeError:  # a stack that does not hash
        v, stack = None, None
    if v is None:
        s = _TRANSFORM.sub("", str(stack)).replace(")", "")
        v = "/".join(x for x in s.split("/") if x)
        if stack is not None:
            if len(_USER_NAMES) > 100_000:  # a long session's traces: bounded
                _USER_NAMES.clear()
            _USER_NAMES[stack] = v
    return v


def _reason(prim: str, e: Exception) -> str:
    if isinstance(e, Opaque):  # a policy: kept whole on purpose
        return str(e)
    if isinstance(e, KeyError) and e.args == (prim,):
        return f"no dim rule for primitive {prim!r}"
    return f"dim rule for {prim!r} failed: {type(e).__name__}: {e}"


def closed_parts(j: Any) -> tuple[Any, list[Any]]:
    """(jaxpr, consts) of a ClosedJaxpr or an open Jaxpr."""
    if hasattr(j, "jaxpr") and hasattr(j, "consts"):
        return j.jaxpr, list(j.consts)
    return j, []


def _consts(b: _Builder, jaxpr: Any) -> list[int]:
    return [b.new(v.aval, "const") for v in jaxpr.constvars]


def _inline(key: str, scope: str | None = None):
    """Walks a call's inner jaxpr in place: its ops become the caller's, its outputs alias.

    A call of a jaxpr walked before (JAX shares one jaxpr object among the calls of one
    function on the same types: the 96 remat layers of a stack) is stamped from that walk's
    record (:class:`_Template`) with its own tensors, op numbers, scopes and name stacks,
    instead of walked again; the graph is the same (the tests compare)."""

    def walker(b: _Builder, eqn: Any, ins: list[int | None]) -> list[int]:
        jaxpr, _ = closed_parts(eqn.params[key])
        label = scope or str(eqn.params.get("name", eqn.primitive.name))
        if scope == "remat":
            label = f"remat.{b.take_number()}"
        pattern = tuple(-1 if t is None else ins.index(t) for t in ins)
        memo = (id(jaxpr), scope or label, b.trip, pattern)
        tpl = b.templates.get(memo)
        if tpl is not None and tpl.jaxpr is jaxpr:
            return tpl.stamp(b, ins, label)
        start = _Template.start(b, label)
        b.scope.append(label)
        try:
            outs = _walk(b, jaxpr, ins, _consts(b, jaxpr))
        finally:
            b.scope.pop()
        tpl = _Template.record(b, start, jaxpr, ins, outs)
        if tpl is not None:
            b.templates[memo] = tpl
        return outs

    return walker


def _join_stack(up: str, rest: str) -> str:
    """``up`` and a name stack ``rest`` under it, as the walk joins them."""
    return f"{up}/{rest}" if up and rest else up or rest


class _Template:
    """What walking one inlined call added to the builder, over relative references: a
    tensor made inside as its offset from the first one made (>= 0), an input of the call as
    ``-(position + 1)``; op numbers, scopes' ``remat.N`` labels and name stacks relative to
    the call's. :meth:`stamp` adds the same for another call of the same jaxpr."""

    @staticmethod
    def start(b: _Builder, label: str) -> tuple:
        return (len(b.shapes), b.nax, b.number, len(b.ops), len(b.loops), len(b.visit_keys),
                tuple(b.scope), label, b.joined[-1] if b.joined else "", tuple(b.path))  # fmt: skip

    @classmethod
    def record(cls, b: _Builder, start: tuple, jaxpr: Any, ins, outs) -> _Template | None:
        t0, nax0, num0, ops0, loops0, visits0, outer, label, stack, path = start
        t1, num1 = len(b.shapes), b.number
        if len(b.loops) != loops0:  # loops' parameters name tensors: walked each time
            return None
        where = {t: k for k, t in enumerate(ins) if t is not None}

        def rel(t: int | None) -> int | None:
            if t is None:
                return None
            if t0 <= t < t1:
                return t - t0
            return -(where[t] + 1)  # KeyError: a tensor from outside the call (none expected)

        prefix = (*outer, label)
        tpl = cls()
        tpl.jaxpr = jaxpr
        tpl.numbers = num1 - num0
        tpl.nax = b.nax - nax0
        tpl.shapes, tpl.dtypes = b.shapes[t0:t1], b.dtypes[t0:t1]
        tpl.roles, tpl.paths = b.roles[t0:t1], b.paths[t0:t1]
        tpl.hosts = b.hosts[t0:t1]
        tpl.offsets = [o - nax0 for o in b.offsets[t0:t1]]
        tpl.user = [(t - t0, b.user[t]) for t in range(t0, t1) if t in b.user]
        tpl.ops = []
        try:
            for op, (n, op_ins, op_outs) in zip(b.ops[ops0:], b.int_io[ops0:], strict=True):
                if op.scope[: len(prefix)] != prefix:
                    return None
                ns = op.name_stack
                if stack and not (ns == stack or ns.startswith(stack + "/")):
                    return None
                suffix = tuple(
                    ("remat", int(x[6:]) - num0)
                    if x.startswith("remat.") and x[6:].isdigit() and num0 <= int(x[6:]) < num1
                    else x
                    for x in op.scope[len(prefix) :]
                )
                links = [tuple((rel(t), a) for t, a in grp) for grp in b.int_links[n]]
                ins_r = [rel(t) for t in op_ins]
                outs_r = [rel(t) for t in op_outs]
                rest = ns if not stack else ns[len(stack) + 1 :]  # under the call's stack
                tpl.ops.append((n - num0, op.primitive, ins_r, outs_r, links, op.params, op.flops,
                                suffix, op.opaque, rest))  # fmt: skip
            tpl.visits = [
                (k[len(path) :], [rel(t) for t in b.visits[k][0]], [rel(t) for t in b.visits[k][1]])
                for k in b.visit_keys[visits0:]
            ]
            tpl.outs = [rel(t) for t in outs]
        except KeyError:
            return None
        return tpl

    def stamp(self, b: _Builder, ins: list[int | None], label: str) -> list[int]:
        n0, num0 = len(b.shapes), b.number
        b.names.extend(f"t{n0 + k}" for k in range(len(self.shapes)))
        b.shapes += self.shapes
        b.dtypes += self.dtypes
        b.roles += self.roles
        b.paths += self.paths
        b.hosts += self.hosts
        b.offsets += [b.nax + o for o in self.offsets]
        b.nax += self.nax
        for k, dims in self.user:
            b.user[n0 + k] = dims
        b.number += self.numbers

        def ref(r: int | None) -> int | None:
            return None if r is None else n0 + r if r >= 0 else ins[-r - 1]

        prefix = (*b.scope, label)
        stack = b.joined[-1] if b.joined else ""
        scopes: dict[tuple, tuple] = {}
        for off, prim, ins_r, outs_r, links, params, flops, suffix, opaque, rest in self.ops:
            scope = scopes.get(suffix)
            if scope is None:
                scope = scopes[suffix] = prefix + tuple(
                    f"remat.{num0 + x[1]}" if isinstance(x, tuple) else x for x in suffix
                )
            groups = [tuple([(ref(t), a) for t, a in grp]) for grp in links]
            b.add_op(num0 + off, prim, [ref(r) for r in ins_r], [ref(r) for r in outs_r], groups,
                     params, flops, scope, opaque, _join_stack(stack, rest))  # fmt: skip
        path = tuple(b.path)
        for suffix, v_ins, v_outs in self.visits:
            b.visit(path + suffix, [ref(r) for r in v_ins], [ref(r) for r in v_outs])
        return [ref(r) for r in self.outs]


def _link_all_axes(b: _Builder, x: int, y: int, shift_x: int = 0) -> None:
    for ax in range(len(b.shapes[y])):
        b.link_pair(x, ax + shift_x, y, ax)


def _scan(b: _Builder, eqn: Any, ins: list[int | None]) -> list[int]:
    p = eqn.params
    jaxpr, _ = closed_parts(p["jaxpr"])
    nc, nk, length = p["num_consts"], p["num_carry"], int(p["length"])
    number = b.begin()
    name = f"scan.{number}"
    body_in: list[int | None] = []
    for k, (v, t) in enumerate(zip(jaxpr.invars, ins, strict=True)):
        if k < nc:
            body_in.append(t)
            continue
        bt = b.new(v.aval, "loop")
        if t is not None:
            _link_all_axes(b, t, bt, shift_x=0 if k < nc + nk else 1)
        body_in.append(bt)
    first = len(b.ops)
    b.scope.append(name)
    b.trip *= max(length, 1)
    try:
        body_out = _walk(b, jaxpr, body_in, _consts(b, jaxpr))
    finally:
        b.trip //= max(length, 1)
        b.scope.pop()
    outs = []
    for k, v in enumerate(eqn.outvars):
        o = b.new(v.aval)
        if k < nk:
            _link_all_axes(b, o, body_out[k])
            carried = body_in[nc + k]
            if carried is not None and carried != body_out[k]:
                _link_all_axes(b, body_out[k], carried)
        else:
            _link_all_axes(b, o, body_out[k], shift_x=1)
        outs.append(o)
    iteration = [(t, 0) for t in ins[nc + nk :] if t is not None] + [(o, 0) for o in outs[nk:]]
    b.link(*iteration)
    params = {"length": length, "reverse": bool(p["reverse"]), "num_consts": nc, "num_carry": nk}
    params["body_outputs"] = tuple(f"t{t}" for t in body_out)
    params["aliased_inputs"] = tuple(f"t{t}" for t in ins[:nc] if t is not None)
    params["scanned_inputs"] = tuple(f"t{t}" for t in body_in[nc + nk :] if t is not None)
    # (outer input, body input) pairs of the carries and scanned inputs
    params["body_inputs"] = tuple(
        (f"t{t}", f"t{bt}")
        for t, bt in zip(ins[nc:], body_in[nc:], strict=True)
        if t is not None and bt is not None
    )
    # (body output, body input) of each carry: the next iteration reads what this one wrote
    params["carries"] = tuple(
        (f"t{body_out[k]}", f"t{body_in[nc + k]}")
        for k in range(nk)
        if body_in[nc + k] is not None and body_in[nc + k] != body_out[k]
    )
    b.emit(number, "scan", ins, outs, params)
    b.loops.append(Loop(name, "scan", length, tuple(op.name for op in b.ops[first:-1])))
    return outs


def _while(b: _Builder, eqn: Any, ins: list[int | None]) -> list[int]:
    p = eqn.params
    cj, _ = closed_parts(p["cond_jaxpr"])
    bj, _ = closed_parts(p["body_jaxpr"])
    cn, bn = p["cond_nconsts"], p["body_nconsts"]
    number = b.begin()
    name = f"while.{number}"
    carry = []
    for v, t in zip(bj.invars[bn:], ins[cn + bn :], strict=True):
        ct = b.new(v.aval, "loop")
        if t is not None:
            _link_all_axes(b, t, ct)
        carry.append(ct)
    first = len(b.ops)
    b.scope.append(name)
    try:
        b.path.append("cond")
        cond_out = _walk(b, cj, list(ins[:cn]) + carry, _consts(b, cj))
        b.path[-1] = "body"
        body_out = _walk(b, bj, list(ins[cn : cn + bn]) + carry, _consts(b, bj))
    finally:
        b.path.pop()
        b.scope.pop()
    outs = []
    for v, bo, ct in zip(eqn.outvars, body_out, carry, strict=True):
        o = b.new(v.aval)
        if bo != ct:
            _link_all_axes(b, bo, ct)
        _link_all_axes(b, o, bo)
        outs.append(o)
    live = tuple(f"t{t}" for t in body_out + cond_out)
    aliased = tuple(f"t{t}" for t in ins[: cn + bn] if t is not None)
    params = {
        "trip_count_known": False,
        "body_outputs": live,
        "aliased_inputs": aliased,
        "body_inputs": tuple(
            (f"t{t}", f"t{ct}")
            for t, ct in zip(ins[cn + bn :], carry, strict=True)
            if t is not None
        ),
        "carries": tuple(
            (f"t{bo}", f"t{ct}") for bo, ct in zip(body_out, carry, strict=True) if bo != ct
        ),
    }
    b.emit(number, "while", ins, outs, params)
    body = tuple(op.name for op in b.ops[first:-1])
    b.loops.append(Loop(name, "while", 1, body, length_known=False))
    return outs


def _cond(b: _Builder, eqn: Any, ins: list[int | None]) -> list[int]:
    number = b.begin()
    name = f"cond.{number}"
    outs = [b.new(v.aval) for v in eqn.outvars]
    branch_out: list[int] = []
    for i, br in enumerate(eqn.params["branches"]):
        jaxpr, _ = closed_parts(br)
        b.scope.append(f"{name}/branch{i}")
        b.path.append(i)
        try:
            res = _walk(b, jaxpr, ins[1:], _consts(b, jaxpr))
        finally:
            b.path.pop()
            b.scope.pop()
        for o, r in zip(outs, res, strict=True):
            _link_all_axes(b, o, r)
        branch_out += res
    params = {
        "branches": len(eqn.params["branches"]),
        "body_outputs": tuple(f"t{t}" for t in branch_out),
        "aliased_inputs": tuple(f"t{t}" for t in ins[1:] if t is not None),
    }
    b.emit(number, "cond", ins, outs, params)
    return outs


CALL_RULES = {
    "jit": _inline("jaxpr"),
    "pjit": _inline("jaxpr"),
    "closed_call": _inline("call_jaxpr"),
    "core_call": _inline("call_jaxpr"),
    "remat2": _inline("jaxpr", "remat"),
    "checkpoint": _inline("jaxpr", "remat"),
    "custom_jvp_call": _inline("call_jaxpr"),
    "custom_vjp_call": _inline("call_jaxpr"),
    "custom_vjp_call_jaxpr": _inline("fun_jaxpr"),
    "call": _inline("call_jaxpr"),
    "composite": _inline("jaxpr"),  # lax.composite: XLA partitions its decomposition
    "custom_vmap_call": _inline("call"),
    "scan": _scan,
    "while": _while,
    "cond": _cond,
}


# --- entry point ------------------------------------------------------------------------------


@contextlib.contextmanager
def gc_paused(collect: bool = True):
    """Python's cyclic garbage collector off while a phase builds many long-lived objects
    (a 96-layer step: 36k ops, JAX's tracers): each collection walks all of them, which
    made tracing and the search's analysis about 1.5x slower (measured). The young
    collection the pause put off (every object the phase made and kept) runs at its end,
    inside the phase, instead of at whatever allocation comes next. ``collect=False``, for
    a command whose process ends next: they are frozen instead (``gc.freeze``: never walked;
    the walk took 1.2 s after a 96-layer plan)."""
    was = _gc.isenabled()
    _gc.disable()
    try:
        yield
    finally:
        if was:
            if not collect:
                _gc.freeze()
            _gc.enable()
            if collect:
                _gc.collect(0)


ASSUMED_CUDNN = 91000  # the cuDNN version a trace on a machine without one assumes (9.10)


@contextlib.contextmanager
def gpu_kernels_traceable():
    """JAX's cuDNN attention (``jax.nn.dot_product_attention(implementation="cudnn")``) asks
    for cuDNN while it is traced, so a step written for NVIDIA GPUs would not trace on the
    laptop that plans it. Inside this block a machine without cuDNN answers as one with
    cuDNN 9.10 would: the step traces to JAX's own attention primitives (they compile only
    on a GPU, where the real check runs)."""
    fa = _cudnn_attention
    real = getattr(fa, "check_cudnn_version", None)
    if real is None:  # another jax: its own check stands
        yield
        return

    def check() -> int:
        try:
            return real()
        except RuntimeError:
            return ASSUMED_CUDNN

    fa.check_cudnn_version = check
    try:
        yield
    finally:
        fa.check_cudnn_version = real


def step_jaxpr(workload: Workload) -> Any:
    """The closed jaxpr of the workload's step: ``jax.make_jaxpr`` of its function, or the
    jaxpr the function carries as ``fn.closed_jaxpr`` where that takes the workload's
    arguments (a step that only interprets a jaxpr, as a rewrite of another step's does:
    tracing its Python again would make the same jaxpr, 1 s at T5-3B's 25k equations)."""
    own = getattr(workload.fn, "closed_jaxpr", None)
    if own is not None:
        leaves = jax.tree.leaves(workload.args)
        avals = [v.aval for v in own.jaxpr.invars]
        if len(avals) == len(leaves) and all(
            a.shape == tuple(x.shape) and a.dtype == x.dtype
            for a, x in zip(avals, leaves, strict=True)
        ):
            return own
    return step_jaxpr_and_shape(workload)[0]


def step_jaxpr_and_shape(workload: Workload) -> tuple[Any, Any]:
    """``jax.make_jaxpr(workload.fn, return_shape=True)`` of the workload's arguments, made
    once a workload, target and precision (``remat="auto"`` traces the step and rewrites it:
    GPT-3 175B's 96 layers take 1 s of JAX's tracing each time)."""
    leaves = jax.tree.leaves(workload.args)
    key = (_TARGET[0], bool(jax.config.jax_enable_x64), jax.config.jax_default_matmul_precision,
           tuple((tuple(x.shape), str(x.dtype)) for x in leaves))  # fmt: skip
    hit = workload.__dict__.get("_step_jaxpr")
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    with gpu_kernels_traceable():
        closed, shape = jax.make_jaxpr(workload.fn, return_shape=True)(*workload.args)
    workload.__dict__["_step_jaxpr"] = (key, closed, shape)  # a frozen dataclass's cache
    return closed, shape


def trace(workload: Workload) -> Graph:
    """Traces a workload's whole train step into a :class:`Graph` over named dims.

    Example:
      >>> import autolayout as al, jax, jax.numpy as jnp
      >>> def step(w, x):
      ...     return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
      >>> g = al.trace(al.Workload(step, (al.spec((8, 16), ("d_in", "d_out")),
      ...                                 al.spec((4, 8), ("batch", "d_in")))))
      >>> sorted(g.dims.items())
      [('batch', 4), ('d_in', 8), ('d_out', 16)]
      >>> g.opaque
      []
    """
    return trace_with_jaxpr(workload, visits=False)[0]


def trace_with_jaxpr(
    workload: Workload, visits: bool = True
) -> tuple[Graph, Any, dict[tuple, tuple]]:
    """:func:`trace`, plus the closed jaxpr and, per equation visited (keyed by its path of
    equation indices), the tensor names of its inputs and outputs (``None`` for a literal or
    a dead value): the runtime re-interprets that jaxpr with the plan's shardings.
    ``visits=False`` records none (an empty dict)."""
    if not isinstance(workload, Workload):
        raise WorkloadError(f"trace() takes an al.Workload, got {type(workload).__name__}")
    with gc_paused():
        return _trace_with_jaxpr(workload, visits)


def _trace_with_jaxpr(workload: Workload, visits: bool) -> tuple[Graph, Any, dict[tuple, tuple]]:
    leaves = jax.tree_util.tree_flatten_with_path(workload.args)[0]
    try:
        closed = step_jaxpr(workload)
    except Exception as e:
        raise TraceError(
            f"jax.make_jaxpr of workload {workload.name!r} failed: {type(e).__name__}: {e}"
        ) from e
    jaxpr = closed.jaxpr
    if len(jaxpr.invars) != len(leaves):
        raise TraceError(
            f"workload {workload.name!r}: the jaxpr has {len(jaxpr.invars)} inputs but the arguments have "
            f"{len(leaves)} leaves"
        )
    b = _Builder(visits)
    argnames = workload.argnames
    ins, data = [], set()
    for v, (path, leaf) in zip(jaxpr.invars, leaves, strict=True):
        t = b.new(v.aval, "input", path_str(path, argnames))
        if isinstance(leaf, Spec):
            b.user[t] = leaf.dims
        ins.append(t)
        arg = path[0].idx if path and hasattr(path[0], "idx") else -1
        # the data: arguments the step does not donate (its state), or those called batch
        if (b.paths[t] or "").startswith("batch") or (
            workload.donate_argnums and arg not in workload.donate_argnums
        ):
            data.add(t)
    outs = _walk(b, jaxpr, ins, _consts(b, jaxpr))
    live = _eliminate_dead(b, outs) | set(ins)
    axis_dims, dims = _name_dims(b, ins, live, data)
    tensors = {}
    for t, shape in enumerate(b.shapes):
        if t not in live:
            continue
        o = b.offsets[t]
        tensors[f"t{t}"] = Tensor(
            name=f"t{t}",
            shape=shape,
            dtype=storage_dtype(b.dtypes[t]),  # a PRNG key as the bytes of its data
            dims=tuple(axis_dims[o : o + len(shape)]),
            role=b.roles[t],
            path=b.paths[t],
            host=b.hosts[t],
        )
    graph = Graph(
        name=workload.name,
        ops=hoist_ops(b.ops),
        tensors=tensors,
        dim_info=dims,
        inputs=tuple(f"t{t}" for t in ins),
        outputs=tuple(f"t{t}" for t in outs),
        loops=tuple(b.loops),
    )

    def name(t: int | None) -> str | None:
        return f"t{t}" if t is not None and t in live else None

    named = {k: ([name(t) for t in i], [name(t) for t in o]) for k, (i, o) in b.visits.items()}
    return graph, closed, named
