"""Reports: a plan as pandas tables, matplotlib figures, a terminal summary and one HTML page.

Everything here reads a :class:`~autolayout.Plan` only (its op rows, collectives, prediction
and solver record), so a plan loaded from ``plan.json`` reports like a fresh one.
"""

from __future__ import annotations

import base64
import functools
import html
import io
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._dim_rules import ATTENTION_BWD, ATTENTION_FWD
from ._errors import PlanError
from ._ir import LOOP_OPS, Tensor, loop_links, per_graph, shown_names
from ._layout import local_bytes, mesh_text
from ._roles import module_kind, path_name

if TYPE_CHECKING:
    from ._ir import Graph
    from ._plan import Plan

OPTIMIZER = "optimizer"
OTHER = "(other)"  # ops before any parameter is read: no layer
_NUMBERED = re.compile(r"\d")
_INDEXED = re.compile(r"(?:^|[._])\d+$")  # a layer's index: ``3``, ``layers.3``, ``Dense_0``


# --- layers -----------------------------------------------------------------------------------


def _layer_key(parts: list[str]) -> str:
    """``["layers", "3", "wq"]`` -> ``layers.3``; ``["layers.3", "mlp"]`` -> ``layers.3``;
    no indexed part: the first part (``["layers", "w1"]`` -> ``layers``). Einsum specs
    (``bsd,df->bsf``) are not layer names."""
    parts = [p for p in parts if p and "->" not in p]
    for i, p in enumerate(parts):
        if _INDEXED.search(p):  # (a weight's name is no index: ``layers/w1`` is ``layers``)
            if p.isdigit() and i > 0:
                return "/".join(parts[: i - 1] + [f"{parts[i - 1]}.{p}"])
            return "/".join(parts[: i + 1])
    return parts[0] if parts else ""


@per_graph
def op_layers(g: Graph) -> dict[str, str]:
    """The layer of every op, for grouping a report.

    An op's ``jax.named_scope`` names give it (``layers.3/mlp`` -> ``layers.3``; JAX keeps
    them through ``grad``, so the backward pass of a layer is that layer). A scope with no
    number in it (``encoder``; Equinox's ``eqx.nn.Linear``) gives way to the parameter the
    op reads (``params/blocks/3/...`` -> ``blocks.3``) or its inputs' layer. Without one:

    - ``optimizer``: an op reading optimizer state (an input under ``opt_state``) or a value
      the optimizer made, and an op all of whose readers are the optimizer's (the squared
      gradient of Adam);
    - except the ops where gradients enter the optimizer (the embedding's scatter-add): they
      are the layer of the parameter of their shape, where one parameter has it;
    - a parameter's layer for an op reading a parameter (``params/layers/3/wq`` ->
      ``layers.3``);
    - else the layer of the input computed last; ``(other)`` before any parameter is read.
    """
    producer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    label: list[str] = []

    def latest(op) -> str:  # the layer of the labelled input computed last
        made = [t for t in op.inputs if t in producer and label[producer[t]]]
        return label[producer[max(made, key=producer.__getitem__)]] if made else ""

    def reads_optimizer(op) -> bool:
        return any(t in producer and label[producer[t]] == OPTIMIZER for t in op.inputs)

    by_stack: dict[str, str] = {}  # name stack -> its layer (many ops share a stack)
    scoped: list[bool] = []  # whether a scope gave the op its layer
    reads_param: list[bool] = []  # whether the op reads a weight (or a view of one)
    params = [t for t in g.inputs if (g.tensors[t].path or "").startswith("params/")]
    weights = set(params)  # the parameters and their views, as the loop meets them
    outer: dict[str, str] = {}  # a loop body's input -> the tensor it is of, outside
    of_loop: dict[str, str] = {}  # a loop -> the layer of the first weight it reads
    for op in g.ops:
        for o, b in op.param("body_inputs", ()) if op.primitive in LOOP_OPS else ():
            outer[b] = outer.get(o, o)
            if outer[b] in weights:  # a loop's weights: read as the stack's
                weights.add(b)
                w = g.tensors[outer[b]]
                if w.shape[1:] == g.tensors[b].shape and w.shape[:1] == (op.param("length"),):
                    # a layer of a stack the loop scans (not a weight every trip shares)
                    of_loop.setdefault(op.name, _layer_key((w.path or "").split("/")[1:]))
    for i, op in enumerate(g.ops):
        lab = by_stack.get(op.name_stack)
        if lab is None:
            lab = by_stack[op.name_stack] = _layer_key(op.name_stack.split("/"))
        scope = ""
        if lab and not _NUMBERED.search(lab):  # a module's scope (eqx.nn.Linear), no layer
            scope, lab = lab, ""
        loops = [of_loop[x] for x in op.scope if x in of_loop]
        if not lab and loops:  # in a loop over a stack of weights (a scan over layers, its
            lab = loops[-1]  # backward): the stack's, its gradients' ops included
        scoped.append(bool(lab))
        reads_param.append(any(t in weights for t in op.inputs))
        if reads_param[-1] and op.primitive in _VIEWS:  # a weight's cast, transpose, reversal
            weights.update(op.outputs)
        if not lab:
            ins = [outer.get(t, t) for t in op.inputs]
            paths = [g.tensors[t].path or "" for t in ins if g.tensors[t].role == "input"]
            roots = [p.split("/", 1)[0] for p in paths]
            if any("opt" in r for r in roots) or reads_optimizer(op):
                lab = OPTIMIZER
            elif "params" in roots:
                lab = _layer_key(paths[roots.index("params")].split("/")[1:])
            else:
                lab = latest(op) or scope
        label.append(lab)
        for t in op.inputs:
            readers.setdefault(t, []).append(i)
        for t in op.outputs:
            producer[t] = i
    # where gradients enter: a parameter's layer, by shape
    by_shape: dict[tuple, list[str]] = {}
    for t in params:
        layer = _layer_key(g.tensors[t].path.split("/")[1:])
        by_shape.setdefault(g.tensors[t].shape, []).append(layer)
    is_param = set(params)

    # backwards: an op that only feeds the optimizer, on values of parameters' shapes (Adam's
    # squared gradient), is the optimizer's; one that makes a gradient from activations (a
    # weight's gradient matmul, the embedding's scatter-add) is the layer of the parameter of
    # its shape, where one parameter has it (the one the optimizer updates from it, where
    # several have it), and so is an op all of whose readers are that layer's gradient's
    # (the matmul before a transposed gradient), unless it reads a weight; else its inputs'
    def updated(op, depth: int = 24) -> str | None:
        """The layer of the parameter the optimizer updates from ``op``'s result: the first
        optimizer op downstream (breadth first) that reads a parameter of its shape."""
        shape = g.tensors[op.outputs[0]].shape
        seen, front = set(), [op]
        for _ in range(depth):
            nxt = []
            for o in front:
                for t in o.outputs:
                    for r in readers.get(t, []):
                        if r in seen or label[r] != OPTIMIZER:
                            continue
                        seen.add(r)
                        for x in g.ops[r].inputs:
                            if x in is_param and g.tensors[x].shape == shape:
                                return _layer_key(g.tensors[x].path.split("/")[1:])
                        nxt.append(g.ops[r])
            if not nxt:
                return None
            front = nxt
        return None

    # a sum a loop carries out of it is read where the loop's output is (a gradient summed
    # over a shared-weight stack's layers in its backward scan: by the optimizer, after the
    # loop), unless a scope gave what it sums its layer
    handed = {b: o for o, b in loop_links(g)[1].items()
              if g.tensors[o].shape == g.tensors[b].shape}  # fmt: skip
    entered: dict[int, str] = {}
    for i in range(len(g.ops) - 1, -1, -1):
        op = g.ops[i]
        if scoped[i] or label[i] == OPTIMIZER:
            continue
        direct = [r for t in op.outputs for r in readers.get(t, [])]
        rs = direct
        if not any(scoped[producer[t]] for t in op.inputs if t in producer):
            rs = direct + [r for t in op.outputs for r in readers.get(handed.get(t), [])]
        if not rs:
            continue
        if all(label[r] == OPTIMIZER for r in rs):
            real = [g.tensors[t].shape for t in op.inputs if g.tensors[t].size > 1]
            outs = {g.tensors[t].shape for t in op.outputs}
            if direct and all(x in by_shape for x in real) and outs <= set(real):  # not a
                # transpose, nor a gradient's sum over a loop's iterations
                label[i] = OPTIMIZER
                continue
            layers = {x for t in op.outputs for x in by_shape.get(g.tensors[t].shape, [])}
            if len(layers) > 1:  # parameters alike (every layer's w2): the one it updates
                layers = {updated(op)} - {None} or layers
        elif not reads_param[i]:  # computing only what one layer's gradient is made from
            layers = {entered.get(r) for r in rs}
        else:  # a weight's own read (its backward matmul) stays its layer
            continue
        if len(layers) == 1 and None not in layers:
            label[i] = entered[i] = layers.pop()
    return {op.name: label[i] or OTHER for i, op in enumerate(g.ops)}


