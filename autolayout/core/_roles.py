"""Names for a model that names nothing: the dims of every copy of a layer found to be one
dim (Weisfeiler-Lehman colours of the program), and dims named by the role they play, found
from the program's structure alone (no library is special-cased):

* ``batch``: the leading axis of the data inputs; ``seq``: axis 1 of an integer rank-2 one.
* ``vocab``: an axis a gather indexes with values derived from integer data (the embedding
  table's rows, the loss's logits); ``d_model``: the other axis of a rank-2 weight so indexed
  (else, in a model with attention, the dim most weights carry; else the feature axis of a
  scanned stack's per-example carry: the residual stream of an MLP).
  ``classes``: an axis a gather indexes with integer labels [batch].
* ``heads``: the batch dims (not ``batch``) of a dot of two activations whose result a
  softmax reads (the scores); ``head_dim``: that dot's contracted dim, and the values' free
  dim in the dot of the softmax with them; ``seq``: the scores' other dims (the positions of
  a model without token inputs); ``kv_heads`` and ``q_per_kv``: the parts a reshape merges
  into ``heads`` (grouped-query attention's repeat).
* ``d_ff``: a dim weight matmuls produce from ``d_model`` and contract back into it, over
  two weights at least (an MLP's hidden units: the column/row pair Megatron splits).
* otherwise a weight's path without its layer index and generic leaf names
  (``down_proj.0`` for ``params/model/layers/17/mlp/down_proj/kernel`` axis 0)."""

from __future__ import annotations

import re
from collections.abc import Callable

from ._builder import _Builder
from ._stages import scan_parts

WL_ROUNDS = 3  # enough to tell q from o in one layer, few enough for the first layer to match
INT_DEPTH = 8  # ops from an integer data input to the indices a gather reads
SOFTMAX_DEPTH = 4  # same-shape ops (scale, mask, bias) between attention scores and softmax
GENERIC_LEAVES = frozenset({"kernel", "weight", "weights", "bias", "scale", "embedding", "w", "b",
                            "params", "param", "value", "raw_value", "variables"})  # fmt: skip
_DIGITS = re.compile(r"\d+")
PASS_THROUGH = frozenset({"convert_element_type", "transpose", "copy", "copy_p", "reshape",
                          "squeeze", "expand_dims", "reduce_precision"})  # fmt: skip


def _h(x) -> int:
    try:
        return hash(x)
    except TypeError:
        return hash(repr(x))


def _alike(s1: tuple[int, ...], s2: tuple[int, ...]) -> bool:
    """Shapes of one tensor seen through a transpose or a size-1 axis added or dropped."""
    return sorted(x for x in s1 if x != 1) == sorted(x for x in s2 if x != 1)


