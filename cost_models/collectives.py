"""Collective times on the physical links a mesh axis maps onto (alpha-beta).

Devices are numbered row-major over the mesh (the last mesh axis varies fastest), and laid
on the hardware with the innermost physical dimension varying fastest: a TPU torus
``(X, Y, Z)`` numbers chips ``x + X*(y + Y*z)``; a GPU cluster numbers the GPUs of a node
contiguously. A mesh axis of size ``n`` and stride ``s`` then covers, on each physical
dimension, a *segment*: how many distinct coordinates its members take there. An axis may
span several torus dims, or part of one, or NVLink and the network both.

Formulas (``docs/hardware-facts.md``, jax-ml/scaling-book ``sharding.md``/``gpus.md``);
``V`` is the bytes of the whole (gathered) array of one group, ``N`` the group size:

* TPU all-gather: ``max(alpha * hops, V (N-1)/N / sum_i W_i)`` over the segments; a segment
  with wraparound is a bidirectional ring (``W = 2 * link``, ``N/2`` hops), one without is
  unidirectional (``W = link``, ``N-1`` hops). Reduce-scatter = all-gather, all-reduce =
  2x, all-to-all = all-gather / 4 with wraparound, / 2 without.
* Between TPU slices (a multi-slice job, ``2xtpu-v5p-256``): the slices are the outermost
  physical dimension, on the data-centre network; a group spanning ``m`` slices and ``k``
  chips of each runs the ICI part first, then each chip moves its ``1/k`` share across:
  ``alpha (m-1) + V/k (m-1)/m / W_dcn`` per all-gather (all-reduce 2x), as MaxText's
  data parallelism across slices does.
* GPU all-gather: ``V * max_level (D-1)/(D W)`` over the levels (NVLink inside a node,
  the network across nodes) plus ``alpha`` per ring step; all-reduce 2x; all-to-all
  ``V/(W N)`` inside a node, ``V (M-1)/(M^2 W_node)`` across ``M`` nodes.

Bandwidths are scaled by the profile's ``efficiency.collective``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autolayout.core import Cluster, Hardware, MeshError, Torus

__all__ = ["KINDS", "MeshError", "Segment", "collective_time", "group_segments", "place_mesh"]

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

# XLA's combiners merge independent collectives of one kind over one group into one, up to
# this many bytes (xla/debug_options_flags.cc: 30 MiB for all-reduce, all-gather and
# reduce-scatter on GPUs; taken for TPUs and CPUs too). A combinable collective (the state's:
# weight gathers, gradient reductions) pays the latency in proportion to its share of one
# combined collective, so n small gradients pay it about once, as XLA runs them. XLA:CPU
# combines all-reduces only (measured: the example models' FSDP all-gathers compile one each),
# with no limit found (66 MB of my_transformer's gradients compile to one all-reduce).
COMBINE_BYTES = {"gpu": 30 * 2**20, "tpu": 30 * 2**20, "cpu": 2**30}
_REDUCTIONS_AND_GATHERS = frozenset({"all-gather", "reduce-scatter", "all-reduce"})
COMBINED_KINDS = {
    "gpu": _REDUCTIONS_AND_GATHERS,
    "tpu": _REDUCTIONS_AND_GATHERS,
    "cpu": frozenset({"all-reduce"}),
}


def combines(hw: Hardware, kind: str) -> bool:
    """Whether ``hw``'s XLA backend merges independent collectives of ``kind``."""
    return kind in COMBINED_KINDS.get(hw.kind, frozenset())


@dataclass(frozen=True, slots=True)
class Segment:
    """The part of one physical dimension that a mesh axis's group spans."""

    length: int  # devices of the group along this physical dim
    bandwidth: float  # bytes/s one way per device on this dim's links
    latency_s: float
    wraparound: bool = False  # a closed ring (TPU torus dim spanned whole)
    level: str = "ici"  # "ici" | "nvlink" | "network" | "host"
    dim: int = 0  # which physical dimension (innermost 0)
    dim_length: int = 0  # that dimension's whole length
    dim_wraps: bool = False  # that dimension, spanned whole, is a closed ring