_CONTRACTIONS = ("dot_general", "conv_general_dilated", "ragged_dot")
# ops that pass a weight or a gradient on whole: its cast, view, layer slice, or a sum into it
_VIEWS = ("convert_element_type", "reshape", "transpose", "broadcast_in_dim", "squeeze",
          "expand_dims", "copy", "copy_p", "dynamic_slice", "slice", "optimization_barrier",
          "rev")  # fmt: skip
_PASS_GRAD = _VIEWS + (
    "add",
    "add_any",
    "mul",
    "div",
    "sub",
    "neg",
    "select_n",
    "integer_pow",
    "sqrt",
    "rsqrt",
    "max",
    "min",
    "abs",
)  # Adam: m + (1-b) g**1


@per_graph
def op_labels(g: Graph) -> dict[str, str]:
    """What the model's author calls an op, for reports (op ids are a primitive's counter):
    a matmul or conv is the weight it reads (``wq``; ``wq bwd`` for a later read of it: the
    backward pass, or a recomputation) or the weight whose gradient it makes (``wq grad``,
    followed from the optimizer's update through casts, sums and loops); attention is
    ``attention`` / ``attention bwd``; any other op its primitive. Weights are named by their
    paths (``params/layers/wq`` -> ``wq``, as dims are)."""
    producer = {o: op for op in g.ops for o in op.outputs}
    inner, body_out = loop_links(g)
    memo: dict[str, str | None] = {}

    def weight(t: str, depth: int = 0) -> str | None:
        """The weight input ``t`` is (through casts, views and loops), else None."""
        if t in memo:
            return memo[t]
        memo[t] = None  # a cycle (a loop's carry) names nothing
        tt = g.tensors[t]
        out = None
        if tt.role == "input" and tt.path and "param" in tt.path.split("/", 1)[0]:
            out = t
        elif t in inner:
            out = weight(inner[t], depth + 1)
        elif depth < 8 and t in producer and producer[t].primitive in _VIEWS:
            ins = [x for x in producer[t].inputs if g.tensors[x].size > 1]
            out = weight(ins[0], depth + 1) if len(ins) == 1 else None
        memo[t] = out
        return out

    kinds: dict[str, str] = {}  # weight -> the module kind of the first op reading it in
    for op in g.ops:  # a module's scope (Equinox's eqx.nn.Linear): a container's weight
        kind = module_kind(op.name_stack)  # (layers/4/weight) is named by it, not ``layers``
        if kind:
            for x in op.inputs:
                if (w := weight(x)) and w not in kinds:
                    kinds[w] = kind
    by_path = {(g.tensors[t].path or "").split("/", 1)[-1]: t for t in g.inputs
               if g.tensors[t].role == "input" and weight(t) == t}  # fmt: skip

    def name(w: str) -> str:
        return path_name(g.tensors[w].path, kinds.get(w))

    def state_name(x: str) -> str | None:  # an optimizer state by its weight's name
        tt = g.tensors[x]
        if not (tt.role == "input" and tt.path and "opt" in tt.path.split("/", 1)[0]):
            return None
        parts = tt.path.split("/")
        w = next((by_path[k] for i in range(1, len(parts))
                  if (k := "/".join(parts[i:])) in by_path), None)  # fmt: skip
        return name(w) if w is not None else _state_name(g, x)

    labels: dict[str, str] = {}
    # gradients: the tensor the optimizer's update reads beside a weight (or its moments)
    for op in g.ops:
        names = {}  # shape -> the weight named by an input of it
        for x in op.inputs:
            n = state_name(x) or ((w := weight(x)) and name(w))
            if n:
                names[g.tensors[x].shape] = n
        for x in op.inputs:
            shape = g.tensors[x].shape
            if g.tensors[x].role != "input" and shape in names and len(shape) > 1:
                _label_gradient(g, x, names[shape], producer, body_out, labels)
    seen: set = set()
    layer = op_layers(g)
    for op in g.ops:
        if op.name in labels:
            continue
        kind = op.primitive
        if kind in _CONTRACTIONS:
            ws = [w for w in (weight(x) for x in op.inputs) if w]
            if ws:  # the first read of a weight is the forward's; later ones the backward's
                labels[op.name] = name(ws[0]) + (" bwd" if ws[0] in seen else "")
                seen.add(ws[0])
                continue
            what = _between_activations(g, op) if kind == "dot_general" else None
            if what:  # attention's matmuls: the first in a layer the forward's
                key = (what, layer.get(op.name))
                labels[op.name] = what + (" bwd" if key in seen else "")
                seen.add(key)
                continue
        if kind in ATTENTION_FWD:
            labels[op.name] = "attention"
        elif kind in ATTENTION_BWD:
            labels[op.name] = "attention bwd"
        else:
            labels[op.name] = kind
    return labels