def copy_groups(b: _Builder, live: set[int]) -> list[list[int]]:
    """Groups of input axes at one place of structurally identical inputs (the weights and
    optimizer moments of layer copies): the same Weisfeiler-Lehman colour after
    ``WL_ROUNDS`` rounds over producers and readers, and the same axis. Inputs start from
    their path with the digits taken out (``layers/17/...`` is ``layers/#/...``), shape and
    dtype; what their copies compute is linked to them."""
    ops = b.ops
    io = [([int(t[1:]) for t in op.inputs], [int(t[1:]) for t in op.outputs]) for op in ops]
    readers: dict[int, list[tuple[int, int]]] = {}
    for i, (ins, _) in enumerate(io):
        for p, t in enumerate(ins):
            readers.setdefault(t, []).append((i, p))
    sources = sorted(t for t in live if b.roles[t] == "input" or t not in b.producer)
    src_col = {
        t: _h(("in", b.shapes[t], b.dtypes[t], _DIGITS.sub("#", b.paths[t] or ""))) for t in sources
    }
    op_col = [
        _h((op.primitive, op.params, tuple(b.shapes[t] for t in ins), tuple(b.dtypes[t] for t in ins),
            tuple(b.shapes[t] for t in outs)))
        for op, (ins, outs) in zip(ops, io, strict=True)
    ]  # fmt: skip
    pos = {}
    for i, (_, outs) in enumerate(io):
        for k, t in enumerate(outs):
            pos.setdefault(t, (i, k))

    def tcol(t: int, oc: list[int], sc: dict[int, int]) -> int:
        at = pos.get(t)
        if at is None or t in sc:
            return sc.get(t, 0)
        return _h((oc[at[0]], at[1]))

    for _ in range(WL_ROUNDS):
        new_ops = []
        for i, (ins, outs) in enumerate(io):
            rd = tuple(
                sorted((k, op_col[r], p) for k, t in enumerate(outs) for r, p in readers.get(t, ()))
            )
            new_ops.append(_h((op_col[i], tuple(tcol(t, op_col, src_col) for t in ins), rd)))
        src_col = {
            t: _h((c, tuple(sorted((op_col[r], p) for r, p in readers.get(t, ())))))
            for t, c in src_col.items()
        }
        op_col = new_ops
    groups: dict[tuple[int, int], list[int]] = {}
    for t in sources:  # inputs only: ops far from any weight's path (an optimizer's update of
        # two same-shape weights) can share a colour without being copies
        if b.roles[t] not in ("input", "const"):
            continue
        c = src_col[t]
        for a, s in enumerate(b.shapes[t]):
            if s > 1:
                groups.setdefault((c, a), []).append(b.key(t, a))
    return [g for g in groups.values() if len(g) > 1]