def _physical_dims(hw: Hardware) -> list[tuple[int, float, float, bool, str]]:
    """(length, bandwidth, latency, wraparound, level), innermost first."""
    t = hw.topology
    if isinstance(t, Torus):
        dims = [
            (n, t.link_bandwidth, t.latency_s, w, "ici")
            for n, w in zip(t.shape, t.wraparound, strict=True)
        ]
        if t.slices > 1:
            dims.append((t.slices, t.dcn_bandwidth or 0.0, t.dcn_latency_s, False, "dcn"))
        return dims
    assert isinstance(t, Cluster)
    level = "nvlink" if hw.kind == "gpu" else "host"
    dims = [(t.per_node, t.intra_bandwidth, t.intra_latency_s, False, level)]
    if t.nodes > 1:
        dims.append(
            (
                t.nodes,
                t.inter_bandwidth or t.intra_bandwidth,
                t.inter_latency_s or t.intra_latency_s,
                False,
                "network",
            )
        )
    return dims


def place_mesh(hw: Hardware, mesh: dict[str, int]) -> dict[str, tuple[Segment, ...]]:
    """The physical segments each mesh axis spans.

    Example:
      >>> import autolayout as al
      >>> p = place_mesh(al.hardware("h100-16"), {"data": 4, "model": 4})
      >>> [(s.level, s.length) for s in p["data"]], [(s.level, s.length) for s in p["model"]]
      ([('nvlink', 2), ('network', 2)], [('nvlink', 4)])
    """
    sizes = list(mesh.values())
    if any(not isinstance(n, int) or n < 1 for n in sizes):
        raise MeshError(f"mesh axis sizes must be positive integers, got {mesh}")
    if math.prod(sizes) != hw.num_devices:
        shown = " x ".join(f"{k}={v}" for k, v in mesh.items())
        raise MeshError(
            f"mesh {shown} has {math.prod(sizes)} devices but {hw.name} has {hw.num_devices}"
        )
    dims = _physical_dims(hw)
    out: dict[str, tuple[Segment, ...]] = {}
    stride = hw.num_devices
    for name, n in mesh.items():
        stride //= n
        lo_axis, hi_axis = stride, stride * n
        segs = []
        c = 1
        for k, (length, bw, lat, wrap, level) in enumerate(dims):
            lo, hi = max(lo_axis, c), min(hi_axis, c * length)
            if hi > lo:
                if hi % lo:
                    raise MeshError(
                        f"mesh axis {name!r}={n} does not tile {hw.name}'s {level} dimension of {length}"
                    )
                seg = hi // lo
                segs.append(Segment(seg, bw, lat, wrap and seg == length, level, k, length, wrap))
            c *= length
        out[name] = tuple(segs)
    return out


def group_segments(
    placement: dict[str, tuple[Segment, ...]], axes: tuple[str, ...]
) -> tuple[Segment, ...]:
    """The segments of a group spanning several mesh axes: where two axes share a physical
    dimension their lengths multiply (a ring that covers the whole dimension is closed where
    that dimension wraps around: a 2 x 4 v5e slice's y ring of 4 is open however the mesh
    splits it, ``tests/test_collective_groups.py``).

    Example:
      >>> import autolayout as al
      >>> p = place_mesh(al.hardware("tpu-v4-8"), {"a": 2, "b": 2})
      >>> [(s.length, s.wraparound) for s in group_segments(p, ("a", "b"))]
      [(2, False), (2, False)]
    """
    by_dim: dict[int, Segment] = {}
    for a in axes:
        for s in placement[a]:
            if s.dim in by_dim:
                o = by_dim[s.dim]
                n = o.length * s.length
                wrap = s.dim_wraps and n == s.dim_length
                s = Segment(n, s.bandwidth, s.latency_s, wrap, s.level, s.dim, s.dim_length,
                            s.dim_wraps)  # fmt: skip
            by_dim[s.dim] = s
    return tuple(by_dim[k] for k in sorted(by_dim))


