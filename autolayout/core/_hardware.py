"""Hardware profiles: a TOML file per family, parsed into a slice or cluster by name.

``al.hardware("tpu-v4-256")`` reads ``hw_profiles/tpu-v4.toml`` and builds the 128-chip
4x4x8 torus that name means; ``al.hardware("h100-64")`` is 8 nodes of 8 GPUs;
``al.hardware("path/to/mine.toml")`` reads a user's own profile. Every number in a
profile is checked against :data:`SCHEMA`; a wrong key or value raises
:class:`HardwareError` naming the file, the key and what was expected.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from ._errors import HardwareError

_NUM = "a number"
# section -> key -> (type, what it means, required)
SCHEMA: dict[str, dict[str, tuple[str, str, bool]]] = {
    "": {
        "family": ("str", "the family name, e.g. 'tpu-v4'", True),
        "kind": ("kind", "'tpu', 'gpu' or 'cpu'", True),
        "description": ("str", "a one-line description", False),
        "approximate": ("bool", "true when the figures are rough", False),
        "devices": ("int", "the device count when the name gives none", False),
    },
    "chip": {
        "peak_flops": ("flops", "FLOP/s per dtype, e.g. {bf16 = 2.75e14}", True),
        "hbm_bytes": ("num", "bytes of HBM per chip", True),
        "hbm_bandwidth": ("num", "HBM bytes per second per chip", True),
        "cores_per_chip": ("int", "TensorCores per chip", False),
        "host_bandwidth": (
            "num",
            "bytes per second, one way, between a chip's HBM and its host's memory (offloaded "
            "residuals)",
            False,
        ),
    },
    "efficiency": {
        "matmul": ("frac", "achieved fraction of peak FLOP/s on large matmuls", True),
        "memory": ("frac", "achieved fraction of HBM bandwidth", True),
        "collective": ("frac", "achieved fraction of link bandwidth in collectives", True),
        "overlap": ("frac", "fraction of communication hidden behind compute", True),
        "memory_headroom": ("frac", "fraction of HBM a plan may use", True),
        "attention": (
            "frac",
            "fraction of peak FLOP/s a fused attention kernel reaches (default: matmul)",
            False,
        ),
        "attention_call_s": (
            "num",
            "seconds a fused attention forward+backward costs beyond its FLOPs",
            False,
        ),
        "conv3d": (
            "frac",
            "fraction of peak FLOP/s a 3-D convolution reaches (default: matmul)",
            False,
        ),
        "kernel_s": (
            "num",
            "seconds each kernel that writes HBM costs beyond its roofline (launch, tail)",
            False,
        ),
        "scan_stack_passes": (
            "num",
            "extra HBM passes over the residuals a scan stacks for a later loop (copied in "
            "and out of the stack)",
            False,
        ),
        "scan_stacks_at_start": (
            "bool",
            "the compiler allocates every scan's stacked outputs at the step's start (their "
            "zero fill scheduled before the first loop), not at their loop",
            False,
        ),
        "remat_barriers": (
            "bool",
            "a remat region's optimization barrier reaches the scheduler (false: the compiler "
            "drops it and runs the recomputation as early as its inputs allow)",
            False,
        ),
        "select_and_scatter_expanded": (
            "bool",
            "the compiler expands a max-pool's gradient (select-and-scatter) into an argmax "
            "in the forward pass (an int32 iota per dim of the operand, int32 indices per dim "
            "of the result) and a scatter into zeros allocated at the step's start",
            False,
        ),
        "weight_gradient_copies": (
            "bool",
            "a 1-D or 2-D convolution's weight gradient reads transposed copies of its "
            "operands, each made where the value is written",
            False,
        ),
        "depthwise_gradient_dense": (
            "bool",
            "a depthwise convolution's weight gradient (a batch group per channel) runs as a "
            "dense convolution over every pair of channels, then keeps the diagonal (a mask "
            "and a sum): channels x the FLOPs, two channels x filter-sized buffers",
            False,
        ),
        "ragged_dot_dense": (
            "bool",
            "a grouped matmul (lax.ragged_dot) runs as one dense matmul over every group, its "
            "ragged operands masked per group: groups x the FLOPs, groups x each ragged "
            "operand's buffer",
            False,
        ),
    },
    "naming": {
        "counts": (
            "counts",
            "what N in 'family-N' counts: 'chips', 'cores', 'gpus' or 'devices'",
            True,
        ),
        "max_chips": ("int", "the largest slice or cluster in chips", True),
        "chips_per_host": ("int", "chips per host", False),
    },
    "ici": {
        "topology": ("topology", "'torus2d' or 'torus3d'", True),
        "link_bandwidth": ("num", "bytes per second, one way, per link", True),
        "links_per_chip": ("int", "ICI links per chip", True),
        "latency_s": ("num", "seconds per hop", True),
        "wraparound_rule": ("wrap", "'cubes' (every axis a multiple of 4) or 'full-axis'", True),
        "full_axis_length": ("int", "axis length that has wraparound under 'full-axis'", False),
    },
    "dcn": {
        "bandwidth_per_chip": ("num", "bytes per second per chip between slices", True),
        "latency_s": ("num", "seconds per message between slices", False),
    },
    "nvlink": {
        "domain_size": ("int", "GPUs in one NVLink domain (a node, or an NVL72 rack)", True),
        "bandwidth": ("num", "bytes per second, one way, per GPU", True),
        "latency_s": ("num", "seconds per step", True),
    },
    "network": {
        "bandwidth_per_gpu": ("num", "bytes per second, one way, per GPU across nodes", True),
        "latency_s": ("num", "seconds per step", True),
    },
    "host": {
        "bandwidth": ("num", "bytes per second between local devices", True),
        "latency_s": ("num", "seconds per transfer", True),
    },
    "calibration": {  # what `autolayout calibrate` measured: a record, not read by the cost model
        k: ("any", "a record of the measurement", False)
        for k in (
            "measured_at",
            "where",
            "jax",
            "base",
            "quick",
            "matmul",
            "memory",
            "attention",
            "attention_note",
            "conv",
            "host_link",
            "host_link_note",
            "collectives",
            "collective_fit",
        )
    },
}
_SECTIONS_BY_KIND = {
    "tpu": ("chip", "efficiency", "naming", "ici"),
    "gpu": ("chip", "efficiency", "naming", "nvlink", "network"),
    "cpu": ("chip", "efficiency", "naming", "host"),
}
_OPTIONAL_SECTIONS = {
    "tpu": ("dcn", "calibration"),
    "gpu": ("calibration",),
    "cpu": ("calibration",),
}
_CHOICES = {
    "kind": ("tpu", "gpu", "cpu"),
    "counts": ("chips", "cores", "gpus", "devices"),
    "topology": ("torus2d", "torus3d"),
    "wrap": ("cubes", "full-axis"),
}
_ALIASES = {"tpu-v5litepod": "tpu-v5e", "tpu-v5lite": "tpu-v5e", "tpu-trillium": "tpu-v6e"}
NAMING_RULE = (
    "names are FAMILY-N: TPU v2/v3/v4/v5p count TensorCores (tpu-v4-256 = 128 chips; a "
    "multiple of 4x4x4 cubes need not be a power of two: tpu-v4-384 = 4x4x12), "
    "v5e/v6e count chips (tpu-v5e-256), a TPU topology may be given as tpu-v4-4x4x8; "
    "GPUs count GPUs (h100-64 = 8 nodes of 8); cpu-N is N local devices; 2xtpu-v5p-256 is two "
    "slices joined by the data-centre network; "
    "or a path to a .toml profile"
)


@dataclass(frozen=True, slots=True)
class Chip:
    peak_flops: dict[str, float]  # FLOP/s per dtype name ("bf16", "int8", ...)
    hbm_bytes: float
    hbm_bandwidth: float
    cores_per_chip: int = 1
    host_bandwidth: float | None = None  # HBM <-> host memory, one way; None: not given


@dataclass(frozen=True, slots=True)
class Efficiency:
    matmul: float
    memory: float
    collective: float
    overlap: float
    memory_headroom: float
    attention: float | None = None  # fused attention kernels' fraction of peak; None: matmul's
    attention_call_s: float = 0.0  # per forward+backward pair, beyond the FLOPs (launch, tails)
    conv3d: float | None = None  # 3-D convolutions' fraction of peak; None: matmul's
    kernel_s: float = 0.0  # per kernel that writes HBM, beyond its roofline (launch, tail)
    scan_stack_passes: float = 0.0  # HBM passes over residuals a scan stacks for a later loop
    scan_stacks_at_start: bool = False  # every scan's stacked outputs allocated at the start
    remat_barriers: bool = True  # a remat region's barrier reaches the scheduler
    select_and_scatter_expanded: bool = False  # max-pool gradients: argmax + scatter (XLA:CPU)
    weight_gradient_copies: bool = False  # 1-D/2-D conv weight gradients read copies
    depthwise_gradient_dense: bool = False  # depthwise weight gradients dense, then a diagonal
    ragged_dot_dense: bool = False  # ragged_dot as a dense matmul over every group, masked


DCN_LATENCY_S = 1e-5  # between slices when a profile gives none: an assumption, not sourced


@dataclass(frozen=True, slots=True)
class Torus:
    """A TPU slice: chips on a 2-D or 3-D torus of ICI links."""

    shape: tuple[int, ...]
    wraparound: tuple[bool, ...]
    link_bandwidth: float  # bytes/s one way per link
    latency_s: float
    dcn_bandwidth: float | None = None  # bytes/s per chip between slices
    slices: int = 1  # slices joined by the data-centre network (a multi-slice job)
    dcn_latency_s: float = DCN_LATENCY_S

    def describe(self) -> str:
        wrap = ",".join("wrap" if w else "open" for w in self.wraparound)
        one = f"{'x'.join(map(str, self.shape))} torus ({wrap})"
        return one if self.slices == 1 else f"{self.slices} slices joined by DCN, each a {one}"


@dataclass(frozen=True, slots=True)
class Cluster:
    """GPUs (or local devices): fast links inside a node, a network across nodes."""

    nodes: int
    per_node: int
    intra_bandwidth: float  # bytes/s one way per device inside a node
    intra_latency_s: float
    inter_bandwidth: float | None = None  # bytes/s one way per device across nodes
    inter_latency_s: float | None = None

    def describe(self) -> str:
        s = "node" if self.nodes == 1 else "nodes"
        return f"{self.nodes} {s} x {self.per_node} devices"


@dataclass(frozen=True, slots=True)
class Hardware:
    """A slice or cluster: a chip, a topology, the profile's efficiencies, its source file."""

    name: str
    family: str
    kind: str
    num_devices: int
    chip: Chip
    topology: Torus | Cluster
    efficiency: Efficiency
    source: str
    description: str = ""
    approximate: bool = False

    @property
    def hbm_limit_bytes(self) -> float:
        """HBM per device a plan may use (HBM x headroom)."""
        return self.chip.hbm_bytes * self.efficiency.memory_headroom

    def describe(self) -> str:
        c = self.chip
        flops = ", ".join(f"{k} {v:.3g}" for k, v in c.peak_flops.items())
        lines = [
            f"{self.name}: {self.description or self.family}"
            + (
                " (approximate figures)"
                if self.approximate and "approximate" not in (self.description or "")
                else ""
            ),  # fmt: skip
            f"  devices      {self.num_devices}",
            f"  topology     {self.topology.describe()}",
            f"  peak FLOP/s  {flops} per device",
            f"  HBM          {c.hbm_bytes / 2**30:.1f} GiB at {c.hbm_bandwidth:.3g} B/s",
        ]
        if c.host_bandwidth:
            lines.append(f"  host memory  {c.host_bandwidth:.3g} B/s one way (offloaded residuals)")
        t = self.topology
        if isinstance(t, Torus):
            lines.append(
                f"  ICI          {t.link_bandwidth:.3g} B/s per link one way, {t.latency_s:.2g} s per hop"
            )
            if t.dcn_bandwidth:
                lines.append(f"  DCN          {t.dcn_bandwidth:.3g} B/s per chip between slices")
        else:
            lines.append(f"  intra-node   {t.intra_bandwidth:.3g} B/s per device one way")
            if t.inter_bandwidth:
                lines.append(f"  inter-node   {t.inter_bandwidth:.3g} B/s per device one way")
        e = self.efficiency
        lines.append(
            f"  efficiency   matmul {e.matmul:.3g}, memory {e.memory:.3g}, collective "
            f"{e.collective:.3g}, overlap {e.overlap:.3g}, HBM headroom {e.memory_headroom:.3g}"
        )
        if e.attention is not None:
            lines.append(
                f"  attention    fused kernels at {e.attention:.3g} of peak, "
                f"+{e.attention_call_s * 1e3:.2f} ms a forward+backward"
            )
        if e.conv3d is not None:
            lines.append(f"  convolution  3-D at {e.conv3d:.3g} of peak")
        if e.kernel_s or e.scan_stack_passes:
            lines.append(
                f"  overheads    {e.kernel_s * 1e6:.1f} us a kernel, {e.scan_stack_passes:g} HBM "
                "passes over a scan's stacked residuals"
            )
        if e.scan_stacks_at_start:
            lines.append(
                "  memory       every scan's stacked outputs allocated at the step's start"
            )
        if not e.remat_barriers:
            lines.append(
                "  memory       remat barriers dropped: recomputation runs as early as it can"
            )
        if e.select_and_scatter_expanded:
            lines.append(
                "  memory       max-pool gradients as an argmax and a scatter (int32 indices)"
            )
        if e.weight_gradient_copies:
            lines.append(
                "  memory       convolutions' weight gradients read copies of their operands"
            )
        if e.depthwise_gradient_dense:
            lines.append(
                "  compute      depthwise weight gradients as dense convolutions and a diagonal"
            )
        if e.ragged_dot_dense:
            lines.append(
                "  compute      grouped matmuls (ragged_dot) dense over every group, masked"
            )
        lines.append(f"  profile      {self.source}")
        return "\n".join(lines)


