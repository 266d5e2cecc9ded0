"""``al.validate``: the plan's prediction beside what XLA compiles for it.

The applied step is lowered on abstract arguments and compiled (nothing is allocated). From
the compiled HLO text every collective is read with its result bytes per device and its
group size; a collective inside a ``while`` body (a scanned layer stack) counts once per
trip, from XLA's ``known_trip_count``. FLOPs come from ``cost_analysis()`` and memory from
``memory_analysis()``. One row per collective kind, then ``flops`` and ``memory``.

``cost_analysis()`` counts the body of a ``while`` loop once, whatever its trip count, so the
``flops`` row does too (each op's FLOPs once); collective bytes are per step on both sides.
A plan compiled on another backend than its own is compared as that backend compiles it
(see :func:`validate`), and every correction is named in the row's ``note``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from autolayout.core import HardwareError, Plan, Workload, hardware, remat_for_plan, trace
from autolayout.cost_models import (
    COMBINE_BYTES,
    COMBINED_KINDS,
    PROMOTED_ON_CPU,
    flops_as_compiled,
)

from .apply import apply

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ITEMSIZE = {
    "pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(
    r"^\s*(?:ROOT\s+)?%?(\S+)\s*=\s*(.+?)\s+(" + "|".join(KINDS) + r")(-start)?\((.*)$"
)
_COMP = re.compile(r"^(?:ENTRY\s+)?%?(\S+)\s.*\{\s*$")  # headers are not indented
_WHILE = re.compile(r"\bwhile\(.*?body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclass(frozen=True, slots=True)
class HloCollective:
    kind: str
    bytes: int  # result buffer per device
    group: int  # devices per replica group
    computation: str
    count: int  # executions per step (while trip counts multiplied in)


def _shape_bytes(text: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        if dtype not in _ITEMSIZE:
            continue
        n = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
        total += n * _ITEMSIZE[dtype]
    return total


def _group_size(line: str) -> int:
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=", line)
    if m:
        return int(m.group(1).split(",")[-1])
    # mesh form, with or without device ids between: mesh[...], device_ids=(...) {'axis_1'}
    m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", line)
    if m:
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        names = re.findall(r"'(\w+)'", m.group(2))
        return int(np.prod([int(sizes[n]) for n in names])) if names else 1
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    if m:
        return 2
    return 1


def hlo_collectives(hlo: str) -> list[HloCollective]:
    """Every collective of a compiled HLO module, with its executions per step."""
    comp = None
    body_trip: dict[str, tuple[str, int]] = {}  # body computation -> (parent, trips)
    found: list[tuple[str, int, int, str]] = []
    for line in hlo.splitlines():
        m = _COMP.match(line)
        if m:
            comp = m.group(1)
            continue
        w = _WHILE.search(line)
        if w:
            t = _TRIP.search(line)
            body_trip[w.group(1)] = (comp or "", int(t.group(1)) if t else 1)
        m = _INSTR.match(line)
        if not m:
            continue
        result, kind, start = m.group(2), m.group(3), m.group(4)
        if start:  # async: (operands..., outputs...) — the outputs are the second half
            arrays = _ARRAY.findall(result)
            half = arrays[len(arrays) // 2 :]
            result = " ".join(f"{d}[{s}]" for d, s in half)
        found.append((kind, _shape_bytes(result), _group_size(line), comp or ""))

    def count(c: str, depth: int = 0) -> int:
        if c not in body_trip or depth > 16:
            return 1
        parent, n = body_trip[c]
        return n * count(parent, depth + 1)

    return [HloCollective(k, b, g, c, count(c)) for k, b, g, c in found if g > 1]


def _cost(compiled: Any) -> dict[str, float]:
    ca = compiled.cost_analysis()
    if isinstance(ca, list):
        ca = ca[0] if ca else {}
    return dict(ca or {})


MEMORY_TOLERANCE = 1.0  # compiled within [1/2, 2] x predicted: the liveness walk is a model


def validate(
    plan: Plan,
    workload: Workload | None = None,
    devices: Sequence[Any] | None = None,
    *,
    tolerance: float = 0.10,
    unpredicted_share: float = 0.10,
):
    """Predicted vs XLA-compiled, one row per collective kind, then FLOPs and memory.

    Columns: ``quantity``, ``predicted``, ``compiled``, ``ratio`` (compiled / predicted),
    ``predicted_count``, ``compiled_count``, ``checked`` (whether ``ok`` counts), ``ok``,
    ``count_ok``, ``note`` (a correction applied, or why a row is not checked). ``ok`` is
    the bytes (within ``tolerance``); ``count_ok`` the count (within ``tolerance``, or one),
    the plan's collectives as the compiling backend's combiners merge them
    (:func:`combined_count`; XLA:CPU merges independent all-reduces). Counts are reported, not
    failed: they match under DP and FSDP, not yet where XLA splits what the plan prices as one
    (the U-Net's batch-norm statistics under spatial partitioning: 13 predicted, 37 compiled).

    Like is compared with like when the plan is compiled on another backend than the one it
    was made for (a TPU or GPU plan on CPU devices): XLA:CPU has no reduce-scatter (it
    all-reduces the whole buffer and slices), so reduce-scatter and all-reduce become one
    ``reduction`` row, a reduce-scatter counted at its whole buffer; it moves 16-bit float
    all-reduces and all-gathers as float32, so those predicted bytes count twice; and its
    float normalisation adds ``convert`` ops around 16-bit arithmetic, which the ``flops`` row
    leaves out. A kind XLA compiles that the plan did not predict is not checked when its
    bytes are under ``unpredicted_share`` of all compiled collective bytes (its note says
    so). Memory is checked within 2x (``MEMORY_TOLERANCE``: a liveness walk against XLA's
    buffer assignment) where the plan is for the backend it is compiled on, and shown
    otherwise, and where XLA:CPU emulates 16-bit arithmetic through float32 copies.
    """
    import pandas as pd  # heavy (pandas): only where a table is asked for

    wl = workload or plan.workload
    if wl is not None:
        wl = remat_for_plan(plan, wl)
    laid_out = apply(plan, wl.fn, devices, workload=wl)
    compiled = laid_out.lower(*wl.args).compile()
    in_place = "; ".join(laid_out.notes)  # cuDNN attention compiled as JAX's composition
    platform = (devices[0] if devices else _default_device()).platform
    hlo = compiled.as_text()
    colls = hlo_collectives(hlo)
    pred = plan.collectives()
    graph = plan.graph
    if graph is None:
        graph = trace(wl)
    try:
        made_for = hardware(plan.hardware).kind
    except HardwareError:  # a profile file that is not here: take it as the compile backend's
        made_for = platform
    foreign_cpu = platform == "cpu" and made_for != "cpu"
    sixteen = {t for t, tt in graph.tensors.items() if tt.dtype in PROMOTED_ON_CPU}
    notes: dict[str, str] = {}
    if foreign_cpu and len(pred):
        promoted = pred["tensor"].isin(sixteen) & pred["kind"].isin(
            ["all-reduce", "all-gather", "reduce-scatter"]
        )
        if promoted.any():
            pred = pred.assign(bytes=pred["bytes"].where(~promoted, pred["bytes"] * 2))
            for k in set(pred.loc[promoted, "kind"]):
                notes[k] = "16-bit floats moved as float32 on XLA:CPU: predicted bytes x2"
        rs = pred["kind"] == "reduce-scatter"
        if rs.any():  # XLA:CPU all-reduces the whole buffer
            whole = pred["axes"].map(lambda axes: _group(plan.mesh, axes)).where(rs, 1)
            pred = pred.assign(bytes=pred["bytes"] * whole)
    fold = foreign_cpu and "reduce-scatter" in set(pred["kind"])
    rows = []
    total = float(sum(c.bytes * c.count for c in colls)) or 1.0
    for kinds in _kind_rows(fold):
        p = pred[pred["kind"].isin(kinds)]
        pb = float((p["bytes"] * p["count"]).sum()) if len(p) else 0.0
        pc = combined_count(p, graph, COMBINED_KINDS.get(platform, frozenset()),
                            COMBINE_BYTES.get(platform, 2**30))  # fmt: skip
        cs = [c for c in colls if c.kind in kinds]
        cb = float(sum(c.bytes * c.count for c in cs))
        cc = sum(c.count for c in cs)
        if pb == 0 and cb == 0:
            continue
        name = "reduction" if len(kinds) > 1 else kinds[0]
        note = "; ".join(dict.fromkeys(notes[k] for k in kinds if k in notes))
        if len(kinds) > 1:
            note = "; ".join(
                x for x in (
                    "XLA:CPU has no reduce-scatter: reduce-scatter + all-reduce compared as one, "
                    "a reduce-scatter at its whole buffer", note
                ) if x
            )  # fmt: skip
        checked = True
        if pb == 0 and cb <= unpredicted_share * total:
            checked = False
            note = (
                f"not predicted; {cb / total:.1%} of the compiled collective bytes, under the "
                f"{unpredicted_share:.0%} threshold"
            )
        rows.append(_row(name, pb, cb, pc, cc, checked, tolerance, note))
    flops = _cost(compiled).get("flops", float("nan"))
    note = ""
    if platform == "cpu" and sixteen:
        converts = _convert_elements(hlo)
        flops -= converts
        note = f"{converts:.4g} convert FLOPs of XLA:CPU's float normalisation left out"
    once = flops_as_compiled(plan)  # cost_analysis() counts a while body once: so does this row
    checked = not in_place
    if in_place:  # the composition computes the causal half of the scores too, and more
        note = "; ".join(x for x in (f"shown: {in_place}", note) if x)
    rows.append(_row("flops", once, flops, None, None, checked, tolerance, note))
    ma = compiled.memory_analysis()
    mem = float("nan")
    if ma is not None:
        mem = float(
            ma.argument_size_in_bytes
            + ma.output_size_in_bytes
            - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes
        )
    s = plan.summary()
    if made_for != platform:
        checked, note = False, f"shown: compiled for {platform}, the plan is for {made_for}"
    elif platform == "cpu" and sixteen:
        checked = False
        note = "shown: XLA:CPU keeps float32 copies of 16-bit operands, which no target has"
    elif platform == "cpu" and any(t.host for t in graph.tensors.values()):
        checked = False
        note = "shown: the plan keeps values in host memory, which XLA:CPU does not tell apart"
    else:
        checked = ma is not None
        note = "within 2x: a liveness walk against XLA's buffer assignment"
    rows.append(
        _row("memory", s["memory_bytes_per_device"], mem, None, None, checked,
             MEMORY_TOLERANCE, note)
    )  # fmt: skip
    return pd.DataFrame(rows)


def _default_device():

    return jax.devices()[0]


def _group(mesh: dict[str, int], axes) -> int:
    return int(np.prod([mesh.get(a, 1) for a in axes])) if len(axes) else 1


def _kind_rows(fold: bool) -> list[tuple[str, ...]]:
    if not fold:
        return [(k,) for k in KINDS]
    return [("all-gather",), ("reduce-scatter", "all-reduce"), ("all-to-all",),
            ("collective-permute",)]  # fmt: skip


_CONVERT = re.compile(r"=\s*[a-z0-9]+\[([0-9,]*)\]\S*\s+convert\(")


def _convert_elements(hlo: str) -> float:
    """Elements of every ``convert`` in the module's text (cost_analysis() counts one FLOP
    each; a while body's once, as it does)."""
    total = 0
    for m in _CONVERT.finditer(hlo):
        total += int(np.prod([int(d) for d in m.group(1).split(",") if d])) if m.group(1) else 1
    return float(total)


def combined_count(rows, graph, kinds: frozenset, limit: int) -> int:
    """Collectives a step runs once XLA's combiners have merged what they can: in program
    order, a collective of a combined kind joins the open bucket of its kind, group and loop
    trip count when it does not depend on a collective already in it (XLA combines only
    independent ones) and the bucket stays under ``limit`` bytes; a scanned body's merge
    once per iteration."""
    if not len(rows):
        return 0
    by_op: dict[str, list] = {}
    for r in rows.itertuples(index=False):
        by_op.setdefault(r.op, []).append(r)
    dep: dict[str, int] = {}  # tensor -> bitmask of the collectives it depends on
    buckets: dict[tuple, list[int]] = {}  # key -> [mask of members, bytes]
    n, bit = 0, 0
    for op in graph.ops:
        mask = 0
        for t in op.inputs:
            mask |= dep.get(t, 0)
        for r in by_op.get(op.name, ()):
            if r.kind not in kinds:
                n += int(r.count)
                continue
            key = (r.kind, tuple(r.axes), int(r.count))
            b = buckets.get(key)
            if b is None or b[0] & mask or b[1] + r.bytes > limit:
                buckets[key] = b = [0, 0]
                n += int(r.count)
            b[0] |= 1 << bit
            b[1] += r.bytes
            mask |= 1 << bit
            bit += 1
        for t in op.outputs:
            dep[t] = mask
    return n


def _row(q, pred, comp, pc, cc, checked, tol, note="") -> dict[str, Any]:
    ratio = comp / pred if pred else float("inf") if comp else 1.0
    if q == "memory":  # a factor either way
        ok = bool(pred > 0 and comp > 0 and 1 / (1 + tol) <= ratio <= 1 + tol)
    else:
        ok = bool(pred > 0 and comp > 0 and abs(ratio - 1.0) <= tol)
    count_ok = None
    if pc is not None and cc is not None:  # counts: within 10%, or one
        count_ok = abs(pc - cc) <= max(1, round(tol * cc))
        if not count_ok and checked:
            note = "; ".join(x for x in (note, f"{pc} collectives predicted, {cc} compiled") if x)
    ok = ok if checked else True
    return {
        "quantity": q,
        "predicted": pred,
        "compiled": comp,
        "ratio": ratio,
        "predicted_count": pc,
        "compiled_count": cc,
        "checked": checked,
        "ok": ok,
        "count_ok": count_ok,
        "note": note,
    }