def _eff_bw(hw: Hardware, s: Segment) -> float:
    return s.bandwidth * hw.efficiency.collective


def collective_time(
    hw: Hardware,
    kind: str,
    segments: tuple[Segment, ...],
    full_bytes: float,
    combined: bool = False,
) -> float:
    """Seconds for one collective over a group spanning ``segments``; ``full_bytes`` is the
    whole (gathered) array of the group. A group of one device costs nothing. ``combined``:
    XLA merges it with others of its kind (:data:`COMBINE_BYTES`), so it pays its share of
    one latency.

    Example (TPU v4, one 4-chip ring with no wraparound, 1 MiB gathered): ::

      V (N-1)/N / (W * eff) = 2**20 * 3/4 / (4.5e10 * 0.82) = 21.3 us > 3 hops * 1 us
    """
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(KINDS)}")
    n = math.prod(s.length for s in segments)
    if n <= 1 or full_bytes <= 0:
        return 0.0
    if kind == "collective-permute":  # one message to a neighbour over one link; on a
        # group spanning several links (NVLink and the network) some pairs cross the slowest
        return max(s.latency_s + full_bytes / _eff_bw(hw, s) for s in segments if s.length > 1)
    combined = combined and combines(hw, kind)
    share = min(1.0, full_bytes / COMBINE_BYTES[hw.kind]) if combined else 1.0
    if hw.kind == "tpu":
        return _torus_time(hw, kind, segments, n, full_bytes, share)
    return _cluster_time(hw, kind, segments, n, full_bytes, share)


def _torus_time(
    hw: Hardware, kind: str, segs: tuple[Segment, ...], n: int, v: float, share: float = 1.0
) -> float:
    dcn = [s for s in segs if s.level == "dcn"]
    if dcn:  # hierarchical: the slice's part over ICI, then 1/k of it per chip over DCN
        ici = tuple(s for s in segs if s.level != "dcn")
        k = math.prod(s.length for s in ici) if ici else 1
        inside = _torus_time(hw, kind, ici, k, v, share) if k > 1 else 0.0
        m = dcn[0].length
        gather = dcn[0].latency_s * (m - 1) * share + v / k * (m - 1) / m / _eff_bw(hw, dcn[0])
        across = {"all-gather": gather, "reduce-scatter": gather, "all-reduce": 2 * gather}.get(
            kind, gather / 2
        )  # all-to-all: each chip sends the other slices' share once
        return inside + across
    bw = sum((2.0 if s.wraparound else 1.0) * _eff_bw(hw, s) for s in segs)
    hops = sum(s.length / 2 if s.wraparound else s.length - 1 for s in segs)
    alpha = max(s.latency_s for s in segs) * share
    gather = max(alpha * hops, v * (n - 1) / n / bw)
    if kind in ("all-gather", "reduce-scatter"):
        return gather
    if kind == "all-reduce":
        return 2 * gather
    closed = all(s.wraparound for s in segs)
    return gather / (4 if closed else 2)  # all-to-all


def _cluster_time(
    hw: Hardware, kind: str, segs: tuple[Segment, ...], n: int, v: float, share: float = 1.0
) -> float:
    steps = {
        "all-gather": n - 1,
        "reduce-scatter": n - 1,
        "all-reduce": 2 * (n - 1),
        "all-to-all": n - 1,
    }[kind]
    alpha = steps * max(s.latency_s for s in segs) * share
    if kind == "all-to-all":
        inner = [s for s in segs if s.level != "network"]
        outer = [s for s in segs if s.level == "network"]
        if outer:
            m = outer[0].length
            per_node = math.prod(s.length for s in inner) if inner else 1
            return alpha + v * (m - 1) / (m * m * _eff_bw(hw, outer[0]) * per_node)
        return alpha + v / (_eff_bw(hw, segs[0]) * n)
    gather = v * max((s.length - 1) / (s.length * _eff_bw(hw, s)) for s in segs)
    return alpha + (2 * gather if kind == "all-reduce" else gather)