def shown_ops(plan: Plan) -> dict[str, str]:
    """Each op as reports show it: :func:`op_labels` where the plan has its graph (a plan
    read from a file has none: its op ids)."""
    return op_labels(plan.graph) if plan.graph is not None else {}


def _between_activations(g: Graph, op) -> str | None:
    """A matmul of two activations, by its dims: ``scores`` where its result holds two dims
    of one kind (queries against keys: ``seq`` and ``seq#2``, ``dec_seq`` and ``enc_seq``),
    ``attention`` where it sums over one of them (the scores times the values)."""

    def kind(d: str) -> str:  # seq#2 -> seq; enc_seq -> seq (cross-attention's keys)
        return d.split("#")[0].rsplit("_", 1)[-1]

    out = [d for d in g.tensors[op.outputs[0]].dims if d]
    kinds = [kind(d) for d in out]
    if len(kinds) != len(set(kinds)):
        return "scores"
    summed = {d for x in op.inputs for d in g.tensors[x].dims if d} - set(out)
    if {kind(d) for d in summed} & set(kinds):
        return "attention"
    return None


def _state_name(g: Graph, t: str) -> str | None:
    """The weight an optimizer state input belongs to (``opt_state/0/mu/layers/wq`` -> wq)."""
    tt = g.tensors[t]
    if tt.role == "input" and tt.path and "opt" in tt.path.split("/", 1)[0]:
        return path_name(tt.path)
    return None


def _label_gradient(g, t, name, producer, body_out, labels, depth: int = 0) -> None:
    """Labels the contraction that makes ``t`` (the gradient of ``name``), following sums,
    casts and loop outputs back from the update."""
    while depth < 12:
        depth += 1
        if t in body_out:
            t = body_out[t]
            continue
        op = producer.get(t)
        if op is None or op.name in labels:
            return
        if op.primitive in _CONTRACTIONS:
            labels[op.name] = f"{name} grad"
            return
        if op.primitive not in _PASS_GRAD:
            return
        if op.primitive in _VIEWS:  # a cast or view: its one operand, whatever its shape
            same = [x for x in op.inputs if g.tensors[x].size > 1][:1]
        else:  # arithmetic: the operands of its shape (a sum: each)
            same = [x for x in op.inputs if g.tensors[x].shape == g.tensors[t].shape
                    and g.tensors[x].role != "input"]  # fmt: skip
        if not same:
            return
        for x in same[1:]:  # a sum of gradients (a weight read twice): each part
            _label_gradient(g, x, name, producer, body_out, labels, depth)
        t = same[0]


# --- tables -----------------------------------------------------------------------------------

COLUMNS = [
    "op", "kind", "layer", "scope", "dims", "strategy", "trips", "flops", "bytes",
    "compute_s", "comm_s", "time_s", "collective", "memory",
]  # fmt: skip


def report_frame(plan: Plan, by: str | None = None):
    """``plan.report(by)``: see :meth:`Plan.report`."""
    import pandas as pd  # heavy (pandas): only where a table is asked for

    df = pd.DataFrame(plan.ops)
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = "" if c in ("layer", "scope", "collective", "dims", "strategy") else 0
    df["time_s"] = (df.compute_s + df.comm_s) * df.trips
    df = df[COLUMNS]
    if by is None:
        return df
    if by not in df.columns:
        raise KeyError(f"report(by={by!r}): no such column; one of {', '.join(COLUMNS)}")
    step = df.assign(
        flops=df.flops * df.trips,
        bytes=df.bytes * df.trips,
        compute_s=df.compute_s * df.trips,
        comm_s=df.comm_s * df.trips,
    )
    g = step.groupby(by, sort=False).agg(
        ops=("op", "size"),
        flops=("flops", "sum"),
        bytes=("bytes", "sum"),
        compute_s=("compute_s", "sum"),
        comm_s=("comm_s", "sum"),
        time_s=("time_s", "sum"),
    )
    total = g.time_s.sum()
    g["share"] = g.time_s / total if total > 0 else 0.0
    return g.sort_values("time_s", ascending=False)


def collectives_by_kind(plan: Plan):
    """Per collective kind over a step: count, bytes and time (all executions)."""
    import pandas as pd  # heavy (pandas): only where a table is asked for

    df = plan.collectives()
    if df.empty:
        return pd.DataFrame(columns=["count", "bytes", "time_s"])
    df = df.assign(bytes=df.bytes * df["count"], time_s=df.time_s * df["count"])
    return (
        df.groupby("kind")
        .agg(count=("count", "sum"), bytes=("bytes", "sum"), time_s=("time_s", "sum"))
        .sort_values("time_s", ascending=False)
    )


def top_ops(plan: Plan, n: int = 10):
    df = report_frame(plan)
    cols = ["op", "kind", "layer", "strategy", "trips", "compute_s", "comm_s", "time_s"]
    return df.sort_values("time_s", ascending=False).head(n)[cols + ["collective"]]