# --- profile files ----------------------------------------------------------------------------


def _profile_dir() -> Path:
    return Path(str(resources.files("autolayout.hw_profiles")))


def profile_path(family: str) -> Path:
    """The shipped profile file of a family, e.g. ``profile_path("h100")``."""
    p = _profile_dir() / f"{family}.toml"
    if not p.is_file():
        raise HardwareError(f"no shipped profile {family!r}; known: {', '.join(list_profiles())}")
    return p


def list_profiles() -> list[str]:
    """The families with a shipped profile, e.g. ``['a100-80gb', ..., 'tpu-v6e']``."""
    return sorted(p.stem for p in _profile_dir().glob("*.toml"))


def _check_value(where: str, key: str, typ: str, what: str, v: Any) -> Any:
    def bad() -> HardwareError:
        return HardwareError(f"{where}: key {key!r} must be {what} ({_kind_word(typ)}), got {v!r}")

    if typ == "any":
        return v
    if typ == "str":
        if not isinstance(v, str):
            raise bad()
    elif typ == "bool":
        if not isinstance(v, bool):
            raise bad()
    elif typ == "int":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise bad()
    elif typ == "num":  # TOML reads inf and nan as floats: a bandwidth of inf plans nonsense
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            raise bad()
        v = float(v)
    elif typ == "frac":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise bad()
        v = float(v)
    elif typ == "flops":
        if not isinstance(v, dict) or not v:
            raise bad()
        for k, x in v.items():
            _check_value(where, f"{key}.{k}", "num", "FLOP/s", x)
        v = {k: float(x) for k, x in v.items()}
    elif typ in _CHOICES:
        if v not in _CHOICES[typ]:
            raise bad()
    return v


