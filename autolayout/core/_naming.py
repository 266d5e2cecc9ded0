"""Naming dims: dead code removed first (as XLA drops it), then two union-finds over
(tensor, axis): families (every link unites) and dims (a link unites only where the class
would still hold at most one axis of a tensor and one user name). The names read the
families with the parts of like reshapes united (:func:`_index_spaces`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ._builder import _Builder
from ._dim_rules import reshape_groups
from ._ir import LOOP_OPS, Dim, Loop, base_name, sized_name
from ._roles import (
    copy_groups,
    instance_free,
    microbatched,
    path_names,
    program,
    resized_name,
    role_names,
    weight_kinds,
)

WINDOWS = "kernel_"  # roles named with their size where they have several (a conv's window)
SIZED_ROLES = ("batch", "channels")  # and these (a microbatch's rows, a conv's features)

# --- dead code -------------------------------------------------------------------------------


def _eliminate_dead(b: _Builder, outs: list[int]) -> set[int]:
    """Drops ops whose results nothing reads (XLA would too: jax leaves dead zeros of the
    backward pass in the jaxpr), collects the live ops' links in program order (a loop op
    opens before its body) into ``b.links``, their input and output ids into ``b.io`` and
    returns the live tensor ids."""
    live = set(outs)
    kept: list[int] = []  # op positions, last first
    int_io = b.int_io
    for i in range(len(b.ops) - 1, -1, -1):
        _, ins, res = int_io[i]
        for o in res:
            if o in live:
                break
        else:
            continue
        kept.append(i)
        live.update(res)  # a live op makes all its results (split, loops)
        op = b.ops[i]
        if op.primitive in LOOP_OPS:
            aliased = {int(t[1:]) for t in op.param("aliased_inputs", ())}  # live if read
            live.update(t for t in ins if t is not None and t not in aliased)
            live.update(int(t[1:]) for t in op.param("body_outputs", ()))
        else:
            live.update(t for t in ins if t is not None)
    kept.reverse()
    ops = [b.ops[i] for i in kept]
    io = [([t for t in b.int_io[i][1] if t is not None], list(b.int_io[i][2])) for i in kept]
    for k, op in enumerate(ops):  # a loop's constants its body never reads are not its inputs
        if op.primitive not in LOOP_OPS:
            continue
        aliased = op.param("aliased_inputs", ())
        if any(int(t[1:]) not in live for t in aliased):
            inputs = tuple(t for t in op.inputs if int(t[1:]) in live)
            ops[k] = dataclasses.replace(op, inputs=inputs)
            io[k] = ([int(t[1:]) for t in inputs], io[k][1])
    b.ops = ops
    b.io = io
    names = {op.name for op in ops}
    b.loops = [
        Loop(lp.name, lp.kind, lp.length, tuple(n for n in lp.ops if n in names), lp.length_known)
        for lp in b.loops
        if lp.name in names
    ]
    b.links = links = []
    offsets, int_links = b.offsets, b.int_links
    for number in sorted([int_io[i][0] for i in kept]):  # opened first
        for group in int_links[number]:
            t0, a0 = group[0]
            k0 = offsets[t0] + a0
            for k in range(1, len(group)):
                t, a = group[k]
                links.append((k0, offsets[t] + a))
    links += _transposed_reshapes(b)
    return live


def _transposed_reshapes(b: _Builder) -> list[tuple[int, int]]:
    """The axes a reshape with a transposition (``lax.reshape(x, shape, dimensions)``: a
    depthwise conv's kernel gradient) keeps whole, linked for naming only: the op keeps
    every axis whole, as no split passes through it."""
    out = []
    for op, (ins, outs) in zip(b.ops, b.io, strict=True):
        perm = op.param("dimensions", ()) if op.primitive == "reshape" else ()
        if perm and ins:
            src = b.shapes[ins[0]]
            for ga, gc in reshape_groups(tuple(src[d] for d in perm), b.shapes[outs[0]]):
                if len(ga) == 1 and len(gc) == 1:
                    out.append((b.key(ins[0], perm[ga[0]]), b.key(outs[0], gc[0])))
    return out


# --- naming -----------------------------------------------------------------------------------


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        p = self.parent
        root = x
        while p[root] != root:
            root = p[root]
        while p[x] != root:
            p[x], x = root, p[x]
        return root


def _families(b: _Builder) -> _UnionFind:
    uf = _UnionFind(b.nax)
    find, parent = uf.find, uf.parent
    for x, y in b.links:
        rx, ry = find(x), find(y)
        if rx != ry:
            parent[rx] = ry
    return uf


def user_labels(b: _Builder, live: set[int]) -> dict[tuple[str, int], str]:
    """Each (user name, size) of the live tensors' axes, labelled: the name where the name
    has one size, ``name(size)`` where it has several (Mesh-TF's ``mtf.Dimension``: a name
    and a size). A name written with its size (``kd(3)``) is that name of that size."""
    sizes: dict[str, set[int]] = {}
    for t, dims in b.user.items():
        if t in live:
            for name, n in zip(dims, b.shapes[t], strict=True):
                if name is not None and n > 1:
                    sizes.setdefault(base_name(name), set()).add(n)
    return {
        (name, n): name if len(ns) == 1 else sized_name(name, n)
        for name, ns in sizes.items()
        for n in ns
    }


def _index_spaces(b: _Builder, pg, fam: _UnionFind) -> _UnionFind:
    """The families, with the parts of reshapes that split one family's axes into the same
    sizes united, part by part: each is the same index space (BigBird's query and key blocks
    are both ``seq`` split into blocks of 4; their positions in a block never link, as a
    reshape links no part)."""
    uf = _UnionFind(b.nax)
    uf.parent = list(fam.parent)
    find, parent = uf.find, uf.parent
    first: dict[tuple, list[int]] = {}
    for src, dst, gs in pg.reshapes:
        for ga, gc in gs:
            for one, many, t1, tm in ((gc, ga, dst, src), (ga, gc, src, dst)):
                if len(one) == 1 and len(many) > 1:
                    key = (fam.find(b.key(t1, one[0])), tuple(b.shapes[tm][a] for a in many))
                    parts = [b.key(tm, a) for a in many]
                    for x, y in zip(first.setdefault(key, parts), parts, strict=True):
                        rx, ry = find(x), find(y)
                        if rx != ry:
                            parent[rx] = ry
    return uf


def _dims(
    b: _Builder,
    owner: list[int],
    sizes: list[int],
    fam: _UnionFind,
    live: set[int],
    keys: list[int],
) -> tuple[_UnionFind, dict[int, str], Callable[[int, int], bool], Callable[[int, int], bool], int]:
    """Union-find that keeps one axis per tensor and one user name per class; returns it,
    the user name of each named root, its guarded union, whether no tensor holds two
    classes together, and how many copies of a layer the inputs show (1 where the user named
    them). ``keys``: the live axes of size > 1, in order."""
    uf = _UnionFind(b.nax)
    parent = uf.parent
    members: dict[int, set[int]] = {}
    names: dict[int, str] = {}

    find = uf.find

    def union(x: int, y: int) -> bool:
        rx, ry = find(x), find(y)
        return rx == ry or join(rx, ry)

    def join(rx: int, ry: int) -> bool:  # two roots
        nx, ny = names.get(rx), names.get(ry)
        if nx is not None and ny is not None and nx != ny:
            return False
        sx = members.get(rx) or {owner[rx]}
        sy = members.get(ry) or {owner[ry]}
        if len(sx) > len(sy):
            rx, ry, sx, sy, nx, ny = ry, rx, sy, sx, ny, nx
        if not sx.isdisjoint(sy):
            return False
        parent[rx] = ry
        sy |= sx
        members[ry] = sy
        members.pop(rx, None)
        if ny is None and nx is not None:
            names[ry] = nx
        names.pop(rx, None)
        return True

    # Mesh-TF: a dim is a name and a size. ``kd`` on 3x3x3 and 2x2x2 kernels is two dims,
    # labelled ``kd(3)`` and ``kd(2)``; a name of one size keeps its name.
    labels = user_labels(b, live)
    first_of: dict[tuple[str, int], int] = {}
    for t in sorted(b.user):  # inputs first, then intermediates named with al.name_dims
        if t not in live:
            continue
        for axis, name in enumerate(b.user[t]):
            if name is None or b.shapes[t][axis] <= 1:
                continue
            k = b.key(t, axis)
            key = (base_name(name), sizes[k])
            if key in first_of:
                union(first_of[key], k)
            else:
                first_of[key] = k
                names[k] = labels[key]
    for x, y in b.links:
        if sizes[x] > 1:
            rx, ry = find(x), find(y)
            if rx != ry:
                join(rx, ry)
    # The same place in every copy of a layer is one dim: the d_ff of layer 17 is layer 0's
    # (where the user named every input axis, the names already say so)
    unnamed = any(
        b.shapes[t][a] > 1 and find(b.key(t, a)) not in names
        for t in live if b.roles[t] == "input" for a in range(len(b.shapes[t]))
    )  # fmt: skip
    groups = copy_groups(b, live) if unnamed else []
    for group in groups:
        for k in group[1:]:
            union(group[0], k)
    counts = [len(g) for g in groups]
    copies = max(set(counts), key=counts.count) if counts else 1  # the unrolled layers
    # Classes of one family that no tensor holds together are one dim: the key sequence of
    # every unrolled layer is one "seq#2", not a dim per layer.
    by_family: dict[int, list[int]] = {}
    for k in keys:
        if find(k) == k:
            by_family.setdefault(fam.find(k), []).append(k)
    for roots in by_family.values():
        reps: list[int] = []
        for r in roots:
            if not any(union(q, r) for q in reps):
                reps.append(r)

    def apart(x: int, y: int) -> bool:  # whether no tensor holds the two classes together
        rx, ry = find(x), find(y)
        return rx == ry or (members.get(rx) or {owner[rx]}).isdisjoint(
            members.get(ry) or {owner[ry]}
        )

    return uf, names, union, apart, copies


def _claim(label: dict[int, str], taken: dict[str, int], r: int, name: str) -> None:
    """Names root ``r`` ``name``, or ``name#2``, ``name#3``... where that is taken."""
    base, k = name, 2
    while name in taken:
        name, k = f"{base}#{k}", k + 1
    label[r] = name
    taken[name] = r


def _labels(b, inputs, live, data, root, fam, user_names, find, apart, copies):
    """Names from the user, by role, of reshapes' merges and splits, of resized pieces and of
    weights' paths: ``(label per root, the names taken, the roots of each role name)``."""
    label: dict[int, str] = {}
    taken: dict[str, int] = {}  # name -> the root that took it
    by_role: dict[str, list[int]] = {}
    pg = program(b, data, live)
    sizes = pg.sizes

    def claim(r: int, name: str, role: bool = False) -> None:
        _claim(label, taken, r, name)
        if role:
            by_role.setdefault(name, []).append(r)

    def free(name: str, r: int) -> bool:
        """Whether ``r`` may be named ``name``: no other family has it (``name#k`` is a dim of
        ``name``'s family), or at ``r``'s size where no tensor holds both (one dim)."""
        q = taken.get(name, r)
        return fam.find(q) == fam.find(r) or sizes[q] == sizes[r] and apart(q, r)

    sized: set[str] = set()  # names taken at several sizes

    def sized_claim(r: int, names: list[str], only_free: bool = False) -> bool:
        """Names ``r`` the first of ``names`` that another dim has at another size, with
        ``r``'s size (Mesh-TF: a dim is a name and a size): ``kernel_height(3)`` beside a
        7x7 stem's, ``convolution(512)`` beside another stage's ``convolution``;
        ``only_free``: where that sized name is free (not ``#k`` of another family's)."""
        for n in names:
            q = taken.get(n)
            if (q is not None and sizes[q] != sizes[r]
                    and (not only_free or free(sized_name(n, sizes[r]), r))):  # fmt: skip
                claim(r, sized_name(n, sizes[r]), True)  # (``#k`` where another family has it)
                sized.add(n)
                return True
        return False

    users: dict[int, str] = {}  # family -> the user's name of a dim of it
    for r, n in user_names.items():
        if find(r) == r:
            claim(r, n)
            users.setdefault(fam.find(r), base_of(n))
    for r, n in role_names(b, root, fam.find, data, live, lambda r: r in label, copies):
        n = users.get(fam.find(r), n)  # a family the user named is named after the user's
        # name (the keys of enc_seq are enc_seq#2); a role another family of another size
        # has is left to the structure (the decoder's positions: a slice of targets_seq)
        if r in label:
            continue
        if n == "channels" and fam.find(r) not in users and n in users.values():
            continue  # the user's own ``channels``, not renamed for another conv's of another size
        if free(n, r):
            claim(r, n, True)
        elif n.startswith(WINDOWS) or n in SIZED_ROLES:  # a kernel's window of another size,
            # a microbatch's rows (``batch(8)`` of ``batch(16)``), another conv's channels
            if not sized_claim(r, [n]) and n == "channels":  # (``channels(64)``); a conv's
                claim(r, n, True)  # in and out of one size: ``channels(64)#2``
    origin: dict[int, tuple[str, int]] = {}
    _grow(b, pg, root, label, claim, origin, False, free)  # from the user's and the roles' names
    plain = instance_free([b.paths[t] for t in inputs])  # MixerBlock_0/Dense_0 -> MixerBlock/..
    # what each matrix or kernel that carries a dim as its last axis, or the one before,
    # would name it: MobileNet's 128 channels between pointwise convs of one width
    carried: dict[int, list[str]] = {}
    kinds = weight_kinds(b, pg, inputs)  # (Linear: a container's weight, layers/4/weight)
    for t in inputs:
        axes = [r for a in range(len(b.shapes[t])) if (r := root[b.key(t, a)]) >= 0]
        if len(axes) < 2:
            continue
        ns = path_names(plain.get(b.paths[t] or "", ""), kinds.get(t))[:1]
        for k, r in enumerate(reversed(axes[-2:])):
            carried.setdefault(r, []).extend(n if k == 0 else f"{n}_in" for n in ns)
    for t in inputs:  # a weight's axes no role names: the last its name (an output's
        # features: ``w1``, ``router``), the one before ``_in``, others by their axis
        axes = [(a, root[b.key(t, a)]) for a in range(len(b.shapes[t]))]
        axes = [(a, r) for a, r in axes if r >= 0 and r not in label]
        names = path_names(plain.get(b.paths[t] or "", ""), kinds.get(t))
        # the instance's own (batch_normalization_74_beta) where the plain name, and that at
        # its size, are another family's
        own = [n for n in path_names(b.paths[t] or "", kinds.get(t)) if n not in names]
        for k, (a, r) in enumerate(reversed(axes)):
            if r not in label:  # one name and size of every weight is one dim; the weight's
                # module's where another family has it (BatchNorm's beta of two widths)
                tries, mine = (
                    [n if k == 0 else f"{n}_in" if k == 1 else f"{n}_ax{a}" for n in ns]
                    for ns in (names, own)
                )
                got = next((n for n in tries if free(n, r)), None)
                if got is not None:
                    claim(r, got, True)
                elif sized_claim(r, tries, only_free=True):
                    pass
                elif mine and (got := next((n for n in carried.get(r, ()) if free(n, r)), None)):
                    claim(r, got, True)  # another weight's name for it, not the instance's
                    # own (conv_pw, not conv_dw_11 where conv_dw(128) is another family's)
                elif mine and sized_claim(r, carried.get(r, []), only_free=True):
                    pass
                elif (got := next((n for n in mine if free(n, r)), None)) is not None:
                    claim(r, got, True)
                elif not sized_claim(r, tries + mine):
                    claim(r, tries[0], True)
    _grow(b, pg, root, label, claim, origin, True, free)
    for n in sized:  # the name's other dims named with their sizes too (``n``, ``n#2``)
        for old in [m for m in taken if base_of(m) == n]:
            q = taken.pop(old)
            _claim(label, taken, q, sized_name(n, sizes[q]))
            by_role.setdefault(label[q], []).extend(by_role.pop(old, []))
    return label, taken, by_role


SPLIT_PARTS = ("outer", "mid", "inner")


def _grow(b, pg, root, label, claim, origin, wider: bool, free=None) -> None:
    """Names what a named dim's structure shows, until nothing more is named: the dim a
    reshape merges named dims into (``heads*head_dim``), the parts a reshape splits a named
    dim into (``X_outer``, ``X_inner``) and a piece of a named dim that a slice, pad,
    concatenate or pooling resized (in either direction), named after the dim it was
    resized from first (``height_4th``, not ``height_half_half``; a piece back at that
    dim's size is that dim: RoPE's interleaved halves make ``head_dim`` again), or where
    ``free`` says that name is another family's dim that a tensor holds with it, after the
    dim it was cut from (BigBird's band of key blocks, ``seq_outer_half``). Every such
    name of one size is one dim: RoPE's halves of every unrolled layer are one
    ``head_dim_half``. Only pieces of a dim, and the dim they make again, unless ``wider``
    (a table of 64 positions, ``seq+48``; a fused projection's three heads*head_dim)."""
    sizes = pg.sizes

    relations = [(x, y, True) for x, y in pg.relations]
    relations += [(x, y, False) for x, y in pg.tables] if wider else []

    def resized() -> bool:
        grown = False
        for x, y, both in relations:  # (a table's rows from its indices, not the reverse)
            rx, ry = root[x], root[y]
            for r, q in ((ry, rx), (rx, ry)) if both else ((ry, rx),):
                if r >= 0 and q in label and r not in label:
                    own = (base_of(label[q]), sizes[q])
                    name, n = origin.get(q) or own
                    if sizes[r] > sizes[q] and sizes[r] != n and not wider:
                        continue
                    if sizes[r] < sizes[q] < n and n % sizes[r] and not n % sizes[q]:
                        name, n = own  # an uneven piece of an even part, after the part
                        # (BigBird's middle blocks: seq_outer-2 of 64 blocks, not seq-4034)
                    got = name if n == sizes[r] else resized_name(name, n, sizes[r])
                    if free is not None and own != (name, n) and not free(got, r):
                        # another family's dim that a tensor holds with it: named after the
                        # dim it was cut from (BigBird's band of 4 of 8 key blocks is
                        # seq_outer_half, as seq_8th, 32 positions' 4, is a block's positions)
                        name, n = own
                        got = name if n == sizes[r] else resized_name(name, n, sizes[r])
                    claim(r, got, True)
                    origin[r] = (name, n)
                    grown = True
        return grown

    def groups():  # (the one axis' root, the many axes' roots) of each merge or split
        for src, dst, gs in pg.reshapes:
            for ga, gc in gs:
                for one, many, t1, tm in ((gc, ga, dst, src), (ga, gc, src, dst)):
                    if len(one) == 1 and len(many) > 1:
                        yield root[b.key(t1, one[0])], [root[b.key(tm, a)] for a in many]

    def reshaped(split: bool) -> bool:
        grown = False
        shown = [  # a dim and its parts where a reshape shows them named: the backward's
            # splits are the forward's merges (and grouped queries' heads merge back)
            (base_of(label[r]), tuple((base_of(label[x]), sizes[x]) for x in rs))
            for r, rs in groups() if r in label and all(x in label for x in rs)
        ]  # fmt: skip
        known = {(name, tuple(n for _, n in parts)): [p for p, _ in parts] for name, parts in shown}
        whole = {parts: name for name, parts in shown}
        for r, rs in groups():
            if not split and r >= 0 and r not in label and all(x in label for x in rs):
                parts = tuple((base_of(label[x]), sizes[x]) for x in rs)
                claim(r, whole.get(parts) or "*".join(name for name, _ in parts), True)
                grown = True
            elif split and r in label and not all(x in label for x in rs):
                name = base_of(label[r])
                names = known.get((name, tuple(sizes[x] for x in rs)))
                for k, x in enumerate(rs):
                    if x >= 0 and x not in label:
                        pos = 0 if k == 0 else 2 if k == len(rs) - 1 else 1
                        claim(x, names[k] if names else f"{name}_{SPLIT_PARTS[pos]}", True)
                        origin[x] = origin.get(r) or (name, sizes[r])
                        grown = True
        return grown

    for _ in range(8):  # a split's parts last: the patches a conv made are height_8th
        if not (resized() | reshaped(False) or reshaped(True)):
            break


def base_of(name: str) -> str:
    """A label without the ``#k`` :func:`_claim` added (``head_dim#2`` -> ``head_dim``)."""
    return name.split("#", 1)[0] if "#" in name else name


def _name_dims(
    b: _Builder, inputs: list[int], live: set[int], data: set[int] = frozenset()
) -> tuple[list[str | None], dict[str, Dim]]:
    """Each axis key's dim name and the dims: the user's names first, then names by role
    (``_roles``) for the data inputs ``data`` and what the program's structure shows, then
    reshapes' merges of named dims, weights' paths, a named dim's family, the producing op."""
    data = data | microbatched(b, data)  # (a microbatch's rows are examples too)
    owner = [t for t, s in enumerate(b.shapes) for _ in s]
    sizes = [s for shape in b.shapes for s in shape]
    keys = [k for k, (t, n) in enumerate(zip(owner, sizes, strict=True)) if n > 1 and t in live]
    fam = _families(b)
    dim, user_names, union, apart, copies = _dims(b, owner, sizes, fam, live, keys)
    fam = _index_spaces(b, program(b, data, live), fam)  # (naming only: the dims are made)
    for _ in range(3):  # dims of one role that no tensor holds together are one dim
        root = [-1] * b.nax
        for k in keys:
            root[k] = dim.find(k)
        label, taken, by_role = _labels(
            b, inputs, live, data, root, fam, user_names, dim.find, apart, copies
        )
        merged = False
        for rs in by_role.values():  # each onto the first it may join (a key sequence's
            reps: list[int] = []  # pieces onto the queries', else onto one another)
            for r in rs:
                for q in reps:
                    if sizes[r] == sizes[q] and dim.find(r) != dim.find(q) and union(q, r):
                        merged = True
                        break
                else:
                    reps.append(r)
        if not merged:
            break

    def claim(r: int, name: str) -> None:
        _claim(label, taken, r, name)

    # a dim's families: a dim may join classes of several families (one role's dims that no
    # tensor holds together; the layers' copies), and is named after any of them (Blenderbot's
    # key axis shares a dim with its all-ones mask's, of a family no other dim names)
    fams: dict[int, list[int]] = {}  # the root's own family first
    for k in keys:
        r, f = root[k], fam.find(k)
        at = fams.setdefault(r, [fam.find(r)])
        if f not in at:
            at.append(f)
    fam_name: dict[int, str] = {}
    order = sorted({r for r in root if r >= 0})

    def family_name(r: int) -> str | None:
        return next((fam_name[f] for f in fams[r] if f in fam_name), None)

    def name_families(r: int) -> None:  # a family is named after a dim of its own (not a #k)
        for f in fams[r]:
            if f not in fam_name or "#" in fam_name[f] and "#" not in label[r]:
                fam_name[f] = label[r]

    for r in order:
        if r in label:
            name_families(r)
    pg = program(b, data, live)
    given: dict[str, list[tuple[str, list[int]]]] = {}  # a name asked for: (label, roots)

    def grown(r: int, name: str, role: bool = False) -> None:
        """``name`` for ``r``, or the label an earlier root asked ``name`` for got where it is
        of ``r``'s size and no tensor holds both (each unrolled layer slicing one mask: one
        dim, not one per layer)."""
        for got, roots in given.get(name, ()):
            if all(sizes[q] == sizes[r] and apart(q, r) for q in roots):
                label[r] = got
                roots.append(r)
                return
        claim(r, name)
        given.setdefault(name, []).append((label[r], [r]))

    for _ in range(8):  # a family's further dims after its name (the keys: ``seq#2``), then
        # what those show through slices and reshapes (the 64-square causal mask the keys
        # were sliced from: ``targets_seq+56#2``), until nothing more is named
        todo = [r for r in order if r not in label]
        for r in todo:
            name = family_name(r)
            if name is not None:
                grown(r, name)
        _grow(b, pg, root, label, grown, {}, True)
        for r in todo:
            if r in label:
                name_families(r)
        if not todo or all(r not in label for r in todo):
            break
    for r in order:  # the rest by the op that made it
        if r not in label:
            name = family_name(r)
            if name is not None:
                claim(r, name)
            else:
                t = owner[r]
                claim(r, f"{b.producer.get(t, f't{t}')}:{r - b.offsets[t]}")
                name_families(r)

    def family_of(r: int) -> str:  # the family its name is of, where it has several
        names = [fam_name[f] for f in fams[r] if f in fam_name]
        base = base_of(label[r])
        return next((n for n in names if n == base), names[0])

    dims = {label[r]: Dim(label[r], sizes[r], family_of(r), user=r in user_names) for r in order}
    return [label.get(r) if r >= 0 else None for r in root], dims