_INDEX = re.compile(r"(?<=/)\d+(?=/)")


def rule_lines(plan: Plan) -> list[str]:
    """The rules as an engineer reads them: one line per dim, where a dim repeats per layer
    copy (``params/blocks/3/w_in.1``) one line for all copies (``params/blocks/*/w_in.1``,
    with their count), in the rules' order; a dim's further rule says when it applies."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for d, axes in plan.rules():
        groups.setdefault((_INDEX.sub("*", d), tuple(axes)), []).append(d)
    out = []
    earlier: dict[str, list[str]] = {}  # a dim's rules so far
    for (pattern, axes), dims in groups.items():
        name = pattern if len(dims) > 1 else dims[0]
        more = f"  ({len(dims)} copies)" if len(dims) > 1 else ""
        before = earlier.setdefault(pattern, [])
        if before:
            more += f"  (where {' or '.join(before)} is taken)"
        before.append("x".join(axes) or "()")
        out.append(f"{name} -> {'x'.join(axes) or '()'}{more}")
    return out


def inner_splits(plan: Plan, top: int = 4) -> list[str]:
    """Splits the ops make inside the step that the rules do not show (the rules lay out the
    inputs): ``batch -> model`` where activations split the batch on an axis no input rule
    gives it, with the ops' share of the step time; costliest first, 1% of it at least."""
    rules = {(_INDEX.sub("*", d), tuple(a)) for d, a in plan.rules()}
    time: dict[tuple[str, str], float] = {}
    count: dict[tuple[str, str], int] = {}
    for row in plan.ops:
        for dim, axes in _splits(row, plan.mesh):
            key = (_INDEX.sub("*", dim), "x".join(axes))
            if (key[0], axes) in rules:
                continue
            time[key] = time.get(key, 0.0) + _row_time(row)
            count[key] = count.get(key, 0) + 1
    total = sum(_row_time(r) for r in plan.ops) or 1.0
    ranked = [k for k in sorted(time, key=lambda k: -time[k])[:top] if time[k] >= 0.01 * total]
    return [f"{d} -> {a}  ({count[(d, a)]} ops, {time[(d, a)] / total:.0%} of the time)"
            for d, a in ranked]  # fmt: skip


def whole_sorts(plan: Plan, least: float = 0.1) -> list[str]:
    """Where the step sorts an axis that holds the batch (an MoE dispatch's ``argsort`` of
    every token's expert choices) and the plan splits the batch: XLA keeps a sorted axis
    whole on every device, so what the sort orders is gathered to each. One line a sorted
    dim whose ops take ``least`` of the step at least: their share, and what to write."""
    g = plan.graph
    if g is None or not any(a and "batch" in d for d, a in plan.rules()):
        return []
    counts: dict[str, int] = {}
    for op in g.ops:
        if op.primitive == "sort" and op.inputs:
            d = g.tensors[op.inputs[0]].dims[op.param("sort_axis", -1)]
            if d and "batch" in d:
                counts[d] = counts.get(d, 0) + 1
    total = sum(_row_time(r) for r in plan.ops) or 1.0
    out = []
    for d, n in counts.items():
        share = sum(_row_time(r) for r in plan.ops if d in (r.get("dims") or "").split(","))
        if share >= least * total:
            out.append(
                f"{n} sort{'s' if n > 1 else ''} order {d} across the whole batch (an MoE "
                "dispatch's argsort?): XLA sorts an axis whole on every device, so what it "
                f"orders is gathered to each (the ops over {d}: {share / total:.0%} of the "
                "step); sort each device's tokens alone (per example, or under shard_map) to "
                "keep the batch split"
            )
    return out


def _splits(row: dict[str, Any], mesh) -> list[tuple[str, tuple[str, ...]]]:
    """A report row's strategy, ``"batch:dataxexpert,d_ff:model"``, as (dim, mesh axes) pairs,
    the axes read by ``mesh``'s names (``expert`` has an ``x`` in it)."""
    out = []
    for part in filter(None, (row.get("strategy") or "").split(",")):
        dim, _, axes = part.rpartition(":")
        out.append((dim, axes_of_text(axes, mesh)))
    return out


def axes_of_text(text: str, names) -> tuple[str, ...]:
    """``"dataxexpert"`` -> ``("data", "expert")``: mesh axes joined by ``x``, split where
    the pieces are axis names of ``names`` (else at every ``x``)."""
    return _axes_of_text(text, tuple(names))


@functools.lru_cache(maxsize=4096)  # a 96-layer plan's report reads 74k strategies
def _axes_of_text(text: str, names: tuple[str, ...]) -> tuple[str, ...]:
    longest = sorted(names, key=len, reverse=True)

    def split(i: int) -> tuple[str, ...] | None:
        if i == len(text):
            return ()
        for n in longest:
            end = i + len(n)
            if text.startswith(n, i) and (end == len(text) or text[end] == "x"):
                rest = split(end + 1 if end < len(text) else end)
                if rest is not None:
                    return (n, *rest)
        return None

    got = split(0) if text else ()
    return got if got is not None else tuple(text.split("x"))


def axes_in_use(plan: Plan) -> set[str]:
    """The mesh axes that split something: a tensor's layout, or an op's work (an op may
    split a summed dim, whose partial results no tensor keeps)."""
    used = {a for lay in plan.layouts.values() for axes in lay for a in axes}
    return used | {a for row in plan.ops for _, axes in _splits(row, plan.mesh) for a in axes}


def _row_time(row: dict[str, Any]) -> float:
    """A report row's seconds per step (all its executions)."""
    return (row.get("compute_s", 0.0) + row.get("comm_s", 0.0)) * row.get("trips", 1)