def _kind_word(typ: str) -> str:
    return {
        "str": "a string",
        "bool": "true or false",
        "int": "a positive integer",
        "num": "a positive finite number",
        "frac": "a number from 0 to 1",
        "flops": "a table of dtype = FLOP/s",
    }.get(typ, "one of " + ", ".join(repr(c) for c in _CHOICES.get(typ, ())))


def load_profile(path: str | Path) -> dict[str, Any]:
    """Reads and checks a profile TOML file; returns ``{section: {key: value}}``."""
    p = Path(path)
    where = _shown(p)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise HardwareError(f"{where}: profile file does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise HardwareError(f"{where}: not valid TOML: {e}") from None
    top = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    out: dict[str, Any] = {"": _check_section(where, "", top)}
    kind = out[""]["kind"]
    allowed = _SECTIONS_BY_KIND[kind] + _OPTIONAL_SECTIONS[kind]
    for sec, body in raw.items():
        if isinstance(body, dict) and sec not in allowed:
            raise HardwareError(
                f"{where}: unknown section [{sec}] for a {kind} profile; expected "
                + ", ".join(f"[{s}]" for s in allowed)
            )
    for sec in allowed:
        if sec not in raw:
            if sec in _OPTIONAL_SECTIONS[kind]:
                continue
            raise HardwareError(
                f"{where}: missing section [{sec}] (a {kind} profile needs "
                + ", ".join(f"[{s}]" for s in _SECTIONS_BY_KIND[kind])
                + ")"
            )
        out[sec] = _check_section(where, sec, raw[sec])
    return out


def _check_section(where: str, sec: str, body: dict[str, Any]) -> dict[str, Any]:
    schema = SCHEMA[sec]
    label = f"[{sec}]" if sec else "the top level"
    for k in body:
        if k not in schema:
            raise HardwareError(
                f"{where}: unknown key {_dotted(sec, k)!r}; {label} takes " + ", ".join(schema)
            )
    out = {}
    for k, (typ, what, required) in schema.items():
        if k not in body:
            if required:
                raise HardwareError(f"{where}: missing key {_dotted(sec, k)!r} ({what})")
            continue
        out[k] = _check_value(where, _dotted(sec, k), typ, what, body[k])
    return out


def _dotted(sec: str, k: str) -> str:
    return f"{sec}.{k}" if sec else k


def _shown(p: Path) -> str:
    try:
        return str(p.relative_to(_profile_dir().parent.parent)) if p.is_absolute() else str(p)
    except ValueError:
        return str(p)


# --- names ------------------------------------------------------------------------------------


def _torus_shape(chips: int, ndim: int) -> tuple[int, ...]:
    """A slice's torus: double the smallest axis until the chips fit (v4-256 -> 4x4x8)."""
    shape = [1] * ndim
    while math.prod(shape) < chips:
        i = shape.index(min(shape))
        shape[i] *= 2
    ones = [s for s in shape if s == 1]
    return tuple(sorted(s for s in shape if s > 1)) + tuple(ones)


def _cube_multiple(chips: int, ndim: int) -> tuple[int, ...] | None:
    """A slice of 4x4x4 cubes that is not a power of two (v4/v5p: ``tpu-v4-384`` = 4x4x12,
    the 3072-chip v4 pod PaLM ran on = 12x16x16): every axis a multiple of 4, the most even
    such shape, smallest axis first; None where there is none."""
    if chips < 4**ndim or chips % 4**ndim:
        return None
    best = None

    def shapes(left: int, k: int, low: int):
        if k == 1:
            if left >= low and left % 4 == 0:
                yield (left,)
            return
        for a in range(low, left + 1, 4):
            if left % a == 0:
                for rest in shapes(left // a, k - 1, a):
                    yield (a, *rest)

    for shape in shapes(chips, ndim, 4):
        if best is None or shape[-1] / shape[0] < best[-1] / best[0]:
            best = shape
    return best


def _wraparound(prof: dict[str, Any], shape: tuple[int, ...]) -> tuple[bool, ...]:
    ici = prof["ici"]
    if ici["wraparound_rule"] == "cubes":
        full = math.prod(shape) >= 64 and all(s % 4 == 0 for s in shape)
        return tuple(full and s > 1 for s in shape)
    n = ici.get("full_axis_length", 16)
    return tuple(s == n for s in shape)


def _tpu(name: str, prof: dict[str, Any], where: str, count: str) -> tuple[int, Torus]:
    naming, ici, chip = prof["naming"], prof["ici"], prof["chip"]
    ndim = 3 if ici["topology"] == "torus3d" else 2
    if "x" in count:
        shape = tuple(int(s) for s in count.split("x"))
        if len(shape) != ndim:
            raise HardwareError(
                f"hardware {name!r}: {prof['']['family']} is a {ndim}-D torus, got topology {count}"
            )
        chips = math.prod(shape)
    else:
        n = int(count)
        per = chip.get("cores_per_chip", 1) if naming["counts"] == "cores" else 1
        if n % per:
            raise HardwareError(
                f"hardware {name!r}: {prof['']['family']} slice names count TensorCores ({per} per chip); {n} is not a multiple of {per}"
            )
        chips = n // per
        if chips & (chips - 1):
            shape = _cube_multiple(chips, ndim) if ici["wraparound_rule"] == "cubes" else None
            if shape is None:
                raise HardwareError(
                    f"hardware {name!r}: {chips} chips is not a power of two; give the topology instead, e.g. {prof['']['family']}-{'x'.join(['4'] * ndim)}"
                )
        else:
            shape = _torus_shape(chips, ndim)
    if chips > naming["max_chips"]:
        raise HardwareError(
            f"hardware {name!r}: {chips} chips exceeds the largest {prof['']['family']} slice ({naming['max_chips']} chips, {where})"
        )
    dcn = prof.get("dcn", {})
    return chips, Torus(
        shape, _wraparound(prof, shape), ici["link_bandwidth"], ici["latency_s"],
        dcn.get("bandwidth_per_chip"), 1, dcn.get("latency_s", DCN_LATENCY_S),
    )  # fmt: skip


def _gpu(name: str, prof: dict[str, Any], n: int) -> Cluster:
    nv, net = prof["nvlink"], prof["network"]
    per = nv["domain_size"]
    if n > per and n % per:
        raise HardwareError(
            f"hardware {name!r}: {n} GPUs is not a whole number of {per}-GPU NVLink domains"
        )
    if n > prof["naming"]["max_chips"]:
        raise HardwareError(
            f"hardware {name!r}: {n} GPUs exceeds the profile's largest cluster ({prof['naming']['max_chips']})"
        )
    nodes, per_node = (1, n) if n <= per else (n // per, per)
    return Cluster(
        nodes,
        per_node,
        nv["bandwidth"],
        nv["latency_s"],
        net["bandwidth_per_gpu"],
        net["latency_s"],
    )


def _build(
    name: str, prof: dict[str, Any], where: str, count: str | None, file: bool = False
) -> Hardware:
    top = prof[""]
    kind = top["kind"]
    c = prof["chip"]
    chip = Chip(
        dict(c["peak_flops"]), c["hbm_bytes"], c["hbm_bandwidth"], c.get("cores_per_chip", 1),
        c.get("host_bandwidth"),
    )  # fmt: skip
    e = prof["efficiency"]
    eff = Efficiency(
        e["matmul"], e["memory"], e["collective"], e["overlap"], e["memory_headroom"],
        e.get("attention"), e.get("attention_call_s", 0.0), e.get("conv3d"),
        e.get("kernel_s", 0.0), e.get("scan_stack_passes", 0.0),
        e.get("scan_stacks_at_start", False), e.get("remat_barriers", True),
        e.get("select_and_scatter_expanded", False), e.get("weight_gradient_copies", False),
        e.get("depthwise_gradient_dense", False), e.get("ragged_dot_dense", False),
    )  # fmt: skip
    if count is None:
        if "devices" not in top:
            if kind == "tpu" and not file:
                raise HardwareError(
                    f"hardware {name!r}: a TPU name needs a slice size, e.g. {top['family']}-8; {NAMING_RULE}"
                )
            if file or kind == "tpu":
                raise HardwareError(
                    f"{where}: how many devices? pass --devices N (devices=N in Python), or "
                    f"put devices = N at the top of the file"
                )
        count = str(top.get("devices", 1))
    if kind == "tpu":
        n, topo = _tpu(name, prof, where, count)
    elif kind == "gpu":
        n = int(count)
        topo = _gpu(name, prof, n)
    else:
        n = int(count)
        h = prof["host"]
        topo = Cluster(1, n, h["bandwidth"], h["latency_s"])
    if n < 1:
        raise HardwareError(f"hardware {name!r}: needs at least one device")
    return Hardware(
        name,
        top["family"],
        kind,
        n,
        chip,
        topo,
        eff,
        where,
        top.get("description", ""),
        top.get("approximate", False),
    )


def hardware(name: str | Path, devices: int | None = None) -> Hardware:
    """A slice or cluster by the name its users write, or a profile file.

    ``devices`` gives the device count where the name does not (a profile file without a
    ``devices = N`` key, a family name such as ``h100``); a count given twice that disagrees
    is an error, and so is a profile file with no count at all.

    Example:
      >>> import autolayout as al
      >>> al.hardware("tpu-v4-256").num_devices, al.hardware("tpu-v4-256").topology.shape
      (128, (4, 4, 8))
      >>> al.hardware("h100-64").topology.nodes
      8
    """
    s = str(name)
    if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int)
                                or devices < 1):  # fmt: skip
        raise HardwareError(f"--devices must be a positive integer, got {devices!r}")
    if s.endswith(".toml") or "/" in s or Path(s).is_file():
        p = Path(s)
        prof = load_profile(p)
        given = prof[""].get("devices")
        if devices is not None and given is not None and int(given) != devices:
            raise HardwareError(
                f"{_shown(p)} says devices = {given} and --devices says {devices}: give one"
            )
        count = str(devices) if devices is not None else None
        return _build(p.stem, prof, _shown(p), count, file=True)
    multi = re.fullmatch(r"(\d+)x(tpu-.+|v\d.+)", s.lower())
    if multi:
        return _multislice(s, int(multi.group(1)), hardware(multi.group(2), devices))
    families = list_profiles()
    m = re.fullmatch(r"(.+?)(?:-(\d+(?:x\d+)*))?", s.lower())
    fam, count = (m.group(1), m.group(2)) if m else (s, None)
    if not fam.startswith(("tpu-", "cpu")) and f"tpu-{fam}" in families + list(_ALIASES):
        fam = f"tpu-{fam}"
    fam = _ALIASES.get(fam, fam)
    if fam not in families:
        raise HardwareError(
            f"unknown hardware {s!r}: known families are {', '.join(families)}; {NAMING_RULE}"
        )
    if devices is not None:
        if count is not None and count != str(devices):
            raise HardwareError(
                f"hardware {s!r} names {count} devices and --devices says {devices}: give one"
            )
        count = str(devices)
        s = s if m and m.group(2) else f"{s}-{devices}"
    path = _profile_dir() / f"{fam}.toml"
    return _build(s, load_profile(path), f"hw_profiles/{fam}.toml", count)


def _multislice(name: str, slices: int, one: Hardware) -> Hardware:
    """``2xtpu-v5p-256``: ``slices`` copies of a slice joined by the data-centre network
    (MaxText's multi-slice jobs); the slices are the outermost physical dimension."""
    t = one.topology
    if not isinstance(t, Torus) or slices < 1:
        raise HardwareError(f"hardware {name!r}: NxNAME joins TPU slices, e.g. 2xtpu-v5p-256")
    if slices > 1 and not t.dcn_bandwidth:
        raise HardwareError(
            f"hardware {name!r}: {one.source} gives no [dcn] bandwidth_per_chip to join slices by"
        )
    topo = replace(t, slices=slices * t.slices)
    return replace(one, name=name, num_devices=one.num_devices * slices, topology=topo)


def profile_sources(hw: Hardware) -> list[tuple[str, str]]:
    """``(section.key, the comment that sources it)`` for every figure of the profile file
    ``hw`` came from, in file order (the profile's header first)."""
    path = Path(hw.source)
    if not path.is_file():
        path = _profile_dir() / path.name
    if not path.is_file():
        return []
    out: list[tuple[str, str]] = []
    section = ""
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("[") and text.endswith("]"):
            section = text[1:-1] + "."
        elif text.startswith("#") and not out and section == "":
            out.append(("(profile)", text.lstrip("# ")))
        elif "=" in text and "#" in text:
            key = text.split("=", 1)[0].strip()
            out.append((section + key, text.split("#", 1)[1].strip()))
    return out
