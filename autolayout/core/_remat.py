"""Rematerialisation applied to a step as it is written (issue 23): the step is already
differentiated, so a policy is applied to its program. Every forward value the backward pass
reads (a residual) that the policy does not save is recomputed right before its first
backward reader, from the values that are saved, inside a ``remat2`` equation with
``prevent_cse`` — as ``jax.checkpoint`` itself leaves the recomputation in a differentiated
program: XLA puts an optimization barrier on its inputs, so it neither merges the copy back
into the forward value nor moves it before the backward pass reaches it (one cotangent is an
input).

Policies, named as ``jax.checkpoint_policies`` names them:

* ``nothing_saveable``: only the residual stream is kept (the values every path from the
  data to the forward pass's deepest value passes through: each layer's input, as
  ``jax.checkpoint`` around every block keeps); each layer's forward pass is recomputed when
  its backward pass begins.
* ``dots_saveable``: matmul and convolution results are kept, everything else recomputed
  (activations, norms, softmax).
* ``dots_with_no_batch_dims_saveable``: only weight matmuls are kept; attention's scores and
  probabilities are recomputed too (Megatron-LM's selective recomputation).
* ``save_only_these_names:a,b``: the residual stream and the values the step tags with
  ``jax.ad_checkpoint.checkpoint_name(x, "a")`` are kept, everything else recomputed (as
  ``jax.checkpoint_policies.save_only_these_names("a", "b")`` around every block).

A recomputation walks back at most ``MAX_DEPTH`` equations; the value it stops at is saved
(the residual stream of an unrolled model is then kept every few layers, not recomputed
from the first). A scanned layer stack is rewritten as a pair (:func:`remat_scans`): its
forward scan returns each layer's input, and its backward scan recomputes the layer's
residuals the policy does not save first, as ``jax.checkpoint`` around the scanned body
does; other loops are kept whole.

``+offload`` keeps what the policy saves in host memory between the two passes (moved out as
the forward pass writes it, back where the backward pass reads it, tied to a cotangent; in a
scanned stack, each layer's as its scan writes and reads it), as JAX's offloading policies
do; the plan prices each move on the profile's ``chip.host_bandwidth``."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import core, source_info_util
from jax._src.ad_checkpoint import remat_p
from jax._src.lax.control_flow import optimization_barrier_p

from ._builder import in_host_memory
from ._errors import WorkloadError
from ._report import _NUMBERED, _layer_key
from ._trace import _user_names, closed_parts, step_jaxpr_and_shape
from ._workload import Workload, parse_name_dims, path_str

_DEBUG = core.DebugInfo("autolayout.remat", "the recomputation of forward values", None, None)
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")
NAMES = "save_only_these_names"  # NAMES:a,b keeps the values checkpoint_name tags a or b
MAX_DEPTH = 12
_MATMULS = frozenset({"dot_general", "conv_general_dilated"})
_LOOPS = frozenset({"scan", "while", "cond"})


def _inner_jaxprs(eqn: Any) -> list:
    out = []
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(x, core.ClosedJaxpr):
                out.append(x.jaxpr)
            elif isinstance(x, core.Jaxpr):
                out.append(x)
    return out


def _has_matmul(eqn: Any, batchless: bool) -> bool:
    if eqn.primitive.name in _MATMULS:
        if batchless and eqn.primitive.name == "dot_general":
            (_, _), (lb, _) = eqn.params["dimension_numbers"]
            return not lb
        return True
    return any(_has_matmul(e, batchless) for j in _inner_jaxprs(eqn) for e in j.eqns)


def policy_names(policy: str | None) -> frozenset[str] | None:
    """The names a ``save_only_these_names:a,b`` policy keeps; None for another policy."""
    if policy is None or not policy.startswith(NAMES + ":"):
        return None
    return frozenset(policy[len(NAMES) + 1 :].split(","))


def names_policy(names: Any) -> str:
    """``save_only_these_names:a,b`` for ``names``."""
    return f"{NAMES}:{','.join(sorted(names))}"


def _check_policy(policy: str | None) -> None:
    names = policy_names(policy)
    if policy is None or policy in POLICIES or (names is not None and all(names)):
        return
    raise WorkloadError(
        f"unknown remat policy {policy!r}; known: {', '.join(POLICIES)}, "
        f"{NAMES}:NAME,NAME (values tagged with jax.ad_checkpoint.checkpoint_name), "
        "each with +regather and/or +offload"
    )


def _named(jaxpr: Any, names: frozenset[str]) -> set:
    """The values a ``name`` equation of ``jaxpr`` tags with one of ``names``, and what it
    reads (the name is an identity; the backward pass may read either)."""
    out: set = set()
    for e in jaxpr.eqns:
        if e.primitive.name == "name" and str(e.params["name"]) in names:
            out.update(v for v in (*e.invars, *e.outvars) if isinstance(v, core.Var))
    return out


def _tags(jaxpr: Any) -> set[str]:
    out = set()
    for e in jaxpr.eqns:
        if e.primitive.name == "name" and parse_name_dims(str(e.params["name"])) is None:
            out.add(str(e.params["name"]))
        for j in _inner_jaxprs(e):
            out |= _tags(j)
    return out


def checkpoint_names(g: Any) -> list[str]:
    """The ``checkpoint_name`` tags of a traced step (``al.name_dims``'s left out)."""
    return sorted({
        str(op.param("name")) for op in g.ops
        if op.primitive == "name" and parse_name_dims(str(op.param("name"))) is None
    })  # fmt: skip


def _loss_index(jaxpr: Any) -> int:
    """The equation that writes the loss: the last scalar float output's producer."""
    where = {id(v): i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
    found = [
        where[id(v)]
        for v in jaxpr.outvars
        if isinstance(v, core.Var) and id(v) in where and v.aval.shape == ()
        and "float" in str(v.aval.dtype)
    ]  # fmt: skip
    if not found:
        raise WorkloadError(
            "remat: the step returns no scalar float loss to find its backward pass"
        )
    return max(found)


def _meet(a: Any, b: Any, idom: dict, depth: dict) -> Any:
    """The nearest common dominator of ``a`` and ``b``."""
    while a is not b:
        if depth[a] >= depth[b]:
            a = idom[a]
        else:
            b = idom[b]
    return a


def _spine(jaxpr: Any, end: int, sources: list[Any]) -> set:
    """The forward values that every path from the data to the deepest value of the forward
    pass goes through (its dominators: the residual stream), from the data input that gives
    the longest such chain."""
    eqns = jaxpr.eqns[: end + 1]
    best: set = set()
    for src in sources:
        idom: dict[Any, Any] = {src: src}
        depth = {src: 0}

        for e in eqns:
            preds = [u for u in e.invars if isinstance(u, core.Var) and u in idom]
            if not preds:
                continue
            d = preds[0]
            for u in preds[1:]:
                d = _meet(d, u, idom, depth)
            for v in e.outvars:
                if not isinstance(v, core.DropVar):
                    idom[v], depth[v] = d, depth[d] + 1
        spine = set()
        # the last value (the loss; the logits where labels from the same input join at the
        # loss) at least half as deep in the dominator tree as its deepest value: the
        # deepest alone can sit inside the last layer's attention of a shallow model
        top = max(depth.values())
        order = [v for e in eqns for v in e.outvars if v in depth]
        t = next((v for v in reversed(order) if 2 * depth[v] >= top), src)
        while t in idom and t not in spine:
            spine.add(t)
            if idom[t] is t:
                break
            t = idom[t]
        if len(idom) > 1 and len(spine) > len(best) and src in spine:
            best = spine
    return best


def _layer_ends(jaxpr: Any, end: int, spine: set, paths: list[str]) -> set:
    """The values of ``spine`` where one layer ends and the next begins, as
    ``jax.checkpoint`` around each block keeps them: a spine value is kept where the nearest
    forward equation before it and the nearest after it that belong to a layer (by their
    ``jax.named_scope`` names, else by the path of the weight they read:
    ``params/layers/3/w1`` -> ``layers.3``; a scope without a number, as Equinox's
    ``eqx.nn.Linear``, names no layer) belong to different ones (the mid-block residual
    ``x + attention(x)`` is not kept). ``spine`` itself where no equation names a layer."""
    weight = {v: _layer_key(p.split("/")[1:]) for v, p in zip(jaxpr.invars, paths, strict=True)}
    labels: list[str] = []
    for e in jaxpr.eqns[: end + 1]:
        names = _user_names(e)  # a numbered scope names a layer (eqx.nn.Linear does not)
        lab = _layer_key(names.split("/")) if _NUMBERED.search(names) else ""
        if not lab:
            lab = next((weight[v] for v in e.invars if isinstance(v, core.Var)
                        and weight.get(v)), "")  # fmt: skip
        labels.append(lab)
    if not any(labels):
        return spine
    at = {v: i for i, e in enumerate(jaxpr.eqns[: end + 1]) for v in e.outvars}
    before, last = [], ""
    for lab in labels:
        last = lab or last
        before.append(last)
    after, nxt = [""] * len(labels), ""
    for i in range(len(labels) - 1, -1, -1):
        after[i] = nxt
        nxt = labels[i] or nxt
    first = nxt  # the first layer's label: what comes after an input
    kept = set()
    for v in spine:
        i = at.get(v)
        b, a = (before[i], after[i]) if i is not None else ("", first)
        if not a or not b or a != b:
            kept.add(v)
    return kept


def rewrite(
    closed: core.ClosedJaxpr, policy: str | None, regather: bool = False,
    sources: list[int] | None = None, paths: list[str] | None = None, offload: bool = False,
) -> core.ClosedJaxpr:  # fmt: skip
    """``closed`` with the residuals ``policy`` does not save recomputed in the backward pass
    (None: as written), and with ``regather`` every input the forward pass reads read again in
    the backward pass through an optimization barrier of its own (a sharded weight is
    gathered again there instead of its gathered copy being kept). ``paths``: each input's
    pytree path (``params/layers/3/w1``), which tells layers apart where no
    ``jax.named_scope`` does."""
    _check_policy(policy)
    jaxpr = closed.jaxpr
    eqns = list(jaxpr.eqns)
    end = _loss_index(jaxpr)
    producer = {v: i for i, e in enumerate(eqns[: end + 1]) for v in e.outvars}
    batchless = policy == "dots_with_no_batch_dims_saveable"
    spine: set = set()
    names = policy_names(policy)
    whole = policy == "nothing_saveable" or names is not None  # layers recomputed whole
    if whole:
        cands = [
            jaxpr.invars[i] for i in (sources if sources is not None else range(len(jaxpr.invars)))
        ]
        spine = _spine(jaxpr, end, cands)
        spine = _layer_ends(jaxpr, end, spine, paths or [""] * len(jaxpr.invars))
    named = _named(jaxpr, names) if names else set()

    def saved(v: Any) -> bool:
        if policy is None:
            return True
        i = producer.get(v)
        if i is None:
            return True  # an input or a constant
        e = eqns[i]
        if e.primitive.name in _LOOPS or e.effects:
            return True
        if whole:
            return v in spine or v in named
        return _has_matmul(e, batchless)

    new_eqns = eqns[: end + 1]
    subst: dict[Any, Any] = {}
    last_bwd: Any = None
    forward_reads = {v for e in eqns[: end + 1] for v in e.invars if isinstance(v, core.Var)}
    weights = {v for v in jaxpr.invars if v in forward_reads} if regather else set()
    cots: set = set()  # backward values that carry the loss's gradient (not mere copies of
    # forward values): what a recomputation waits for, so XLA cannot hoist it into the forward
    for e in eqns[end + 1 :]:
        reads = [v for v in e.invars if isinstance(v, core.Var)]
        if not reads or any(v in cots for v in reads):
            cots.update(v for v in e.outvars if not isinstance(v, core.DropVar))
        tie = next((subst.get(v, v) for v in reads if v in cots), None)
        if tie is not None:
            last_bwd = tie
        again = list(dict.fromkeys(v for v in e.invars if isinstance(v, core.Var)
                                   and v in weights and v not in subst))  # fmt: skip
        _regather(again, subst, new_eqns, e.source_info)
        todo = [v for v in e.invars if isinstance(v, core.Var) and v in producer
                and v not in subst and not saved(v)]  # fmt: skip
        if todo and last_bwd is not None:
            deep = 10**9 if whole else MAX_DEPTH
            block, inputs = _chain(todo, eqns, producer, saved, subst, deep)
            # the recomputation reads the weights again too (else it would keep the forward
            # pass's gathered copies alive until the backward pass)
            _regather([v for v in inputs if v in weights and v not in subst], subst, new_eqns,
                      e.source_info)  # fmt: skip
            outs = [v for i in block for v in eqns[i].outvars if not isinstance(v, core.DropVar)]
            eqn, fresh = _region([eqns[i] for i in block], inputs,
                                 [subst.get(v, v) for v in inputs], outs, last_bwd,
                                 e.source_info)  # fmt: skip
            new_eqns.append(eqn)
            subst.update(zip(outs, fresh, strict=True))
        ins = [subst.get(v, v) if isinstance(v, core.Var) else v for v in e.invars]
        new_eqns.append(e.replace(invars=ins))
        for v in e.outvars:
            if v in cots:
                last_bwd = v
    outvars = [subst.get(v, v) if isinstance(v, core.Var) else v for v in jaxpr.outvars]
    if offload:
        new_eqns, outvars = _offload(new_eqns, end, outvars)
    new = core.Jaxpr(jaxpr.constvars, jaxpr.invars, outvars, new_eqns, jaxpr.effects,
                     jaxpr.debug_info)  # fmt: skip
    return core.ClosedJaxpr(new, closed.consts)


def _region(
    body_eqns: list, inputs: list, outer: list, outs: list, cot: Any, source_info: Any
) -> tuple[Any, list]:
    """``body_eqns`` (reading ``inputs``, writing ``outs``) as one ``remat2`` equation over
    ``outer`` and the cotangent ``cot``: differentiated, XLA puts an optimization barrier on
    its inputs, so it runs where the backward pass reaches it. Returns it and its outputs."""
    inner = {v: core.Var(v.aval) for v in inputs}
    icot = core.Var(cot.aval)
    body = []
    for x in body_eqns:
        for v in x.outvars:
            if not isinstance(v, core.DropVar):
                inner[v] = core.Var(v.aval)
        body.append(x.replace(
            invars=[inner.get(v, v) if isinstance(v, core.Var) else v for v in x.invars],
            outvars=[inner.get(v, v) for v in x.outvars]))  # fmt: skip
    sub = core.Jaxpr([], [inner[v] for v in inputs] + [icot], [inner[v] for v in outs], body,
                     frozenset().union(*(x.effects for x in body)), _DEBUG)  # fmt: skip
    fresh = [core.Var(v.aval) for v in outs]
    eqn = core.new_jaxpr_eqn(
        [*outer, cot], fresh, remat_p,
        dict(jaxpr=sub, prevent_cse=True, differentiated=True, policy=None),
        sub.effects, source_info,
    )  # fmt: skip
    return eqn, fresh


def _moves(aval: Any) -> tuple[Any, Any]:
    """``device_put`` equations (as traced by JAX) that move a value of ``aval`` to host
    memory and back: their primitive and parameters, and the host aval."""
    return _moves_of(tuple(aval.shape), aval.dtype)


@functools.lru_cache(maxsize=256)
def _moves_of(shape: tuple, dtype: Any) -> tuple[Any, Any]:
    x = jax.ShapeDtypeStruct(shape, dtype)
    j = jax.make_jaxpr(
        lambda x: jax.device_put(jax.device_put(x, jax.memory.Space.Host), jax.memory.Space.Device)
    )(x).jaxpr  # fmt: skip
    return j.eqns[0], j.eqns[1]


def _offload(eqns: list, end: int, outvars: list) -> tuple[list, list]:
    """Every array the forward pass (``eqns[: end + 1]``) writes and the backward pass reads
    moved to host memory right after it is written and back where the backward pass first
    reads it, tied to a cotangent so XLA does not hoist the copy back into the forward pass
    (as ``jax.checkpoint_policies.offload_dot_with_no_batch_dims`` leaves them). Loop
    results stay (a scanned stack is offloaded inside its scan, :func:`remat_scans`)."""
    made = {v for e in eqns[: end + 1] if e.primitive.name not in _LOOPS and not e.effects
            for v in e.outvars if not isinstance(v, core.DropVar)}  # fmt: skip
    wanted = {v: None for e in eqns[end + 1 :] for v in e.invars
              if isinstance(v, core.Var) and v in made and len(v.aval.shape) >= 2
              and not in_host_memory(v.aval)}  # fmt: skip
    if not wanted:
        return eqns, outvars
    out, host = [], {}
    for e in eqns[: end + 1]:
        out.append(e)
        for v in e.outvars:
            if v in wanted:
                to_host, _ = _moves(v.aval)
                h = core.Var(to_host.outvars[0].aval)
                out.append(to_host.replace(invars=[v], outvars=[h], source_info=e.source_info))
                host[v] = h
    subst: dict = {}
    cots: set = set()
    last = None
    for e in eqns[end + 1 :]:
        reads = [v for v in e.invars if isinstance(v, core.Var)]
        back = list(dict.fromkeys(v for v in reads if v in host and v not in subst))
        if back:
            moves = []
            for v in back:
                _, to_dev = _moves(v.aval)
                moves.append(to_dev.replace(invars=[host[v]], outvars=[v],
                                            source_info=e.source_info))  # fmt: skip
            if last is None:  # no cotangent yet: copied back right here
                for v, m in zip(back, moves, strict=True):
                    subst[v] = core.Var(v.aval)
                    out.append(m.replace(outvars=[subst[v]]))
            else:
                eqn, fresh = _region(moves, [host[v] for v in back],
                                     [host[v] for v in back], back, last, e.source_info)  # fmt: skip
                out.append(eqn)
                subst.update(zip(back, fresh, strict=True))
        if not reads or any(v in cots for v in reads):
            cots.update(v for v in e.outvars if not isinstance(v, core.DropVar))
        out.append(e.replace(invars=[subst.get(v, v) if isinstance(v, core.Var) else v
                                     for v in e.invars]))  # fmt: skip
        for v in e.outvars:
            if v in cots:
                last = v
    return out, [subst.get(v, v) if isinstance(v, core.Var) else v for v in outvars]


def _bind(e: Any, vals: list) -> list:
    """Equation ``e`` applied to ``vals`` under its source info (its scopes name the report's
    layers), as ``core.eval_jaxpr`` applies it."""
    params = e.primitive.get_bind_params(e.params)
    stack = source_info_util.current_name_stack() + e.source_info.name_stack
    with source_info_util.user_context(e.source_info.traceback, name_stack=stack), e.ctx.manager:
        r = e.primitive.bind(*vals, **params)
    return list(r) if e.primitive.multiple_results else [r]


def _scan_pairs(jaxpr: Any, end: int) -> dict[int, tuple[int, dict[int, list[int]]]]:
    """Backward scan -> (its forward scan, {forward output j: the backward's xs positions
    that read it}): a reverse scan after the loss that reads per-layer outputs of a forward
    scan of its length (the transpose of a scanned stack reads its residuals so)."""
    made = {}
    for i, e in enumerate(jaxpr.eqns[: end + 1]):
        if e.primitive.name == "scan" and not e.params["reverse"]:
            nk = e.params["num_carry"]
            made.update({v: (i, j) for j, v in enumerate(e.outvars[nk:])})
    out = {}
    for gi, e in enumerate(jaxpr.eqns[end + 1 :], end + 1):
        if e.primitive.name != "scan" or not e.params["reverse"]:
            continue
        first = e.params["num_consts"] + e.params["num_carry"]
        uses: dict[int, dict[int, list[int]]] = {}
        for pos, v in enumerate(e.invars[first:]):
            if isinstance(v, core.Var) and v in made:
                fi, j = made[v]
                uses.setdefault(fi, {}).setdefault(j, []).append(pos)
        for fi, ys in uses.items():
            if jaxpr.eqns[fi].params["length"] == e.params["length"] and gi not in out:
                out[gi] = (fi, ys)
    return out


def _eval_needed(body: Any, consts: list, ins: list, given: dict, wanted: list) -> list:
    """The values of ``wanted`` (``body``'s variables), evaluating only the equations they
    need beyond what ``given`` (variable -> value: the saved residuals) holds."""
    env = dict(zip(body.constvars, consts, strict=True))
    env.update(zip(body.invars, ins, strict=True))
    env.update(given)
    read = _inputs_needed(body, set(env), wanted)
    need = [
        k for k, e in enumerate(body.eqns) if any(v in read and v not in env for v in e.outvars)
    ]
    for k in need:
        e = body.eqns[k]
        vals = [u.val if isinstance(u, core.Literal) else env[u] for u in e.invars]
        env.update(zip(e.outvars, _bind(e, vals), strict=True))
    return [v.val if isinstance(v, core.Literal) else env[v] for v in wanted]


def _inputs_needed(body: Any, given: set, wanted: list) -> set:
    """The variables of ``body`` (its inputs among them) that computing ``wanted`` reads,
    not looking past ``given``."""
    producer = {v: e for e in body.eqns for v in e.outvars}
    seen: set = set()
    stack = [v for v in wanted if isinstance(v, core.Var)]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in given or v not in producer:
            continue
        stack += [u for u in producer[v].invars if isinstance(u, core.Var)]
    return seen


def remat_scans(
    closed: core.ClosedJaxpr, policy: str | None, offload: bool = False
) -> core.ClosedJaxpr:
    """``closed`` with a scanned stack's residuals that ``policy`` does not save recomputed in
    its backward scan: the forward scan returns each layer's carry instead, and the backward
    scan's body first runs what of the forward body it needs, from that carry, the layer's
    weights and the saved residuals (what ``jax.checkpoint`` around the scanned body does). A
    residual read elsewhere is kept. ``offload``: the residuals it saves are stacked in host
    memory (each layer's moved there as the forward scan writes it, and back as the backward
    scan reads it)."""
    jaxpr = closed.jaxpr
    end = _loss_index(jaxpr)
    readers: dict[Any, set[int]] = {}
    for k, e in enumerate(jaxpr.eqns):
        for v in e.invars:
            if isinstance(v, core.Var):
                readers.setdefault(v, set()).add(k)
    for v in jaxpr.outvars:
        if isinstance(v, core.Var):
            readers.setdefault(v, set()).add(-1)
    batchless = policy == "dots_with_no_batch_dims_saveable"
    names = policy_names(policy)
    dropped: dict[int, set[int]] = {}  # forward scan -> its outputs recomputed
    hosted: dict[int, set[int]] = {}  # forward scan -> its outputs stacked in host memory
    pairs = {}
    for gi, (fi, ys) in _scan_pairs(jaxpr, end).items():
        F = jaxpr.eqns[fi]
        nk = F.params["num_carry"]
        body = closed_parts(F.params["jaxpr"])[0]
        made = {v: e for e in body.eqns for v in e.outvars}
        named = _named(body, names) if names else set()
        again = set()
        for j in ys:
            bv = body.outvars[nk + j]
            src = made.get(bv)
            while src is not None and src.primitive.name == "name":  # an identity: its input's
                v = src.invars[0]
                src = made.get(v) if isinstance(v, core.Var) else None
            if policy is None:
                keep = True
            elif names is not None:
                keep = bv in named
            else:
                keep = (
                    policy != "nothing_saveable" and src is not None and _has_matmul(src, batchless)
                )
            if bv in made and not keep and readers.get(F.outvars[nk + j], set()) <= {gi}:
                again.add(j)
        if (again or offload) and fi not in dropped:
            dropped[fi] = again
            pairs[gi] = (fi, {pos: j for j, ps in ys.items() for pos in ps})
            # the saved residuals only this backward scan reads: stacked in host memory
            # (those worth moving, :func:`_to`)
            hosted[fi] = {j for j in ys if offload and j not in again
                          and readers.get(F.outvars[nk + j], set()) <= {gi}}  # fmt: skip
    if not pairs:
        return closed
    stash: dict[int, tuple] = {}

    def forward(fi: int, e: Any, vals: list) -> list:
        p = e.params
        nc, nk = p["num_consts"], p["num_carry"]
        body, bconsts = closed_parts(p["jaxpr"])
        consts, init, xs = vals[:nc], vals[nc : nc + nk], vals[nc + nk :]
        kept = [j for j in range(len(e.outvars) - nk) if j not in dropped[fi]]

        def step(carry, x):
            out = core.eval_jaxpr(body, bconsts, *consts, *carry, *x)
            ys = [_to(out[nk + j], jax.memory.Space.Host) if j in hosted[fi] else out[nk + j]
                  for j in kept]  # fmt: skip
            # each layer's input, for its recomputation (in host memory too, offloaded)
            ins = [_to(c, jax.memory.Space.Host) if offload else c for c in carry]
            return out[:nk], (ins if dropped[fi] else [], ys)

        carry, (cins, ys) = jax.lax.scan(step, list(init), list(xs), length=p["length"],
                                         unroll=p["unroll"])  # fmt: skip
        stash[fi] = (consts, cins, xs)
        full: list = [None] * (len(e.outvars) - nk)
        for j, y in zip(kept, ys, strict=True):
            full[j] = y
        return [*carry, *full]

    def backward(gi: int, e: Any, vals: list) -> list:
        fi, pos_j = pairs[gi]
        F = jaxpr.eqns[fi]
        fbody, fconsts_ = closed_parts(F.params["jaxpr"])
        fnc, fnk = F.params["num_consts"], F.params["num_carry"]
        p = e.params
        nc, nk = p["num_consts"], p["num_carry"]
        body, bconsts = closed_parts(p["jaxpr"])
        consts, init, xs = vals[:nc], vals[nc : nc + nk], vals[nc + nk :]
        fconsts, cins, fxs = stash[fi]
        again = [pos for pos in range(len(xs)) if pos_j.get(pos) in dropped[fi]]
        given = [pos for pos in range(len(xs)) if pos not in again]
        saved_vars = {fbody.outvars[fnk + pos_j[q]]: q for q in given if q in pos_j}
        wanted = [fbody.outvars[fnk + pos_j[q]] for q in again]
        # the forward body's inputs the recomputation reads: only those are carried in
        used = _inputs_needed(fbody, set(saved_vars), wanted)
        ci = [k for k in range(fnk) if fbody.invars[fnc + k] in used]
        xi = [k for k in range(len(fxs)) if fbody.invars[fnc + fnk + k] in used]

        home = {q for q in given if pos_j.get(q) in hosted[fi]}  # stacked in host memory

        def step(carry, x):
            xk, cin, fx = x
            at = {q: _to(v, jax.memory.Space.Device) if q in home else v
                  for q, v in zip(given, xk, strict=True)}  # fmt: skip
            ins = [*fconsts, *([None] * fnk), *([None] * len(fxs))]
            for k, c in zip(ci, cin, strict=True):
                ins[fnc + k] = _to(c, jax.memory.Space.Device) if offload else c
            for k, c in zip(xi, fx, strict=True):
                ins[fnc + fnk + k] = c
            keys = [v for v in saved_vars if isinstance(v, core.Var)]

            def recompute(ins, vals):  # a remat region: the plan counts it as recomputation
                return _eval_needed(
                    fbody, fconsts_, ins, dict(zip(keys, vals, strict=True)), wanted
                )

            if again:
                redo = jax.checkpoint(recompute, prevent_cse=True)(
                    ins, [at[saved_vars[v]] for v in keys]
                )
                at.update(zip(again, redo, strict=True))
            out = core.eval_jaxpr(body, bconsts, *consts, *carry, *[at[k] for k in range(len(xs))])
            return out[:nk], out[nk:]

        stacks = ([xs[k] for k in given], [cins[k] for k in ci], [fxs[k] for k in xi])
        carry, ys = jax.lax.scan(step, list(init), stacks, length=p["length"], reverse=True,
                                 unroll=p["unroll"])  # fmt: skip
        return [*carry, *ys]

    def step(*args):
        env = dict(zip(jaxpr.constvars, closed.consts, strict=True))
        env.update(zip(jaxpr.invars, args, strict=True))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, core.Literal) else env[v]

        for k, e in enumerate(jaxpr.eqns):
            vals = [read(v) for v in e.invars]
            if k in dropped:
                outs = forward(k, e, vals)
            elif k in pairs:
                outs = backward(k, e, vals)
            else:
                outs = _bind(e, vals)
            for v, x in zip(e.outvars, outs, strict=True):
                if not isinstance(v, core.DropVar):
                    env[v] = x
        return [read(v) for v in jaxpr.outvars]

    return jax.make_jaxpr(step)(*closed.in_avals)


def _to(x: Any, space: Any) -> Any:
    """``x`` moved to memory ``space`` when it is an array worth moving (two axes or more)."""
    return jax.device_put(x, space) if jnp.ndim(x) >= 2 else x


def _regather(weights: list, subst: dict, out: list, source_info: Any) -> None:
    """Each weight read again behind an optimization barrier of its own, which XLA does not
    merge across: the partitioner gathers its output afresh (the barrier keeps the stored
    layout)."""
    for v in weights:
        fresh = core.Var(v.aval)
        out.append(core.new_jaxpr_eqn([v], [fresh], optimization_barrier_p, {}, frozenset(),
                                      source_info))  # fmt: skip
        subst[v] = fresh


def _chain(todo, eqns, producer, saved, subst, max_depth) -> tuple[list[int], list]:
    """The forward equations that recompute ``todo`` from saved values (at most
    ``MAX_DEPTH`` deep), in program order, and the values they read."""
    block: set[int] = set()
    inputs: dict[Any, None] = {}
    stack = [(v, 0) for v in todo]
    seen = set()
    while stack:
        v, depth = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        i = producer.get(v)
        if v in subst or i is None or saved(v) or depth >= max_depth:
            inputs[v] = None
            continue
        block.add(i)
        stack += [(u, depth + 1) for u in eqns[i].invars if isinstance(u, core.Var)]
    made = {v for i in block for v in eqns[i].outvars}
    return sorted(block), [v for v in inputs if v not in made]


def remat(
    workload: Workload, policy: str | None, regather: bool = False, offload: bool = False
) -> Workload:
    """``workload`` with ``policy`` applied to its step (see the module's docstring): the same
    arguments, state, data and losses; less memory, more FLOPs. ``regather``: each weight
    read again in the backward pass (gathered afresh); ``offload``: what the policy saves
    kept in host memory between the passes. ``policy`` may be a plan's tag
    (``"dots_saveable+offload"``).

    Example:
      >>> import autolayout as al
      >>> wl = al.load_workload("experiments/models/gpt.py")
      >>> al.remat(wl, "dots_saveable").name
      'gpt-tiny+remat(dots_saveable)'
    """
    if policy is not None and ("+" in policy or policy == "as_written"):  # a plan's tag
        policy, again, off = parse_remat(policy)
        regather, offload = regather or again, offload or off
    _check_policy(policy)
    closed, out_shape = step_jaxpr_and_shape(workload)  # cuDNN attention traces anywhere
    names = policy_names(policy)
    if names:
        tags = _tags(closed.jaxpr)
        if names - tags:
            raise WorkloadError(
                f"remat policy {policy!r}: the step tags no value {sorted(names - tags)[0]!r} "
                f"(its checkpoint_name tags: {', '.join(sorted(tags)) or 'none'})"
            )
    sizes = [len(jax.tree.leaves(a)) for a in workload.args]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    data = [k for i, n in enumerate(sizes) if i not in workload.donate_argnums
            for k in range(starts[i], starts[i] + n)]  # fmt: skip
    if policy is not None or offload:  # a scanned stack's residuals, recomputed in (or
        closed = remat_scans(closed, policy, offload)  # offloaded for) its backward scan
    paths = [path_str(p, workload.argnames)
             for p, _ in jax.tree_util.tree_flatten_with_path(workload.args)[0]]  # fmt: skip
    new = rewrite(closed, policy, regather, data or None, paths, offload)
    out_tree = jax.tree.structure(out_shape)

    @functools.wraps(workload.fn)  # its argument names (params, opt_state, batch)
    def step(*args):
        flat = jax.tree.leaves(args)
        return jax.tree.unflatten(out_tree, core.eval_jaxpr(new.jaxpr, new.consts, *flat))

    tag = describe(policy, regather, offload)
    step.remat_policy = tag  # al.apply and autolayout run: already rewritten
    step.closed_jaxpr = new  # al.trace walks it instead of tracing the step's Python again
    options = dict(workload.options, remat_policy=tag)
    return dataclasses.replace(workload, fn=step, name=f"{workload.name}+remat({tag})",
                               options=options)  # fmt: skip


def describe(policy: str | None, regather: bool, offload: bool = False) -> str:
    """``dots_saveable``, ``dots_saveable+regather``, ``nothing_saveable+offload``,
    ``regather``, ``as_written``."""
    parts = [policy, "regather" if regather else None, "offload" if offload else None]
    return "+".join(p for p in parts if p) or "as_written"


def parse_remat(tag: str) -> tuple[str | None, bool, bool]:
    """The inverse of :func:`describe`: (policy, regather, offload)."""
    parts = tag.split("+")
    rest = [p for p in parts if p not in ("regather", "offload", "as_written")]
    if len(rest) > 1:
        raise WorkloadError(
            f"remat policy {tag!r} names two policies; give one, +regather, +offload"
        )
    policy = rest[0] if rest else None
    _check_policy(policy)
    return policy, "regather" in parts, "offload" in parts


def remat_for_plan(plan: Any, workload: Workload) -> Workload:
    """``workload`` rewritten with the remat policy ``plan`` was made with (its options'
    ``remat_policy``), unless it already is."""
    tag = (getattr(plan, "options", None) or {}).get("remat_policy")
    if not tag or getattr(workload.fn, "remat_policy", None) == tag:
        return workload
    return remat(workload, *parse_remat(tag))