def summary_rows(plan: Plan) -> list[tuple[str, str]]:
    """The summary as (label, value) pairs, units written out."""
    s = plan.predicted
    mesh = mesh_text(plan.mesh)
    rows = [
        ("model", plan.model),
        ("hardware", f"{plan.hardware} ({plan.devices} devices)"),
        ("status", plan.status),
        ("mesh", mesh),
        ("rules", "\n".join(rule_lines(plan)) or "(replicated)"),
        ("also inside the step", "\n".join(inner_splits(plan)) or "(nothing more)"),
        ("step time", _seconds(s.get("step_time_s", math.nan))),
        ("compute", _seconds(s.get("compute_s", math.nan))),
        ("communication", _seconds(s.get("comm_s", math.nan))),
        ("exposed communication", _seconds(s.get("exposed_comm_s", math.nan))),
        ("MFU", f"{s.get('mfu', math.nan):.1%}"),
        (
            "memory per device",
            f"{_gib(s.get('memory_bytes_per_device', math.nan))} of "
            f"{_gib(s.get('memory_limit_bytes', math.nan))} allowed"
            + ("" if s.get("fits", True) else "  (DOES NOT FIT)"),
        ),
    ]
    solver = plan.solver or {}
    if "wall_s" in solver:
        tried = len(solver.get("mesh_shapes_tried", []))
        shapes = "mesh shape" if tried == 1 else "mesh shapes"
        rows.append(("search", f"{solver['wall_s']:.1f} s, {tried} {shapes} tried"))
    return rows


