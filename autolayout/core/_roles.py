"""Names for a model that names nothing: the dims of every copy of a layer found to be one
dim (Weisfeiler-Lehman colours of the program), and dims named by the role they play, found
from the program's structure alone (no library is special-cased):

* ``batch``: the leading axis of the data inputs; ``seq``: axis 1 of an integer rank-2 one
  (a second such input of another sequence: ``targets_seq``, after its path).
  ``height``/``width`` (``length``, ``depth``) and ``channels``: the planes and the other
  axis of a data input a conv reads (through a pad, a cast, vmap's reshapes).
* ``vocab``: an axis a gather indexes with values derived from integer data (the embedding
  table's rows, the loss's logits); ``d_model``: the other axis of a rank-2 weight so indexed
  (else, in a model with attention, the dim most weights carry; else the feature axis of a
  scanned stack's per-example carry: the residual stream of an MLP).
  ``classes``: an axis a gather indexes with integer labels [batch].
* ``heads``: the batch dims (not ``batch``) of a dot of two activations whose result a
  softmax reads (the scores); ``head_dim``: that dot's contracted dim, and the values' free
  dim in the dot of the softmax with them; ``seq``: the scores' other dims (the positions of
  a model without token inputs); ``kv_heads`` and ``q_per_kv``: the parts a reshape merges
  into ``heads`` (grouped-query attention's repeat), or splits the queries' heads into. A
  fused kernel (cuDNN's, splash) shows them in its operands: q ``[batch, seq, heads,
  head_dim]``, k ``[batch, seq, kv_heads, head_dim]``.
* ``experts``: a top-k over a router's logits whose size is a batch dim of stacked weights'
  dots (both sides: one dim); ``top_k`` its choices, ``capacity`` each expert's slots.
* ``d_ff``: a dim weight matmuls produce from ``d_model`` and contract back into it, over
  two weights at least (an MLP's hidden units: the column/row pair Megatron splits), not
  one weight's layer copies.
* without a ``d_model`` or a conv (a plain MLP): ``features``, a float input's axis a weight's matmul
  contracts; ``hidden``, ``hidden2``, ...: dims one weight's matmul makes and another's
  contracts (Mesh-TF's MNIST: ``hidden1``, ``hidden2``).
* ``layers``: a scanned stack's leading axis, or an example-free axis the unrolled layers
  read a row each of; ``kernel_height``/``kernel_width``: a conv weight's window, and a
  pooling's where it reads the whole of a plane a pad made of a 1x1 one.
* otherwise a weight's path without its layer index, a repeated module's instance index
  (:func:`instance_free`) and generic leaf names (``down_proj`` for
  ``params/model/layers/17/mlp/down_proj/kernel``), and what ``_naming`` derives from
  named dims (a piece, a merge, a split)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from ._builder import _Builder
from ._dim_rules import ATTENTION_FWD, SCATTERS, attention_axes
from ._stages import scan_parts

WL_ROUNDS = 3  # enough to tell q from o in one layer, few enough for the first layer to match
INT_DEPTH = 8  # ops from an integer data input to the indices a gather reads
SOFTMAX_DEPTH = 4  # same-shape ops (scale, mask, bias) between attention scores and softmax
GENERIC_LEAVES = frozenset({"kernel", "weight", "weights", "bias", "scale", "embedding", "w", "b",
                            "params", "param", "value", "raw_value", "variables"})  # fmt: skip
_DIGITS = re.compile(r"\d+")
_INDEX = re.compile(r"(?<=/)\d+(?=/|$)")  # a layer's index in a path: layers/17/mlp
RELATION_OPS = frozenset({"slice", "split", "pad", "concatenate", "dynamic_slice",
                          "dynamic_update_slice"})  # fmt: skip
WINDOW_OPS = frozenset({"reduce_window_sum", "reduce_window_max", "reduce_window_min",
                        "reduce_window", "select_and_scatter_add", "select_and_scatter",
                        "select_and_gather_add"})  # fmt: skip
SPATIAL = (("length",), ("height", "width"), ("depth", "height", "width"))  # a conv's planes
UNPAD = frozenset({"pad", "convert_element_type", "copy", "copy_p", "reduce_precision"})
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
    io = b.io
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
    # what each round reads, fixed by the program: an op's inputs as a source's colour
    # (j < 0) or the colour of the output k of op j, and its outputs' readers
    ins_of = [
        [(-1, 0, t) if t in src_col or t not in pos else (*pos[t], t) for t in ins] for ins, _ in io
    ]
    read_by = [[(k, r, p) for k, t in enumerate(outs) for r, p in readers.get(t, ())]
               for _, outs in io]  # fmt: skip
    src_readers = {t: readers.get(t, ()) for t in src_col}

    for _ in range(WL_ROUNDS):  # hash() of int tuples: what _h gives them
        new_ops = [
            hash((op_col[i],
                  tuple([src_col.get(t, 0) if j < 0 else hash((op_col[j], k)) for j, k, t in ins]),
                  tuple(sorted([(k, op_col[r], p) for k, r, p in read_by[i]]))))
            for i, ins in enumerate(ins_of)
        ]  # fmt: skip
        src_col = {
            t: hash((c, tuple(sorted([(op_col[r], p) for r, p in src_readers[t]]))))
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


class _Program:
    """What :func:`role_names` reads of the program that no naming changes, found once per
    trace (the naming asks for roles up to three times): the ops of each kind it looks at,
    in program order, as tensor ids."""

    def __init__(self, b: _Builder, data: set[int], live: set[int]) -> None:
        self.data, self.live = data, live
        io, ops = b.io, b.ops
        self.by_name = {op.name: k for k, op in enumerate(ops)}
        self.readers: dict[int, list[int]] = {}  # tensor -> the ops that read it
        for k, (ins, _) in enumerate(io):
            for t in ins:
                self.readers.setdefault(t, []).append(k)
        self.ints = {t for t in data if "int" in b.dtypes[t]}
        # top-level scans: (op, input ids); gathers: (indices, table, gathered axes);
        # reduce_max/argmax: (input, reduced axes); dots of two tensors: (op, lhs, rhs,
        # result); reshapes: (operand, result, groups)
        self.scans, self.gathers, self.reductions, self.dots, self.reshapes = [], [], [], [], []
        self.relations: list[tuple[int, int]] = []  # (axis key in, axis key out) resized
        self.tables: list[tuple[int, int]] = []  # (indices' last axis, a table's rows)
        self.reshaped: dict[int, tuple[int, tuple]] = {}  # result -> (operand, groups)
        self.top_ks: list[tuple[int, list[int]]] = []  # (operand, results)
        self.rows: list[tuple[int, int, int]] = []  # (operand, axis, start) of 1-row slices
        self.row_of: dict[int, int] = {}  # a 1-row slice -> its operand
        self.grouped: list[tuple] = []  # (op, lhs, rhs, result, group sizes) of ragged dots
        self.convs: list[tuple[int, int, list[dict]]] = []  # (input, kernel, spatial dims)
        self.fused: list[tuple[int, int, dict]] = []  # (q, k, axes) of fused attention kernels
        self.windows: list[tuple[int, int, tuple]] = []  # (input, result, window) of pooling
        self.index_vectors: list[int] = []  # axis keys: a gather's or scatter's coordinates
        micro = {  # scans over microbatches: what they hold is as if at the top level
            op.name for op in ops if op.primitive == "scan"
            and any(int(x[1:]) in data for x in op.param("scanned_inputs", ()))
        }  # fmt: skip
        for op, (ins, outs) in zip(ops, io, strict=True):
            prim = op.primitive
            if prim in ATTENTION_FWD and len(ins) >= 3:
                self.fused.append((ins[0], ins[1], attention_axes(op.param("layout", 0))))
            elif prim == "scan" and not set(op.scope) - micro:
                self.scans.append((op, ins))
            elif prim in SCATTERS and len(ins) >= 3 and _coordinates(b, ins[1], op):
                self.index_vectors.append(b.key(ins[1], len(b.shapes[ins[1]]) - 1))
            elif prim == "gather" and len(ins) >= 2:
                self.gathers.append((ins[1], ins[0], op.param("gathered_axes", ())))
                idx = [a for a, n in enumerate(b.shapes[ins[1]]) if n > 1]
                if _coordinates(b, ins[1], op):  # a start per gathered axis (an embedding
                    # lookup under vmap: [token, 0]): the index vector, not positions
                    self.index_vectors.append(b.key(ins[1], idx[-1]))
                elif idx:  # a table's rows are the positions its indices range over
                    self.tables += [
                        (b.key(ins[1], idx[-1]), b.key(ins[0], a))
                        for a in op.param("gathered_axes", ())
                    ]  # fmt: skip
            elif prim in ("top_k", "approx_top_k") and ins:
                self.top_ks.append((ins[0], outs))
            elif prim in ("reduce_max", "argmax") and ins:
                self.reductions.append((ins[0], op.param("reduced_axes", ())))
            elif prim == "dot_general" and len(ins) == 2:
                self.dots.append((op, ins[0], ins[1], outs[0]))
            elif prim == "ragged_dot_general" and len(ins) == 3:
                self.grouped.append((op, ins[0], ins[1], outs[0], ins[2]))
            elif prim == "reshape" and ins:
                self.reshapes.append((ins[0], outs[0], op.param("groups", ())))
                self.reshaped[outs[0]] = (ins[0], op.param("groups", ()))
            elif prim == "conv_general_dilated" and len(ins) == 2:
                spatial = [dict(sp) for sp in op.param("spatial", ())]
                self.convs.append((ins[0], ins[1], spatial))
                self.relations += [  # a strided (or transposed) conv resizes its planes
                    (b.key(ins[0], sp["lhs"]), b.key(outs[0], sp["out"]))
                    for sp in spatial  # (a strided conv's kernel gradient dilates its rhs)
                    if sp["pairing"] == "window" and sp["rhs_dilation"] == 1
                    and sp["window"] < sp["lhs_size"]
                ]  # fmt: skip
            elif prim in WINDOW_OPS:  # pooling resizes its planes (and its gradient)
                if ins and outs:
                    self.windows.append((ins[0], outs[0], tuple(op.param("window", ()))))
                self.relations += [
                    (b.key(i, a), b.key(o, a))
                    for i in ins for o in outs if len(b.shapes[i]) == len(b.shapes[o])
                    for a, w in enumerate(op.param("window", ()))
                    if (w, op.param("strides")[a], op.param("padding")[a]) != (1, 1, (0, 0))
                ]  # fmt: skip
            elif prim in RELATION_OPS:  # the axes a slice, pad or concatenate resizes
                if prim == "slice" and len(ins) == 1:  # one row of an axis
                    cut = [a for a, (m, n) in enumerate(zip(b.shapes[ins[0]], b.shapes[outs[0]],
                                                            strict=True)) if m != n]  # fmt: skip
                    if len(cut) == 1 and b.shapes[outs[0]][cut[0]] == 1:
                        self.rows.append((ins[0], cut[0], op.param("start")[cut[0]]))
                        self.row_of[outs[0]] = ins[0]
                for i in ins[1:2] if prim == "dynamic_update_slice" else ins:
                    for o in outs:
                        if len(b.shapes[i]) == len(b.shapes[o]):
                            self.relations += [
                                (b.key(i, a), b.key(o, a))
                                for a, (m, n) in enumerate(zip(b.shapes[i], b.shapes[o], strict=True))
                                if m != n and m > 1 and n > 1
                            ]  # fmt: skip
        self.weights = [t for t in sorted(live) if b.roles[t] == "input" and t not in data]
        self.sizes = [n for shape in b.shapes for n in shape]  # per axis key
        self.tokens = self.derived_from(b, {t for t in self.ints if len(b.shapes[t]) >= 2})
        self.labels = (
            self.derived_from(b, {t for t in self.ints if len(b.shapes[t]) == 1}) - self.tokens
        )
        # dots whose result a softmax reads (through a scale, a mask)
        self.scores: set[str] = set()
        for t, _ in self.reductions:
            todo = [(t, 0)]
            while todo:
                x, depth = todo.pop()
                k = self.by_name.get(b.producer.get(x, ""))
                if k is None or depth > SOFTMAX_DEPTH:
                    continue
                if ops[k].primitive == "dot_general":
                    self.scores.add(ops[k].name)
                    continue
                todo += [(i, depth + 1) for i in io[k][0] if _alike(b.shapes[i], b.shapes[x])]
        self._sources: dict[int, int] = {}

    def derived_from(self, b: _Builder, start: set[int]) -> set[int]:
        """Integer values derived from ``start`` (token ids [batch, seq]: a vocabulary; labels
        [batch]: classes), within ``INT_DEPTH`` ops."""
        derived, frontier = set(start), set(start)
        for _ in range(INT_DEPTH):
            nxt = set()
            for t in frontier:
                for k in self.readers.get(t, ()):
                    for o in b.io[k][1]:
                        if o not in derived and ("int" in b.dtypes[o] or b.dtypes[o] == "bool"):
                            nxt.add(o)
            derived |= nxt
            frontier = nxt
            if not frontier:
                break
        return derived

    def source(self, b: _Builder, t: int) -> int:
        """Through casts, transposes, reshapes and size-1 axes added to the weight (or the
        data input)."""
        got = self._sources.get(t)
        if got is None:
            got = t
            for _ in range(8):
                k = self.by_name.get(b.producer.get(got, ""))
                ins = b.io[k][0] if k is not None else ()
                prim = b.ops[k].primitive if k is not None else ""
                if len(ins) != 1 or not (
                    prim in PASS_THROUGH
                    or prim == "broadcast_in_dim"
                    and _alike(b.shapes[ins[0]], b.shapes[got])
                ):
                    break
                got = ins[0]
            self._sources[t] = got
        return got

    def unpadded(self, b: _Builder, t: int) -> int:
        """Through pads and casts (which keep the axes in order) to what was padded."""
        for _ in range(8):
            k = self.by_name.get(b.producer.get(t, ""))
            if k is None or b.ops[k].primitive not in UNPAD or not b.io[k][0]:
                break
            t = b.io[k][0][0]
        return t


def microbatched(b: _Builder, data: set[int]) -> set[int]:
    """The body inputs of a top-level scan over pieces of the batch (gradient accumulation's
    microbatches: ``[B] -> [k, B/k]`` through a reshape and transposes, each iteration
    reading rows of every example): data as the inputs they are cut from, so the roles
    (``batch``, ``seq``, ``features``...) are found inside the scan as outside it. A scan over
    the positions (an RNN's) reads all the examples: none."""
    by_name = {op.name: k for k, op in enumerate(b.ops)}
    out = set()
    for op in b.ops:
        if op.primitive != "scan" or op.scope or op.param("length", 0) < 2:
            continue
        scanned = set(op.param("scanned_inputs", ()))
        for outer, body in op.param("body_inputs", ()):
            if body not in scanned:
                continue
            t, bt = int(outer[1:]), int(body[1:])
            src = t
            for _ in range(8):  # through the reshape and transposes that cut the batch
                k = by_name.get(b.producer.get(src, ""))
                ins = b.io[k][0] if k is not None else ()
                if len(ins) != 1 or b.ops[k].primitive not in PASS_THROUGH:
                    break
                src = ins[0]
            whole, piece = b.shapes[src], b.shapes[bt]
            if src in data and piece and whole[1:] == piece[1:]:
                if b.shapes[t][0] * piece[0] == whole[0]:
                    out.add(bt)
    return out


def program(b: _Builder, data: set[int], live: set[int]) -> _Program:
    """The builder's :class:`_Program` for these data and live tensors (made once)."""
    p = b.program
    if p is None or p.data is not data or p.live is not live:
        p = b.program = _Program(b, data, live)
    return p


def role_names(
    b: _Builder, root: list[int], fam: Callable[[int], int], data: set[int], live: set[int],
    taken: Callable[[int], bool], copies: int = 1,
) -> list[tuple[int, str]]:  # fmt: skip
    """``(class root, role name)`` in the order to claim them (the first claim of a root
    wins); roots for which ``taken`` is true are left out. ``copies``: how many copies of a
    layer the program unrolls."""
    out: list[tuple[int, str]] = []
    pg = program(b, data, live)
    offsets, shapes = b.offsets, b.shapes

    def r(t: int, a: int) -> int:
        return root[offsets[t] + a]

    def add(x: int, name: str) -> None:
        if x >= 0 and not taken(x):
            out.append((x, name))

    for t in sorted(data):
        if shapes[t]:
            add(r(t, 0), "batch")
    batch = {r(t, 0) for t in data if shapes[t]}
    for t, _, spatial in pg.convs:  # images: the planes a conv reads of a data input (through
        # a transpose, a reshape: a conv under vmap; a pad: ResNet-50's), and the other
        # axis (not the batch) its channels
        t = pg.unpadded(b, t)
        if pg.source(b, t) in data and 1 <= len(spatial) <= 3:
            planes = [sp["lhs"] for sp in spatial]
            for a, name in zip(planes, SPATIAL[len(planes) - 1], strict=True):
                add(r(t, a), name)
            for a in range(1, len(shapes[t])):
                if a not in planes:
                    add(r(t, a), "channels")
    seq_fams: list[int] = []  # token inputs of two sequences (an encoder's, a decoder's):
    for t in sorted(pg.ints):  # the second is named after its input (``targets_seq``)
        if len(shapes[t]) == 2 and r(t, 1) >= 0:
            f = fam(r(t, 1))
            add(
                r(t, 1),
                "seq" if not seq_fams or f in seq_fams else f"{path_name(b.paths[t] or '')}_seq",
            )
            seq_fams.append(f)
    rows: dict[int, set[int]] = {}  # an axis of a tensor of no example (BERT's head mask
    for t, a, start in pg.rows:  # [layers, heads]) the unrolled layers read a row each of
        if not any(r(t, c) in batch for c in range(len(shapes[t]))):
            rows.setdefault(r(t, a), set()).add(start)
    for x, starts in rows.items():
        if copies > 1 and len(starts) == copies == pg.sizes[x]:
            add(x, "layers")
    for op, ins in pg.scans:  # a scan over stacked weights: their leading axis is the layers
        n = op.param("length", 0)
        scanned = set(op.param("scanned_inputs", ()))
        for outer, body in op.param("body_inputs", ()):  # (scan_parts miscounts a literal
            if body in scanned and int(body[1:]) in data:  # carry) a scan over pieces of
                add(r(int(outer[1:]), 0), "microbatches")  # the batch: microbatches
        for t in ins:
            shape = shapes[t]
            if b.roles[t] == "input" and t not in data and shape and shape[0] == n > 1:
                add(r(t, 0), "layers")
        # a stack that shares one weight set (ALBERT; a fori_loop over layers): a scan over
        # nothing (xs=None, length=) or over weights only, carrying the examples. Its
        # iteration dim, the stacked outputs' leading axis (the residuals the backward pass
        # reads), is the layers (a scan over data, or over what data makes, is not)
        xs = [int(x[1:]) for x in scan_parts(op)[2]]
        if n < 2 or any(b.roles[t] != "input" or t in data for t in xs):
            continue
        carry = [int(x[1:]) for x in scan_parts(op)[1]]
        if any(r(t, a) in batch for t in carry for a in range(len(shapes[t]))):
            for o in b.io[pg.by_name[op.name]][1][op.param("num_carry", 0) :]:
                if shapes[o] and shapes[o][0] == n:
                    add(r(o, 0), "layers")
    data_fams = {fam(r(t, a)) for t in data for a in range(len(shapes[t])) if r(t, a) >= 0}
    carried: dict[int, int] = {}  # root -> how many weights carry it
    for t in pg.weights:
        for x in {r(t, a) for a in range(len(shapes[t]))}:
            if x >= 0:
                carried[x] = carried.get(x, 0) + 1

    d_model: list[int] = []
    for idx, table, axes in pg.gathers:
        if idx in pg.labels:
            for a in axes:
                add(r(table, a), "classes")
        if idx not in pg.tokens:
            continue
        for a in axes:
            add(r(table, a), "vocab")
        if len(shapes[table]) == 2 and len(axes) == 1:
            other = r(table, 1 - axes[0])
            if carried.get(other):
                d_model.append(other)

    # attention: dots of two activations (both carry the batch), one result softmaxed
    softmaxed: set[int] = set()
    for t, axes in pg.reductions:
        softmaxed |= {r(t, a) for a in axes}
    heads: list[int] = []
    head_dim: list[int] = []
    seqs: list[int] = []
    attention: list[int] = []  # the scores dots' results
    kv_groups: list[list[int]] = []  # [kv_heads, q_per_kv...] of grouped-query attention
    for op, lhs, rhs, res in pg.dots:
        if not any(r(lhs, a) in batch for a in range(len(shapes[lhs]))):
            continue
        if not any(r(rhs, a) in batch for a in range(len(shapes[rhs]))):
            continue
        bd = op.param("batch", ())
        if not bd or op.name not in pg.scores:
            continue
        attention.append(res)
        grouped = _grouped_queries(b, pg, r, op, lhs, rhs)
        for x, parts in grouped:  # the queries' heads split into kv_heads x q_per_kv
            if x not in heads:
                heads.append(x)
            kv_groups.append(parts)
        split = {x for _, parts in grouped for x in parts}
        for la, _ in bd:
            x = r(lhs, la)
            if x not in batch and fam(x) not in data_fams and x not in heads and x not in split:
                heads.append(x)
        for la, _ in op.param("contracting", ()):
            x = r(lhs, la)
            if x not in softmaxed and x not in head_dim:
                head_dim.append(x)
        known = batch | set(heads) | set(head_dim) | split
        seqs += [r(res, a) for a in range(len(shapes[res])) if r(res, a) not in known]
    kv_alone: list[int] = []  # a fused kernel's kv heads where fewer than the queries'
    for q, k, ax in pg.fused:  # fused attention (cuDNN's, splash): q [B, T, N, H], k [.., S, K, H]
        add(r(q, ax["b"]), "batch")  # (where no data input showed it: a step of its own)
        if r(q, ax["n"]) >= 0 and r(q, ax["n"]) not in heads:
            heads.append(r(q, ax["n"]))
        head_dim += [x for x in (r(q, ax["h"]), r(k, ax["h"])) if x >= 0 and x not in head_dim]
        seqs += [x for x in (r(q, ax["t"]), r(k, ax["t"])) if x >= 0 and x not in batch]
        if shapes[k][ax["n"]] != shapes[q][ax["n"]]:
            kv_alone.append(r(k, ax["n"]))
    probs: set[int] = set()  # the scores' softmax (and its gradient): ops of their shape on
    todo = [(t, 0) for t in attention]
    while todo:
        x, depth = todo.pop()
        if x in probs or depth > 2 * SOFTMAX_DEPTH:
            continue
        probs.add(x)
        for k in pg.readers.get(x, ()):
            todo += [(o, depth + 1) for o in b.io[k][1] if _alike(shapes[o], shapes[x])]
    scored = set(attention)
    for op, lhs, rhs, res in pg.dots:  # the values' head dim: the other side of probs x values
        if res in scored:
            continue
        ts = [lhs, rhs]
        cd = op.param("contracting", ())
        for side in (0, 1):
            p, v = ts[side], ts[1 - side]
            if p not in probs or not cd or not all(r(p, c[side]) in softmaxed for c in cd):
                continue
            used = {pair[1 - side] for pair in op.param("batch", ()) + cd}
            head_dim += [
                x for x in (r(v, a) for a in range(len(shapes[v])) if a not in used)
                if x not in batch and x not in head_dim and x not in heads
            ]  # fmt: skip
    for x in heads:
        add(x, "heads")
    for x in kv_alone:
        add(x, "kv_heads")
    for parts in kv_groups:
        add(parts[0], "kv_heads")
        for x in parts[1:]:
            add(x, "q_per_kv")
    for x in head_dim:
        add(x, "head_dim")
    for x in dict.fromkeys(seqs):  # the queries' and the keys' positions (patches, frames)
        add(x, "seq")
    routing = _routing(b, pg, r, batch, carried)
    if routing:  # a loop over as many experts as layers reads a row of each, as the layers do
        out[:] = [(x, n) for x, n in out if n != "layers" or x not in routing["experts"]]
    for name, xs in routing.items():
        for x in xs:
            add(x, name)
    if not d_model and heads and carried:
        most = max(carried.values())
        d_model = [x for x, n in carried.items() if n == most and n >= 3][:1]
    if not d_model:  # no embedding, no attention: a scanned stack's residual stream's features
        for op, _ in pg.scans:
            if op.param("length", 0) < 2:
                continue
            for name in scan_parts(op)[1]:
                t = int(name[1:])
                shape = shapes[t]
                x = r(t, len(shape) - 1) if len(shape) >= 2 else -1
                if r(t, 0) in batch and x >= 0 and x not in batch and x not in d_model:
                    d_model.append(x)
    for x in d_model:
        add(x, "d_model")
    merged = set()  # classes a reshape makes of heads or head_dim and others (heads*head_dim)
    for src, dst, groups in pg.reshapes:  # grouped-query attention: heads = kv_heads x
        for ga, gc in groups:  # queries per kv head
            for one, many, t1, tm in ((gc, ga, dst, src), (ga, gc, src, dst)):
                if len(one) != 1 or len(many) < 2:
                    continue
                parts = [r(tm, a) for a in many if shapes[tm][a] > 1]
                if set(parts) & set(heads + head_dim):
                    merged.add(r(t1, one[0]))
                if r(t1, one[0]) in heads and len(parts) > 1:
                    add(parts[0], "kv_heads")
                    for x in parts[1:]:
                        add(x, "q_per_kv")

    # an MLP's hidden dim: produced by a weight's matmul from d_model and contracted into
    # d_model, by two weights at least (one weight's backward matmul contracts what it made)
    made: dict[int, set[int]] = {}
    eaten: dict[int, set[int]] = {}
    makes: dict[int, set[int]] = {}  # any weight's matmul: the dims it makes, it contracts
    eats: dict[int, set[int]] = {}
    dm = set(d_model)
    experts = set(routing.get("experts", ()))
    weights = set(pg.weights)

    def expert_weight(t: int) -> int:  # the stacked experts' weight ``t`` is, or a row of
        s = pg.source(b, t)  # (``w_in[e]``), else -1
        s = pg.source(b, pg.row_of.get(s, s))
        return s if s in weights and any(r(s, a) in experts for a in range(len(shapes[s]))) else -1

    for op, lhs, rhs, _ in pg.dots + [g[:4] for g in pg.grouped]:  # (the forward's first)
        ts = [lhs, rhs]
        acts = [any(r(t, a) in batch for a in range(len(shapes[t]))) for t in ts]
        stacked = [expert_weight(t) for t in ts] if experts else [-1, -1]
        if acts.count(True) != 1 and stacked.count(-1) == 1:  # an expert's matmul of the
            acts = [s < 0 for s in stacked]  # tokens sorted by expert (no batch axis)
        if acts.count(True) != 1:
            continue
        side = acts.index(False)
        w = ts[side]
        src = pg.source(b, w) if stacked[side] < 0 else stacked[side]
        con = {c[side] for c in op.param("contracting", ())}
        free = {r(w, a) for a in range(len(shapes[w])) if a not in con}
        cdims = {r(w, a) for a in con}
        for x in sorted(free):
            makes.setdefault(x, set()).add(src)
        for x in cdims:
            eats.setdefault(x, set()).add(src)
        if cdims & dm:
            for x in free - dm:
                made.setdefault(x, set()).add(src)
        if free & dm:
            for x in cdims - dm:
                eaten.setdefault(x, set()).add(src)
    skip = set(heads) | set(head_dim) | merged

    def size(x: int) -> int:  # a class's axes are of one size: its root's
        return pg.sizes[x] if x >= 0 else 0

    least = min((size(x) for x in dm), default=0) // 4  # not a stacked q/k/v axis
    for x in sorted(made):  # two weights at least: in and out (and a gate), not copies of
        # one weight in every layer (a fused q/k/v projection makes and eats its own); a
        # weight's copies have its shape (a list's weights, params/0 and params/1, are two)
        kinds = {(_INDEX.sub("#", b.paths[w] or f"t{w}"), shapes[w])
                 for w in made[x] | eaten.get(x, set())}  # fmt: skip
        if x not in skip and x in eaten and len(kinds) >= 2 and size(x) > least:
            add(x, "d_ff")
    for t, w, spatial in pg.convs:  # a conv's feature axes, where its kernel is a weight:
        # the kernel's in and out features, and what is linked to them (BatchNorm's and
        # GroupNorm's scales, biases, residual adds); the input's where a group conv keeps
        # it apart from the kernel's (was each conv's or BatchNorm's weight: beta(64), conv2_block1_1_bn_beta)
        if pg.source(b, w) not in weights or not 1 <= len(spatial) <= 3:
            continue
        window = {sp["rhs"] for sp in spatial}
        for a in range(len(shapes[w])):
            if a not in window:
                add(r(w, a), "channels")
        planes = {sp["lhs"] for sp in spatial}
        other = [r(t, a) for a in range(len(shapes[t])) if a not in planes]
        if len(other) == 2 and sum(x in batch for x in other) == 1:
            add(next(x for x in other if x not in batch), "channels")
    if pg.convs and not dm:  # a weight's matmul of each position of a plane (ConvNeXt's
        # pointwise Dense over [batch, height, width, channels]) is a 1x1 conv: channels
        for _, lhs, rhs, _ in pg.dots:
            acts = [any(r(t, a) in batch for a in range(len(shapes[t]))) for t in (lhs, rhs)]
            if acts.count(True) != 1:
                continue
            act, w = (lhs, rhs) if acts[0] else (rhs, lhs)
            if len(shapes[act]) >= 3 and pg.source(b, w) in weights:
                for a in range(len(shapes[w])):
                    add(r(w, a), "channels")
    if not dm:  # no residual stream: a plain MLP (Mesh-TF's MNIST names io, hidden1,
        # hidden2), or a CNN's dense head (its channels are named above)
        named = {x for x, _ in out} | batch | skip
        for t in sorted(data - pg.ints):  # a float input's features a weight's matmul reads
            for a in range(1, len(shapes[t])):
                if r(t, a) in eats and r(t, a) not in named:
                    add(r(t, a), "features")
        for src, dst, groups in pg.reshapes:  # or its example flattened (an image's pixels,
            # eqx.nn.MLP's input: was ``layers``, the name of the list its weights are in),
            # or a conv's output flattened (its planes and channels: was ``linear1(256)``)
            for ga, gc in groups:
                if (len(gc) == 1 and len(ga) > 1 and 0 not in ga and r(dst, gc[0]) in eats
                        and r(dst, gc[0]) not in named
                        and (pg.convs or pg.source(b, src) in data - pg.ints)):  # fmt: skip
                    add(r(dst, gc[0]), "features")
        hidden = [x for x in makes if x in eats and x not in named  # the first made first
                  and any(w != v for w in makes[x] for v in eats[x])]  # fmt: skip
        for k, x in enumerate(hidden):  # made by one weight, read by another: hidden units
            add(x, "hidden" if k == 0 else f"hidden{k + 1}")
    for t in sorted(data - pg.ints):  # a float input [batch, positions, features] (embedded
        # tokens, frames, a time series; features a weight's matmul reads or d_model): its
        # positions are a sequence, as a token input's axis 1 is (a second: ``frames_seq``)
        if len(shapes[t]) != 3:
            continue
        x, f = r(t, 1), r(t, 2)
        if x < 0 or x == f or x in batch or x in eats or not (f in eats or f in dm):
            continue
        second = seq_fams and fam(x) not in seq_fams
        add(x, f"{path_name(b.paths[t] or '')}_seq" if second else "seq")
        seq_fams.append(fam(x))
    weights = set(pg.weights)
    for _, w, spatial in pg.convs:  # a conv's kernel window, where the kernel is a weight
        if pg.source(b, w) in weights and 1 <= len(spatial) <= 3:
            for sp, name in zip(spatial, SPATIAL[len(spatial) - 1], strict=True):
                add(r(w, sp["rhs"]), f"kernel_{name}")
    for t, o, window in pg.windows:  # a pooling window that reads the whole of a plane a
        # pad made of a 1x1 one (the backward of a 3x3 'same' pooling of 1x1 planes): its
        src = pg.unpadded(b, t)  # window (a conv's, where one has that size)
        spatial = [a for a, w in enumerate(window) if w > 1]
        if src != t and 1 <= len(spatial) <= 3:
            for a, name in zip(spatial, SPATIAL[len(spatial) - 1], strict=True):
                if shapes[src][a] == 1 and shapes[o][a] == 1 and shapes[t][a] == window[a]:
                    add(r(t, a), f"kernel_{name}")
    for k in pg.index_vectors:  # the coordinates of a gather or scatter: never split (XLA
        add(root[k], "index")  # reads the whole vector per start), named for what it is
    return out


def _coordinates(b, indices: int, op) -> bool:
    """Whether the last axis of a gather's or scatter's ``indices`` holds several
    coordinates (a start per gathered axis), not one position per lookup."""
    shape = b.shapes[indices]
    axes = op.param("gathered_axes", None) or op.param("scattered_axes", ())
    return bool(shape) and shape[-1] > 1 and shape[-1] == len(axes)


def _routing(b, pg, r, batch: set[int], carried: dict[int, int]) -> dict[str, list[int]]:
    """A mixture of experts from its routing pattern: a top-k over a router's logits (their
    last axis a weight's: the router's) whose size is a batch dim of weights' dots with the
    activations (the stacked experts' weights ``[experts, d_model, d_ff]``), the groups of a
    grouped matmul (tokens sorted by expert: ``lax.ragged_dot``), or the axis of a stacked
    weight a loop reads every row of: ``experts`` on both sides (one dim: no tensor holds
    both), ``top_k`` the choices per token, and ``capacity`` the activations' other dims of
    the dots (each expert's slots; sorted tokens' rows are ``batch*seq*top_k``)."""
    out: dict[str, list[int]] = {"experts": [], "capacity": [], "top_k": []}
    shapes = b.shapes
    routers: dict[int, list[int]] = {}  # experts -> the routers' logits' last axes
    for t, outs in pg.top_ks:  # (values and indices)
        x = r(t, len(shapes[t]) - 1) if shapes[t] else -1
        if carried.get(x):
            routers.setdefault(shapes[t][-1], []).append(x)
            out["top_k"] += [
                r(o, len(shapes[t]) - 1)
                for o in outs
                if shapes[o] and len(shapes[o]) == len(shapes[t])
            ]
    if not routers:
        return {}
    for op, lhs, rhs, _ in pg.dots:
        ts = (lhs, rhs)
        acts = [any(r(t, a) in batch for a in range(len(shapes[t]))) for t in ts]
        if acts.count(True) != 1:
            continue
        w = acts.index(False)
        for pair in op.param("batch", ()):
            n = shapes[ts[w]][pair[w]]
            if n not in routers:
                continue
            used = {p[1 - w] for p in op.param("batch", ()) + op.param("contracting", ())}
            act = ts[1 - w]
            slots = [r(act, a) for a in range(len(shapes[act])) if a not in used]
            out["experts"] += [*routers[n], r(ts[w], pair[w])]
            out["capacity"] += [y for y in slots if y not in batch]
    for _, _, _, _, gs in pg.grouped:  # tokens sorted by expert: a grouped matmul's groups
        n = shapes[gs][-1] if shapes[gs] else 0  # (lax.ragged_dot's group sizes, linked to
        if n in routers:  # the stacked weights' leading axis)
            out["experts"] += [*routers[n], r(gs, len(shapes[gs]) - 1)]
    weights = set(pg.weights)
    read: dict[tuple[int, int], set[int]] = {}  # or a loop over the experts: every row of a
    for t, a, start in pg.rows:  # stacked weight read once (``w_in[e]``)
        if pg.source(b, t) in weights and shapes[t][a] in routers:
            read.setdefault((r(t, a), shapes[t][a]), set()).add(start)
    for (x, n), starts in read.items():
        if len(starts) == n:
            out["experts"] += [*routers[n], x]
    if not out["experts"]:  # a top-k that routes to no experts (a sampler's)
        return {}
    return {name: list(dict.fromkeys(xs)) for name, xs in out.items()}


def _grouped_queries(b, pg, r, op, lhs, rhs) -> list[tuple[int, list[int]]]:
    """Grouped-query attention written as one reshape of the queries' heads into
    ``[kv_heads, q_per_kv]`` (the scores dot batches the first and keeps the other): ``(heads,
    [kv_heads, q_per_kv])`` of each such split an operand of the scores dot ``op`` is made
    by."""
    out = []
    bd, cd = op.param("batch", ()), op.param("contracting", ())
    for side, t in enumerate((lhs, rhs)):
        made = pg.reshaped.get(t)
        if made is None:
            continue
        batched = {pair[side] for pair in bd}
        free = set(range(len(b.shapes[t]))) - batched - {pair[side] for pair in cd}
        for ga, gc in made[1]:
            parts = [a for a in gc if b.shapes[t][a] > 1]
            if len(ga) == 1 and len(parts) > 1 and parts[0] in batched and set(parts[1:]) <= free:
                out.append((r(made[0], ga[0]), [r(t, a) for a in parts]))
    return out


def weight_kinds(b: _Builder, pg: _Program, inputs) -> dict[int, str]:
    """Each input's module kind (:func:`module_kind`) where an op that reads it, or a cast or
    view of it, is in a module's ``jax.named_scope`` (Equinox's ``eqx.nn.Linear``)."""
    out = {}
    for t in inputs:
        front = [t]
        for _ in range(4):
            ks = [k for x in front for k in pg.readers.get(x, ())]
            kind = next((m for k in ks if (m := module_kind(b.ops[k].name_stack))), None)
            if kind is not None:
                out[t] = kind
                break
            front = [o for k in ks if b.ops[k].primitive in PASS_THROUGH for o in b.io[k][1]]
    return out


def resized_name(name: str, n: int, m: int) -> str:
    """The name of a piece of size ``m`` of the dim ``name`` of size ``n`` (a slice, a split,
    a pad or a concatenate between them): ``head_dim_half`` (RoPE's halves), ``height_4th``
    (a conv of stride 4; ResNet-50's last planes ``height_32nd``), ``seq-1`` (the
    shifted targets; most of a dim, a valid conv's ``height-3``), ``seq_3_64ths`` (at most
    half of it, the fraction it is: BigBird's band of 3 of 64 blocks, was ``seq-3904``),
    ``seq+48`` (a table of every position sliced to the sequence); the rows of a table that
    ``name`` indexes, of its size, are ``seq_table``."""

    def ordinal(k: int) -> str:
        return "th" if k % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")

    if m < n:
        k = n // m
        if n % m:
            if n - m < m:
                return f"{name}-{n - m}"
            g = math.gcd(n, m)
            return f"{name}_{m // g}_{n // g}{ordinal(n // g)}s"
        return f"{name}_half" if k == 2 else f"{name}_{k}{ordinal(k)}"
    return f"{name}+{m - n}" if m > n else f"{name}_table"


_INSTANCE = re.compile(r"(.+?)_(\d+)")  # a module instance's automatic name: Dense_0
_PARTS = re.compile(r"[/.\[\]]")


def instance_free(paths) -> dict[str, str]:
    """Each path with the index of a repeated module's instance dropped: a component
    ``X_k`` (Flax's and Keras's automatic names, ``MixerBlock_0``, ``batch_normalization_100``)
    where the paths hold ``X_j`` of another ``j`` with the same components around it. A dim
    every block of a stack shares was named by block 0's weight (``MixerBlock_0_Dense_0``):
    now ``MixerBlock_Dense`` (each block's ``Dense_0`` ... ``Dense_3`` repeat too); a name
    shared at several sizes reads ``beta(256)``. The components around are compared without
    their own instance indices (ConvNeXt's ``block_1/conv_1`` repeats ``block_0/conv_0``)."""
    split = {p: [c for c in _PARTS.split(p) if c] for p in paths if p}
    # the components around an instance, each without its own instance index: ConvNeXt's
    # downsampling_block_1/downsampling_conv_1 is a second of block_0/conv_0
    stems = {p: [m[1] if (m := _INSTANCE.fullmatch(c)) else c for c in cs]
             for p, cs in split.items()}  # fmt: skip
    seen: dict[tuple, set[str]] = {}
    for p, cs in split.items():
        st = stems[p]
        for i, c in enumerate(cs):
            m = _INSTANCE.fullmatch(c)
            if m:
                seen.setdefault((tuple(st[:i]), m[1], tuple(st[i + 1 :])), set()).add(m[2])
    out = {}
    for p, cs in split.items():
        st, kept = stems[p], []
        for i, c in enumerate(cs):
            m = _INSTANCE.fullmatch(c)
            many = m is not None and len(seen[(tuple(st[:i]), m[1], tuple(st[i + 1 :]))]) > 1
            kept.append(m[1] if many else c)
        out[p] = "/".join(kept)
    return out


def path_name(path: str, kind: str | None = None) -> str:
    """A weight's path without its argument, layer indices and generic leaf names:
    ``params/model/layers/17/mlp/down_proj/kernel`` -> ``down_proj``. A path that names only
    a container of modules (a list's or ``eqx.nn.Sequential``'s attribute: ``layers/4/weight``;
    linen ``nn.Sequential``'s ``layers_0``) is named by its module's ``kind``
    (:func:`module_kind`: ``Linear``) where given, never ``layers`` (the stacked layers'
    role)."""
    return path_names(path, kind)[0]


_RESERVED = re.compile(r"layers(?:_\d+)?", re.IGNORECASE)  # the stacked layers' role's name


def module_kind(name_stack: str) -> str | None:
    """The module an op's ``jax.named_scope`` names, without its package and instance
    index (Equinox's ``eqx.nn.Linear`` -> ``Linear``), or None (a layer's index: ``layers.3``)."""
    last = (name_stack or "").rsplit("/", 1)[-1].rsplit(".", 1)[-1]
    m = _INSTANCE.fullmatch(last)
    last = m[1] if m else last
    if not re.fullmatch(r"[A-Za-z_][A-Za-z_]*", last) or _RESERVED.fullmatch(last):
        return None
    return last


def path_names(path: str, kind: str | None = None) -> list[str]:
    """:func:`path_name`, then with its module's name before it, where another dim has it:
    ``params/batch_normalization_1/beta`` -> ``beta``, ``batch_normalization_1_beta``."""
    parts = [p for p in re.split(r"[/.\[\]]", path) if p]
    keep = [p for p in parts[1:] if not p.isdigit() and p.lower() not in GENERIC_LEAVES]
    if not keep and parts and parts[-1].isdigit():  # a list's or a tuple's leaf (params/0,
        # batch/1): never a bare number; its argument and its place in it (params_1), the
        # layer indices between dropped (params/3/0 is params_0, as params/0/0 is)
        return [f"{next((p for p in parts if not p.isdigit()), 't')}_{parts[-1]}"]
    # a container of modules: a part followed by an index (layers/4), or the stacked
    # layers' name (linen nn.Sequential's layers_0); what follows the last one names it
    last = max((i for i, p in enumerate(parts) if i >= 1 and not p.isdigit()
                and (_RESERVED.fullmatch(p) or i + 1 < len(parts) and parts[i + 1].isdigit())),
               default=0)  # fmt: skip
    after = [p for p in parts[last + 1 :] if not p.isdigit() and p.lower() not in GENERIC_LEAVES]
    if keep and last and not after:  # only a container's name: the module's kind, else the
        # list's own name (convs), else the leaf's (weight), never layers (was layers(64))
        leaf = parts[-1] if not parts[-1].isdigit() else None
        own = [p for p in keep if not _RESERVED.fullmatch(p)]
        return [kind or leaf or (own[-1] if own else parts[0])]
    keep = keep or parts or ["t"]
    return [keep[-1]] + (["_".join(keep[-2:])] if len(keep) > 1 else [])