def role_names(
    b: _Builder, root: list[int], fam: Callable[[int], int], data: set[int], live: set[int],
    taken: Callable[[int], bool],
) -> list[tuple[int, str]]:  # fmt: skip
    """``(class root, role name)`` in the order to claim them (the first claim of a root
    wins); roots for which ``taken`` is true are left out."""
    out: list[tuple[int, str]] = []

    def r(t: int, a: int) -> int:
        return root[b.key(t, a)]

    def add(x: int, name: str) -> None:
        if x >= 0 and not taken(x):
            out.append((x, name))

    ints = {t for t in data if "int" in b.dtypes[t]}
    for t in sorted(data):
        if b.shapes[t]:
            add(r(t, 0), "batch")
    batch = {r(t, 0) for t in data if b.shapes[t]}
    for t in sorted(ints):
        if len(b.shapes[t]) == 2:
            add(r(t, 1), "seq")
    for op in b.ops:  # a scan over stacked weights: their leading axis is the layer stack
        if op.primitive == "scan" and not op.scope:
            n = op.param("length", 0)
            for name in op.inputs:
                t = int(name[1:])
                shape = b.shapes[t]
                if b.roles[t] == "input" and t not in data and shape and shape[0] == n > 1:
                    add(r(t, 0), "layers")
    data_fams = {fam(r(t, a)) for t in data for a in range(len(b.shapes[t])) if r(t, a) >= 0}
    weights = [t for t in sorted(live) if b.roles[t] == "input" and t not in data]
    carried: dict[int, int] = {}  # root -> how many weights carry it
    for t in weights:
        for x in {r(t, a) for a in range(len(b.shapes[t]))}:
            if x >= 0:
                carried[x] = carried.get(x, 0) + 1

    readers: dict[int, list] = {}  # tensor -> the ops that read it
    for op in b.ops:
        for t in op.inputs:
            readers.setdefault(int(t[1:]), []).append(op)

    # integer values derived from the integer data: token ids [batch, seq] (a vocabulary)
    # and labels [batch] (classes)
    def derived_from(start: set[int]) -> set[int]:
        derived, frontier = set(start), set(start)
        for _ in range(INT_DEPTH):
            nxt = set()
            for t in frontier:
                for op in readers.get(t, ()):
                    for o in op.outputs:
                        k = int(o[1:])
                        if k not in derived and ("int" in b.dtypes[k] or b.dtypes[k] == "bool"):
                            nxt.add(k)
            derived |= nxt
            frontier = nxt
            if not frontier:
                break
        return derived

    tokens = derived_from({t for t in ints if len(b.shapes[t]) >= 2})
    labels = derived_from({t for t in ints if len(b.shapes[t]) == 1}) - tokens
    d_model: list[int] = []
    for op in b.ops:
        if op.primitive != "gather" or len(op.inputs) < 2:
            continue
        idx, table = int(op.inputs[1][1:]), int(op.inputs[0][1:])
        axes = op.param("gathered_axes", ())
        if idx in labels:
            for a in axes:
                add(r(table, a), "classes")
        if idx not in tokens:
            continue
        for a in axes:
            add(r(table, a), "vocab")
        if len(b.shapes[table]) == 2 and len(axes) == 1:
            other = r(table, 1 - axes[0])
            if carried.get(other):
                d_model.append(other)

    # attention: dots of two activations (both carry the batch), one result softmaxed
    by_name = {op.name: op for op in b.ops}
    softmaxed: set[int] = set()
    scores: set[str] = set()  # dots whose result a softmax reads (through a scale, a mask)
    for op in b.ops:
        if op.primitive not in ("reduce_max", "argmax") or not op.inputs:
            continue
        t = int(op.inputs[0][1:])
        softmaxed |= {r(t, a) for a in op.param("reduced_axes", ())}
        todo = [(t, 0)]
        while todo:
            x, depth = todo.pop()
            p = by_name.get(b.producer.get(x, ""))
            if p is None or depth > SOFTMAX_DEPTH:
                continue
            if p.primitive == "dot_general":
                scores.add(p.name)
                continue
            todo += [
                (int(i[1:]), depth + 1)
                for i in p.inputs
                if _alike(b.shapes[int(i[1:])], b.shapes[x])
            ]
    heads: list[int] = []
    head_dim: list[int] = []
    seqs: list[int] = []
    attention: list[str] = []  # the scores dots
    for op in b.ops:
        if op.primitive != "dot_general" or len(op.inputs) != 2:
            continue
        lhs, rhs = (int(t[1:]) for t in op.inputs)
        if not any(r(lhs, a) in batch for a in range(len(b.shapes[lhs]))):
            continue
        if not any(r(rhs, a) in batch for a in range(len(b.shapes[rhs]))):
            continue
        bd = op.param("batch", ())
        if not bd or op.name not in scores:
            continue
        attention.append(op.name)
        res = int(op.outputs[0][1:])
        for la, _ in bd:
            x = r(lhs, la)
            if x not in batch and fam(x) not in data_fams and x not in heads:
                heads.append(x)
        for la, _ in op.param("contracting", ()):
            x = r(lhs, la)
            if x not in softmaxed and x not in head_dim:
                head_dim.append(x)
        known = batch | set(heads) | set(head_dim)
        seqs += [r(res, a) for a in range(len(b.shapes[res])) if r(res, a) not in known]
    probs: set[int] = set()  # the scores' softmax (and its gradient): ops of their shape on
    todo = [(int(by_name[n].outputs[0][1:]), 0) for n in attention]
    while todo:
        x, depth = todo.pop()
        if x in probs or depth > 2 * SOFTMAX_DEPTH:
            continue
        probs.add(x)
        for op in readers.get(x, ()):
            todo += [(int(o[1:]), depth + 1) for o in op.outputs
                     if _alike(b.shapes[int(o[1:])], b.shapes[x])]  # fmt: skip
    for op in b.ops:  # the values' head dim: the other side of probabilities x values
        if op.primitive != "dot_general" or len(op.inputs) != 2 or op.name in attention:
            continue
        ts = [int(t[1:]) for t in op.inputs]
        cd = op.param("contracting", ())
        for side in (0, 1):
            p, v = ts[side], ts[1 - side]
            if p not in probs or not cd or not all(r(p, c[side]) in softmaxed for c in cd):
                continue
            used = {pair[1 - side] for pair in op.param("batch", ()) + cd}
            head_dim += [
                x for x in (r(v, a) for a in range(len(b.shapes[v])) if a not in used)
                if x not in batch and x not in head_dim and x not in heads
            ]  # fmt: skip
    for x in heads:
        add(x, "heads")
    for x in head_dim:
        add(x, "head_dim")
    for x in dict.fromkeys(seqs):  # the queries' and the keys' positions (patches, frames)
        add(x, "seq")
    if not d_model and heads and carried:
        most = max(carried.values())
        d_model = [x for x, n in carried.items() if n == most and n >= 3][:1]
    if not d_model:  # no embedding, no attention: a scanned stack's residual stream's features
        for op in b.ops:
            if op.primitive != "scan" or op.scope or op.param("length", 0) < 2:
                continue
            for name in scan_parts(op)[1]:
                t = int(name[1:])
                shape = b.shapes[t]
                x = r(t, len(shape) - 1) if len(shape) >= 2 else -1
                if r(t, 0) in batch and x >= 0 and x not in batch and x not in d_model:
                    d_model.append(x)
    for x in d_model:
        add(x, "d_model")
    merged = set()  # classes a reshape makes of heads or head_dim and others (heads*head_dim)
    for op in b.ops:  # grouped-query attention: heads = kv_heads x queries per kv head
        if op.primitive != "reshape":
            continue
        src, dst = int(op.inputs[0][1:]), int(op.outputs[0][1:])
        for ga, gc in op.param("groups", ()):
            for one, many, t1, tm in ((gc, ga, dst, src), (ga, gc, src, dst)):
                if len(one) != 1 or len(many) < 2:
                    continue
                parts = [r(tm, a) for a in many if b.shapes[tm][a] > 1]
                if set(parts) & set(heads + head_dim):
                    merged.add(r(t1, one[0]))
                if r(t1, one[0]) in heads and len(parts) > 1:
                    add(parts[0], "kv_heads")
                    for x in parts[1:]:
                        add(x, "q_per_kv")

    # an MLP's hidden dim: produced by a weight's matmul from d_model and contracted into
    # d_model, by two weights at least (one weight's backward matmul contracts what it made)

    def source(t: int) -> int:  # through casts, transposes and reshapes to the weight
        for _ in range(8):
            op = by_name.get(b.producer.get(t, ""))
            if op is None or len(op.inputs) != 1 or op.primitive not in PASS_THROUGH:
                break
            t = int(op.inputs[0][1:])
        return t

    made: dict[int, set[int]] = {}
    eaten: dict[int, set[int]] = {}
    dm = set(d_model)
    for op in b.ops:
        if op.primitive != "dot_general" or len(op.inputs) != 2:
            continue
        ts = [int(t[1:]) for t in op.inputs]
        acts = [any(r(t, a) in batch for a in range(len(b.shapes[t]))) for t in ts]
        if acts.count(True) != 1:
            continue
        side = acts.index(False)
        w = ts[side]
        con = {c[side] for c in op.param("contracting", ())}
        free = {r(w, a) for a in range(len(b.shapes[w])) if a not in con}
        cdims = {r(w, a) for a in con}
        if cdims & dm:
            for x in free - dm:
                made.setdefault(x, set()).add(source(w))
        if free & dm:
            for x in cdims - dm:
                eaten.setdefault(x, set()).add(source(w))
    skip = set(heads) | set(head_dim) | merged
    size = {root[b.key(t, a)]: n for t in live for a, n in enumerate(b.shapes[t]) if n > 1}
    least = min((size.get(x, 0) for x in dm), default=0) // 4  # not a stacked q/k/v axis
    for x in sorted(made):  # two weights at least: in and out (and a gate)
        if x not in skip and x in eaten and len(made[x] | eaten[x]) >= 2 and size.get(x, 0) > least:
            add(x, "d_ff")
    return out


def path_name(path: str) -> str:
    """A weight's path without its argument, layer indices and generic leaf names:
    ``params/model/layers/17/mlp/down_proj/kernel`` -> ``down_proj``."""
    parts = [p for p in re.split(r"[/.\[\]]", path) if p]
    keep = [p for p in parts[1:] if not p.isdigit() and p.lower() not in GENERIC_LEAVES]
    return (keep or parts or ["t"])[-1]