def _seconds(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(x) >= f:
            return f"{x / f:.4g} {unit}"
    return f"{x / 1e-9:.4g} ns"


def _gib(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x / 2**30:.3g} GiB"


def _time_unit(x: float) -> tuple[str, float]:
    return ("s", 1.0) if x >= 1 else ("ms", 1e-3) if x >= 1e-3 else ("us", 1e-6)


# --- terminal text ----------------------------------------------------------------------------


def shown_strategies(strategies: list[str]) -> dict[str, str]:
    """Strategies (``kd(3):space,batch:data``) as one table shows them (Mesh-TF's dims, issue
    39): a dim of a name given to several sizes reads ``kd`` where no other size of it is in
    the table, ``kd(3)`` and ``kd(2)`` where both are (:func:`shown_names`)."""
    dims = {d for s in strategies if s for d in _STRATEGY_DIM.findall(s)}
    names = shown_names(dims)
    return {
        s: _STRATEGY_DIM.sub(lambda m: names.get(m.group(1), m.group(1)) + ":", s)
        for s in strategies
        if s
    }


_STRATEGY_DIM = re.compile(r"([^,:]+):")


def report_text(
    plan: Plan, *, width: int = 80, by: str = "layer", top: int = 10, title: str = ""
) -> str:
    """``autolayout report``'s text: the summary, the costliest ops, the time by ``by`` and the
    collectives, every line at most ``width`` columns (long cells wrap onto more lines, never
    cut). Times are per step: an op inside a loop (a scanned layer stack) runs ``runs`` times
    a step and its row is the sum of those runs, as each table's title says."""
    width = max(width, 40)
    label = max(len(k) for k, _ in summary_rows(plan)) + 2
    out = _wrap(title, width) if title else []  # a plan's path may be longer than the width
    for k, v in summary_rows(plan):
        lines = [w for part in str(v).split("\n") for w in _wrap(part, width - label)]
        out += [(k if i == 0 else "").ljust(label) + line for i, line in enumerate(lines)]
    df = top_ops(plan, top)
    looped = int(df.trips.max()) if len(df) else 1
    unit, f = _time_unit(float(df.time_s.max()) if len(df) else 0.0)
    shown = shown_strategies([r.strategy for r in df.itertuples()])
    what = shown_ops(plan)
    rows = [[what.get(r.op, r.op), r.layer, _num(r.time_s / f), str(r.trips), r.collective or "-",
             shown.get(r.strategy) or "replicated"] for r in df.itertuples()]  # fmt: skip
    head = f"costliest {len(rows)} ops: time per step ({unit})"
    if looped > 1:
        head += "; an op run N times a step (runs: a loop's trips) is summed over its runs"
    out += ["", *_wrap(head, width)]
    out += _table(
        ["op", "layer", unit, "runs", "collective", "strategy"], rows, width, {0, 1, 4, 5}
    )
    grouped = report_frame(plan, by)
    runs = report_frame(plan).groupby(by, sort=False).trips.max()
    unit, f = _time_unit(float(grouped.time_s.max()) if len(grouped) else 0.0)
    rows = [[(str(i) or "(none)") + (f" x{runs[i]}" if runs[i] > 1 else ""), str(int(r.ops)),
             _num(r.compute_s / f), _num(r.comm_s / f), _num(r.time_s / f), f"{r.share:.1%}"]
            for i, r in grouped.head(top).iterrows()]  # fmt: skip
    head = f"time per step by {by} ({unit}; communication before overlap)"
    if any(runs > 1):
        head += "; a group run N times a step (xN: a loop's body) is summed over its runs"
    out += ["", *_wrap(head, width)]
    out += _table([by, "ops", "compute", "comm", "time", "share"], rows, width, {0})
    coll = collectives_by_kind(plan)
    if len(coll):
        unit, f = _time_unit(float(coll.time_s.max()))
        rows = [[str(k), str(int(r["count"])), _bytes(r["bytes"]), _num(r["time_s"] / f)]
                for k, r in coll.iterrows()]  # fmt: skip
        out += ["", *_wrap(f"collectives per step (all runs; time in {unit})", width)]
        out += _table(["kind", "count", "bytes per device", unit], rows, width, {0})
    return "\n".join(out)


def frame_text(df: Any, title: str, width: int = 80, index: str | None = None) -> str:
    """A data frame as a plain table of at most ``width`` columns under its ``title`` (``autolayout
    diff``'s tables, a plan's exceptions): text cells wrap, numbers to three significant
    digits; ``index`` names the index as a first column."""
    if index is not None:
        df = df.reset_index().rename(columns={"index": index})
    cols = [str(c) for c in df.columns]
    numeric = {j for j, c in enumerate(df.columns) if df[c].dtype.kind in "iuf"}

    def cell(v: Any, j: int) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    rows = [[cell(v, j) for j, v in enumerate(r)] for r in df.itertuples(index=False)]
    text = set(range(len(cols))) - numeric
    body = _table(cols, rows, width, text or {0}) if rows else ["(none)"]
    if any(len(x) > width for x in body):  # too many columns to fit: a block of lines a row
        key = max(map(len, cols)) + 2
        body = [
            x
            for k, r in enumerate(rows)
            for x in ([""] if k else [])
            + [
                (c if i == 0 else "").ljust(key) + w
                for c, v in zip(cols, r, strict=True)
                for i, w in enumerate(_wrap(v, width - key))
            ]  # fmt: skip
        ]
    return "\n".join([*_wrap(title, width), *body])


def _num(x: float) -> str:
    """Three significant digits, no exponent for the sizes a report shows."""
    if not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    if abs(x) < 1e-4:
        return "<0.0001"
    return f"{x:.3g}" if abs(x) < 1e5 else f"{x:.2e}"


def _bytes(x: float) -> str:
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= f:
            return f"{x / f:.3g} {unit}"
    return f"{x:.0f} B"


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken after spaces, commas or a path's slashes
    where it can, else mid-word (a long op name)."""
    lines: list[str] = []
    while len(text) > width:
        cut = max(text.rfind(" ", 0, width + 1), text.rfind(",", 0, width) + 1,
                  text.rfind("/", 0, width) + 1)  # fmt: skip
        if text[cut : cut + 1] == "," and cut > 1:  # a comma does not begin a line
            cut -= 1
        cut = cut if cut > 0 else width
        lines.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return lines + [text] if text or not lines else lines


def _table(header: list[str], rows: list[list[str]], width: int, text: set[int]) -> list[str]:
    """A plain table at most ``width`` wide: the ``text`` columns (names, strategies)
    left-aligned and, where the row is too wide, wrapped, the widest first; the numbers
    right-aligned and never cut."""
    n = len(header)
    wide = [max([len(header[j])] + [len(r[j]) for r in rows]) for j in range(n)]
    word = [max([len(header[j])] + [len(w) for r in rows for w in re.split(r"[ ,]", r[j])])
            for j in range(n)]  # fmt: skip
    for floor in ([min(w, 24) for w in word], [max(len(h), 8) for h in header]):
        while sum(wide) + 2 * (n - 1) > width:  # first at commas and spaces, then anywhere
            j = max(text, key=lambda j: wide[j] - floor[j])
            if wide[j] <= floor[j]:
                break
            wide[j] -= 1

    def line(cells: list[str]) -> list[str]:
        parts = [_wrap(c, wide[j]) for j, c in enumerate(cells)]
        out = []
        for k in range(max(len(p) for p in parts)):
            cols = []
            for j, p in enumerate(parts):
                c = p[k] if k < len(p) else ""
                cols.append(c.ljust(wide[j]) if j in text else c.rjust(wide[j]))
            out.append("  ".join(cols).rstrip())
        return out

    rule = "  ".join("-" * w for w in wide)
    return line(header) + [rule] + [x for r in rows for x in line(r)]


# --- figures ----------------------------------------------------------------------------------

_KIND_COLOURS = {
    "compute": "#4C72B0",
    "all-reduce": "#DD8452",
    "all-gather": "#55A868",
    "reduce-scatter": "#C44E52",
    "all-to-all": "#8172B3",
    "collective-permute": "#937860",
    "offload-to-host": "#DA8BC3",
    "offload-to-device": "#8C8C8C",
}


def figures(plan: Plan, by: str = "layer") -> dict[str, Any]:
    """``plan.figures()``: see :meth:`Plan.figures`."""
    return {
        "step_time": fig_step_time(plan, by),
        "mesh_shapes": fig_mesh_shapes(plan),
        "memory": fig_memory(plan),
        "roofline": fig_roofline(plan),
    }


def _figure(w: float = 7.0, h: float = 4.0):
    from matplotlib.figure import Figure  # heavy (matplotlib): only for figures

    return Figure(figsize=(w, h), layout="constrained")


def fig_step_time(plan: Plan, by: str = "layer", top: int = 16):
    """The step: compute and exposed communication (top); then per group, costliest first,
    compute and communication per collective kind (before overlap)."""
    df = report_frame(plan)
    coll = plan.collectives()
    groups = report_frame(plan, by).head(top)
    names = list(groups.index)
    parts: dict[str, list[float]] = {"compute": [], **{k: [] for k in sorted(set(coll.kind))}}
    key = dict(zip(df.op, df[by], strict=False))
    per: dict[tuple[str, str], float] = {}
    for r in coll.itertuples():
        k = (key.get(r.op, ""), r.kind)
        per[k] = per.get(k, 0.0) + r.time_s * r.count
    for n in names:
        parts["compute"].append(float(groups.loc[n, "compute_s"]))
        for k in parts:
            if k != "compute":
                parts[k].append(per.get((n, k), 0.0))
    s = plan.predicted
    compute, exposed = s.get("compute_s", 0.0), s.get("exposed_comm_s", 0.0)
    peak = max([sum(v) for v in zip(*parts.values(), strict=True)] or [0.0])
    fig = _figure(7.5, max(3.5, 0.35 * len(names) + 2.3))
    top_ax, ax = fig.subplots(2, 1, height_ratios=[1, max(2, len(names))])
    unit, f = _time_unit(compute + exposed)
    top_ax.barh([0], [compute / f], color=_KIND_COLOURS["compute"], label="compute")
    top_ax.barh([0], [exposed / f], left=[compute / f], color="#BBBBBB", hatch="//",
                label="exposed communication")  # fmt: skip
    top_ax.set_yticks([0], ["whole step"])
    top_ax.set_xlabel(f"predicted step time ({unit})", fontsize=8)
    top_ax.set_ylabel("step", fontsize=8)
    top_ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    top_ax.set_title(
        f"{plan.model} on {plan.hardware}: step {_seconds(s.get('step_time_s', math.nan))}, "
        f"exposed comm {_seconds(s.get('exposed_comm_s', math.nan))}",
        fontsize=10,
    )
    unit, f = _time_unit(peak)
    y = list(range(len(names)))
    left = [0.0] * len(names)
    for k, vals in parts.items():
        if not any(vals):
            continue
        v = [x / f for x in vals]
        ax.barh(y, v, left=left, color=_KIND_COLOURS.get(k, None), label=k)
        left = [a + b for a, b in zip(left, v, strict=True)]
    ax.set_yticks(y, [str(n) or "(none)" for n in names])
    ax.invert_yaxis()
    ax.set_xlabel(f"time per step ({unit}, compute and communication before overlap)")
    ax.set_ylabel(by)
    ax.set_title(f"by {by} (costliest {len(names)})", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return fig


def fig_mesh_shapes(plan: Plan):
    """Predicted step time of every mesh shape tried; the chosen one marked, shapes that do
    not fit hatched."""
    tried = (plan.solver or {}).get("mesh_shapes_tried", [])
    if not tried:  # an evaluated plan: its one mesh
        tried = [
            {
                "mesh": plan.mesh,
                "step_time_s": plan.predicted.get("step_time_s"),
                "fits": plan.predicted.get("fits", True),
                "chosen": True,
                "status": plan.status,
            }
        ]
    rows = [r for r in tried if r.get("step_time_s") is not None]
    rows.sort(key=lambda r: r["step_time_s"])
    unit, f = _time_unit(max([r["step_time_s"] for r in rows] or [1.0]))
    fig = _figure(7.5, max(3.0, 0.28 * len(rows) + 1.5))
    ax = fig.add_subplot()
    for i, r in enumerate(rows):
        chosen = bool(r.get("chosen"))
        ax.barh(
            i,
            r["step_time_s"] / f,
            color="#C44E52" if chosen else ("#4C72B0" if r.get("fits", True) else "#BBBBBB"),
            hatch=None if r.get("fits", True) else "//",
            edgecolor="black" if chosen else "none",
        )
    labels = [
        " x ".join(str(v) for v in r["mesh"].values())
        + (" (chosen)" if r.get("chosen") else "")
        + ("" if r.get("fits", True) else " (no fit)")
        for r in rows
    ]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"predicted step time ({unit}, best layout found on the shape)")
    ax.set_ylabel("mesh shape (axis sizes)")
    skipped = len(tried) - len(rows)
    ax.set_title(
        f"Mesh shapes tried on {plan.hardware}"
        + (f" ({skipped} skipped, no time left)" if skipped else ""),
        fontsize=10,
    )
    ax.grid(axis="x", alpha=0.3)
    return fig


def fig_memory(plan: Plan):
    """Peak memory per device by category (GiB) against the HBM capacity and the limit."""
    s = plan.predicted
    cats = dict(s.get("memory_by_category") or {})
    if not cats:
        cats = {"total": s.get("memory_bytes_per_device", 0)}
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    bottom = 0.0
    for k, v in cats.items():
        ax.bar(0, v / 2**30, bottom=bottom, label=f"{k}: {v / 2**30:.3g} GiB", width=0.5)
        bottom += v / 2**30
    limit = s.get("memory_limit_bytes")
    hbm = s.get("hbm_bytes_per_device")
    if hbm:
        ax.axhline(hbm / 2**30, color="black", lw=1.5, label=f"HBM {hbm / 2**30:.3g} GiB")
    if limit:
        ax.axhline(limit / 2**30, color="#C44E52", ls="--", lw=1.5,
                   label=f"limit {limit / 2**30:.3g} GiB")  # fmt: skip
    ax.set_xticks([0], [f"{plan.model}\n{' x '.join(map(str, plan.mesh.values()))}"])
    ax.set_xlim(-1, 1.8)
    ax.set_xlabel("plan (model, mesh axis sizes)")
    ax.set_ylabel("peak memory per device (GiB)")
    ax.set_title(f"Memory per device on {plan.hardware} (at the liveness peak)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return fig


def fig_roofline(plan: Plan):
    """Each matmul and convolution: arithmetic intensity (FLOP per HBM byte) against the
    FLOP/s it is predicted to reach, under the chip's two roofs (the matrix units' peak and
    HBM bandwidth; other ops run on the vector units, which this roof does not describe)."""
    df = report_frame(plan)
    mm = ("dot_general", "conv_general_dilated")
    df = df[(df.flops > 0) & (df.bytes > 0) & (df.compute_s > 0) & df.kind.isin(mm)]
    s = plan.predicted
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    if not df.empty:
        ai = df.flops / df.bytes
        perf = df.flops / df.compute_s
        size = 10 + 200 * (df.time_s / df.time_s.max())
        for kind, colour in zip(mm, ("#C44E52", "#8172B3"), strict=True):
            m = df.kind == kind
            if m.any():
                ax.scatter(ai[m], perf[m], s=size[m], alpha=0.6, color=colour, label=kind)
        peak = s.get("peak_flops_per_device")
        bw = s.get("hbm_bandwidth_bytes_per_s")
        if peak and bw:
            lo, hi = min(ai.min(), peak / bw) / 4, max(ai.max(), peak / bw) * 4
            xs = [lo * (hi / lo) ** (k / 64) for k in range(65)]
            ax.plot(xs, [min(peak, bw * x) for x in xs], color="black", lw=1.5,
                    label=f"roof: {peak:.3g} FLOP/s, {bw:.3g} B/s")  # fmt: skip
            me, be = s.get("matmul_efficiency", 1.0), s.get("memory_efficiency", 1.0)
            ax.plot(xs, [min(peak * me, bw * be * x) for x in xs], color="grey", ls="--",
                    lw=1, label="with the profile's efficiencies")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte, per device)")
    ax.set_ylabel("predicted FLOP/s per device")
    ax.set_title(
        f"Matmuls and convolutions on the {plan.hardware} roofline (area: time per step)",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both")
    return fig


def png_bytes(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# --- HTML -------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0} td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:1.5em}
"""


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows
    )
    return f'<table class="summary">{body}</table>'


def _frame_html(df, index: bool = False) -> str:
    return df.to_html(index=index, float_format=lambda x: f"{x:.4g}", border=0, escape=True)


def html_summary(plan: Plan) -> str:
    """``Plan._repr_html_``: the summary and the costliest ops."""
    return (
        f"<div><b>{html.escape(repr(plan))}</b>{_kv_table(summary_rows(plan))}"
        f"<b>Costliest ops</b>{_frame_html(top_ops(plan, 8))}</div>"
    )


def html_page(plan: Plan) -> str:
    """One self-contained HTML page: summary, figures as embedded PNGs, tables."""
    imgs = []
    for name, fig in figures(plan).items():
        data = base64.b64encode(png_bytes(fig)).decode()
        imgs.append(f'<img alt="{name}" id="fig-{name}" src="data:image/png;base64,{data}">')
    layers = report_frame(plan, "layer")
    kinds = report_frame(plan, "kind")
    title = html.escape(f"{plan.model} on {plan.hardware}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>autolayout plan: {title}</title>
<style>{_CSS}</style></head><body>
<h1>autolayout plan: {title}</h1>
{_kv_table(summary_rows(plan))}
<h2>Figures</h2>
{"".join(imgs)}
<h2>Costliest ops</h2>
{_frame_html(top_ops(plan, 15))}
<h2>By layer</h2>
{_frame_html(layers, index=True)}
<h2>By op kind</h2>
{_frame_html(kinds, index=True)}
<h2>Collectives by kind</h2>
{_frame_html(collectives_by_kind(plan), index=True)}
</body></html>
"""


# --- two plans ----------------------------------------------------------------------------------


@dataclass
class PlanDiff:
    """Where two plans of one program split differently, and what it costs.

    ``summary``: per quantity (step time, compute, communication, exposed communication,
    memory, MFU) its value in each plan, ``delta`` (b - a) and ``ratio`` (b / a). ``inputs``:
    the inputs laid out differently (layout as ``dim:axes``, bytes per device in each).
    ``ops``: the ops split differently, with their time per step in each and the delta,
    largest change first. ``layers``: time per step per layer in each.
    """

    a: str
    b: str
    summary: Any
    inputs: Any
    ops: Any
    layers: Any

    def __repr__(self) -> str:
        s = self.summary.set_index("quantity")
        st = s.loc["step_time_s"]
        return (
            f"PlanDiff({self.a} -> {self.b}: step {_seconds(st.a)} -> {_seconds(st.b)} "
            f"(x{st.ratio:.3g}), {len(self.inputs)} inputs and {len(self.ops)} ops split "
            "differently)"
        )

    def _repr_html_(self) -> str:
        return (
            f"<div><b>{html.escape(repr(self))}</b>{_frame_html(self.summary)}"
            f"<b>Inputs laid out differently</b>{_frame_html(self.inputs.head(20))}"
            f"<b>Ops split differently (largest change first)</b>"
            f"{_frame_html(self.ops.head(20))}</div>"
        )


def _layout_text(dims, layout, mesh: dict[str, int]) -> str:
    parts = []
    for d, axes in zip(dims, layout, strict=True):
        if axes:
            split = "x".join(f"{a}({mesh.get(a, '?')})" for a in axes)
            parts.append(f"{d or '?'}:{split}")
    return ",".join(parts) or "replicated"


def diff(a: Plan, b: Plan, *, names: tuple[str, str] = ("a", "b")) -> PlanDiff:
    """``al.diff(plan_a, plan_b)``: see :class:`PlanDiff`. Both plans must be of one program
    (the same model, options and inputs); their hardware and meshes may differ."""
    import pandas as pd  # heavy (pandas): only where a table is asked for

    def per_device(i, mesh) -> int:
        t = Tensor(i["path"], tuple(i["shape"]), i["dtype"], tuple(i["dims"]))
        return local_bytes(t, i["layout"], mesh)

    sig_a = [(i["path"], tuple(i["shape"])) for i in a.inputs]
    sig_b = [(i["path"], tuple(i["shape"])) for i in b.inputs]
    if a.model != b.model or sig_a != sig_b:
        raise PlanError(
            f"cannot diff plans of different programs: {a.model!r} ({len(sig_a)} inputs) and "
            f"{b.model!r} ({len(sig_b)} inputs); plan the same model with the same options"
        )
    qs = ["step_time_s", "compute_s", "comm_s", "exposed_comm_s", "memory_bytes_per_device",
          "mfu"]  # fmt: skip
    rows = []
    for q in qs:
        va, vb = float(a.predicted.get(q, math.nan)), float(b.predicted.get(q, math.nan))
        rows.append({"quantity": q, "a": va, "b": vb, "delta": vb - va,
                     "ratio": vb / va if va else math.nan})  # fmt: skip
    rows.insert(0, {"quantity": "mesh", "a": mesh_text(a.mesh), "b": mesh_text(b.mesh),
                    "delta": "", "ratio": ""})  # fmt: skip
    summary = pd.DataFrame(rows, columns=["quantity", "a", "b", "delta", "ratio"])
    ins = []
    for ia, ib in zip(a.inputs, b.inputs, strict=True):
        la = _layout_text(ia["dims"], ia["layout"], a.mesh)
        lb = _layout_text(ib["dims"], ib["layout"], b.mesh)
        if la != lb:
            ins.append({
                "path": ia["path"], "dims": ",".join(d or "?" for d in ia["dims"]),
                "layout_a": la, "layout_b": lb,
                "bytes_a": per_device(ia, a.mesh),
                "bytes_b": per_device(ib, b.mesh),
            })  # fmt: skip
    inputs = pd.DataFrame(
        ins, columns=["path", "dims", "layout_a", "layout_b", "bytes_a", "bytes_b"]
    )
    ra, rb = report_frame(a), report_frame(b)
    ta = ra.groupby("op").agg(strategy=("strategy", "first"), time_s=("time_s", "sum"),
                              kind=("kind", "first"), layer=("layer", "first"))  # fmt: skip
    tb = rb.groupby("op").agg(strategy=("strategy", "first"), time_s=("time_s", "sum"))
    j = ta.merge(tb, left_index=True, right_index=True, suffixes=("_a", "_b"))
    ops = j[j.strategy_a != j.strategy_b].reset_index()
    ops["delta_s"] = ops.time_s_b - ops.time_s_a
    ops = ops.reindex(ops.delta_s.abs().sort_values(ascending=False).index)
    ops = ops[["op", "kind", "layer", "strategy_a", "strategy_b", "time_s_a", "time_s_b",
               "delta_s"]].reset_index(drop=True)  # fmt: skip
    la, lb = report_frame(a, "layer").time_s, report_frame(b, "layer").time_s
    layers = pd.DataFrame({"time_s_a": la, "time_s_b": lb}).fillna(0.0)
    layers["delta_s"] = layers.time_s_b - layers.time_s_a
    layers = layers.reindex(layers.delta_s.abs().sort_values(ascending=False).index)
    return PlanDiff(names[0], names[1], summary, inputs, ops, layers)
