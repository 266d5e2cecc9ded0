"""``Plan``: a layout with its predicted cost, as tables, and as a versioned JSON file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from ._atomic import atomic_write
from ._errors import HardwareError, PlanError
from ._hardware import hardware
from ._layout import Layout, mesh_text, mfu_text, partition_spec
from ._report import figures, html_page, html_summary, report_frame

PLAN_VERSION = 1
STATUSES = ("OPTIMAL", "FEASIBLE", "TIMEOUT", "INFEASIBLE", "EVALUATED")


def _layout_json(layout: Layout) -> list[list[str]]:
    return [list(a) for a in layout]


def _layout_from(x: Any) -> Layout:
    return tuple(tuple(str(a) for a in axes) for axes in x)


@dataclass
class Plan:
    """A layout of one workload on one mesh of one hardware profile, with its prediction.

    ``summary()``, ``report()`` and ``collectives()`` read it; ``to_json``/``Plan.load`` keep
    it; ``al.apply`` runs it; ``al.validate`` checks it against what XLA compiles.
    """

    status: str
    model: str
    hardware: str
    mesh: dict[str, int]
    rules_: list[tuple[str, tuple[str, ...]]]
    inputs: list[dict[str, Any]]  # path, shape, dtype, dims, layout (flattened argument order)
    layouts: dict[str, Layout]  # every tensor of the traced step
    predicted: dict[str, Any]
    ops: list[dict[str, Any]]  # report rows
    collectives_: list[dict[str, Any]]
    solver: dict[str, Any] = field(default_factory=dict)
    # op -> {input tensor: layout} where an op reads a tensor in another layout than it has
    reads: dict[str, dict[str, Layout]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # the layout of each step output (flattened order): a donated input's where it takes one's
    # buffer, so outputs are the next step's inputs as they are
    outputs: list[Layout] = field(default_factory=list)
    workload: Any = field(default=None, repr=False, compare=False)
    graph: Any = field(default=None, repr=False, compare=False)
    # the search's request on the plan's mesh while its ``al.plan`` call lasts (the call may
    # tighten the plan's bound with the budget the search left), then None
    request: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise PlanError(
                f"plan status must be one of {', '.join(STATUSES)}, got {self.status!r}"
            )

    # --- reading ------------------------------------------------------------------------
    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())

    def summary(self) -> dict[str, Any]:
        """Predicted step time (s), its compute and communication parts, FLOPs and memory per
        device, MFU, and where the plan came from."""
        return {
            "status": self.status,
            "model": self.model,
            "hardware": self.hardware,
            "mesh": dict(self.mesh),
            "devices": self.devices,
            **self.predicted,
        }

    def report(self, by: str | None = None):
        """One row per op: what it computes, how it is split, what it costs per device.

        Columns: ``op`` (its name), ``kind`` (the primitive), ``layer`` (the ``jax.named_scope``
        or, without one, the parameters it reads), ``scope``, ``dims``, ``strategy`` (dim:mesh
        axes), ``trips`` (executions a step), per execution and device ``flops``, ``bytes``
        (HBM traffic), ``compute_s``, ``comm_s``, then ``time_s`` (compute + comm, all
        executions of a step), ``collective`` (kinds) and ``memory`` (bytes of its outputs on
        one device).

        ``by="layer"`` or ``by="kind"`` (or any column) sums per group over a step: ``ops``,
        ``flops``, ``bytes``, ``compute_s``, ``comm_s``, ``time_s`` and ``share`` of the
        summed time, costliest first.
        """
        return report_frame(self, by)

    def collectives(self):
        """One row per collective of one op execution (``count`` executions a step);
        ``time_s`` is one execution's; ``combined``: XLA merges it with others of its kind
        (the state's gathers and reductions), so it paid its share of one latency."""
        import pandas as pd  # heavy (pandas): only where a table is asked for

        cols = ["op", "kind", "axes", "bytes", "time_s", "count", "tensor", "why", "combined"]
        return pd.DataFrame(self.collectives_, columns=cols)

    def figures(self, by: str = "layer") -> dict[str, Any]:
        """Matplotlib figures (no display needed): ``step_time`` (compute and communication
        per collective kind, per ``by`` group), ``mesh_shapes`` (each shape tried, the chosen
        one marked), ``memory`` (per device by category against HBM), ``roofline`` (ops on the
        chip's roofline)."""
        return figures(self, by)

    def _repr_html_(self) -> str:
        return html_summary(self)

    def to_html(self, path: str | Path | None = None) -> str:
        """One self-contained HTML page (tables and embedded figures, no network); written to
        ``path`` when given."""
        page = html_page(self)
        if path is not None:
            atomic_write(path, page)
        return page

    def rules(self) -> list[tuple[str, tuple[str, ...]]]:
        """Mesh-TF layout rules, ``[(dim, (mesh axis, ...)), ...]`` (MaxText's format)."""
        return [(d, tuple(a)) for d, a in self.rules_]

    def logical_axis_rules(self) -> list[tuple[str, str | tuple[str, ...] | None]]:
        """The rules as Flax/MaxText ``logical_axis_rules``: ``[(dim, mesh axis | (axes, ...)
        | None), ...]``, the plan's rules first, then every other dim of the inputs as
        ``None`` (replicated), for ``flax.linen.logical_axis_rules`` /
        ``nn.logical_to_mesh_sharding`` unchanged. Inputs the rules do not lay out (the
        solver's ``exceptions``) are not expressible as rules: ``partition_specs()`` has them.
        """
        out: list[tuple[str, str | tuple[str, ...] | None]] = []
        seen = set()
        for d, axes in self.rules():
            out.append((d, axes[0] if len(axes) == 1 else tuple(axes)))
            seen.add(d)
        for i in self.inputs:
            for d in i["dims"]:
                if d is not None and d not in seen:
                    out.append((d, None))
                    seen.add(d)
        return out

    def partition_specs(self, workload: Any = None):
        """A pytree of ``PartitionSpec`` matching the workload's arguments."""
        wl = workload or self.workload
        specs = [partition_spec(i["layout"]) for i in self.inputs]
        if wl is None:
            return {i["path"]: s for i, s in zip(self.inputs, specs, strict=True)}
        treedef = jax.tree_util.tree_structure(wl.args)
        if treedef.num_leaves != len(specs):
            raise PlanError(
                f"plan for {self.model!r} has {len(specs)} inputs, workload {wl.name!r} has "
                f"{treedef.num_leaves}"
            )
        return jax.tree_util.tree_unflatten(treedef, specs)

    def out_partition_specs(self, workload: Any = None):
        """A pytree of ``PartitionSpec`` matching the step's outputs (``out_shardings``):
        new state in its input's layout, so the outputs feed the next step unchanged."""
        wl = workload or self.workload
        specs = [partition_spec(lay) for lay in self.outputs]
        if not specs:
            raise PlanError(
                f"the plan for {self.model!r} has no output layouts (written by an older "
                "autolayout): re-run the planner"
            )
        if wl is None:
            return specs
        tree = jax.tree_util.tree_structure(jax.eval_shape(wl.fn, *wl.args))
        if tree.num_leaves != len(specs):
            raise PlanError(
                f"plan for {self.model!r} has {len(specs)} outputs, workload {wl.name!r} has "
                f"{tree.num_leaves}"
            )
        return jax.tree_util.tree_unflatten(tree, specs)

    def __repr__(self) -> str:
        s = self.predicted
        mesh = mesh_text(self.mesh)
        return (
            f"Plan({self.status}, {self.model} on {self.hardware}, mesh {mesh}, "
            f"step {s.get('step_time_s', float('nan')):.4g} s, mfu {mfu_text(s.get('mfu', float('nan')))})"
        )

    # --- files --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PLAN_VERSION,
            "status": self.status,
            "model": self.model,
            "options": self.options,
            "hardware": self.hardware,
            "mesh": {"axes": dict(self.mesh), "devices": self.devices},
            "rules": [[d, list(a)] for d, a in self.rules_],
            "inputs": [
                {
                    "path": i["path"],
                    "shape": list(i["shape"]),
                    "dtype": i["dtype"],
                    "dims": list(i["dims"]),
                    "spec": _layout_json(i["layout"]),
                }
                for i in self.inputs
            ],
            "outputs": [_layout_json(lay) for lay in self.outputs],
            "predicted": self.predicted,
            "collectives": [
                {
                    "op": c["op"],
                    "kind": c["kind"],
                    "axes": list(c["axes"]),
                    "bytes_per_device": c["bytes"],
                    "time_s": c["time_s"],
                    "count": c["count"],
                    "tensor": c["tensor"],
                    "why": c["why"],
                    "combined": bool(c.get("combined", False)),
                }
                for c in self.collectives_
            ],
            "solver": self.solver,
            "layouts": {t: _layout_json(lay) for t, lay in self.layouts.items()},
            "reads": {
                op: {t: _layout_json(lay) for t, lay in r.items()} for op, r in self.reads.items()
            },
            "ops": self.ops,
        }

    def to_json(self, path: str | Path) -> None:
        """Writes the plan file (atomically: a reader sees the old plan or the new one)."""
        atomic_write(path, dumps(self.to_dict()))

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "plan") -> Plan:
        if not isinstance(d, dict) or "version" not in d:
            raise PlanError(f"{source}: not an autolayout plan (no 'version' field)")
        if d["version"] != PLAN_VERSION:
            raise PlanError(
                f"{source}: plan format version {d['version']!r}; this autolayout reads version "
                f"{PLAN_VERSION} (re-run `autolayout plan` to write a new one)"
            )
        check_plan_file(d, source)
        try:
            return cls(
                status=d["status"],
                model=d["model"],
                hardware=d["hardware"],
                mesh={str(k): int(v) for k, v in d["mesh"]["axes"].items()},
                rules_=[(r[0], tuple(r[1])) for r in d["rules"]],
                inputs=[
                    {
                        "path": i["path"],
                        "shape": tuple(i["shape"]),
                        "dtype": i["dtype"],
                        "dims": tuple(i["dims"]),
                        "layout": _layout_from(i["spec"]),
                    }
                    for i in d["inputs"]
                ],
                outputs=[_layout_from(v) for v in d.get("outputs", [])],
                layouts={t: _layout_from(v) for t, v in d.get("layouts", {}).items()},
                reads={
                    op: {t: _layout_from(v) for t, v in r.items()}
                    for op, r in d.get("reads", {}).items()
                },
                predicted=dict(d["predicted"]),
                ops=list(d.get("ops", [])),
                collectives_=[
                    {
                        "op": c["op"],
                        "kind": c["kind"],
                        "axes": tuple(c["axes"]),
                        "bytes": c["bytes_per_device"],
                        "time_s": c["time_s"],
                        "count": c.get("count", 1),
                        "tensor": c.get("tensor", ""),
                        "why": c.get("why", ""),
                        "combined": bool(c.get("combined", False)),
                    }
                    for c in d["collectives"]
                ],
                solver=dict(d.get("solver", {})),
                options=dict(d.get("options", {})),
            )
        except (KeyError, TypeError, IndexError, ValueError) as e:
            if isinstance(e, PlanError):
                raise
            raise PlanError(f"{source}: corrupted plan ({type(e).__name__}: {e})") from e

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise PlanError(f"{p}: no such plan file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PlanError(f"{p}: corrupted plan file, not JSON ({e})") from None
        return cls.from_dict(d, str(p))


# a section with more entries than this is written an entry a line, each compact (Python's
# C encoder, which an indent turns off: 16 MB of a 96-layer plan took 3.2 s indented)
LONG = 64


def dumps(d: dict[str, Any]) -> str:
    """A plan file's text: a top-level field a line; a long section an entry a line, so a
    diff of two plans names the tensors and ops that differ; short ones indented."""

    compact = _compact()
    parts = []
    for k, v in d.items():
        if isinstance(v, dict) and len(v) > LONG:
            body = (
                "{\n" + ",\n".join(f"  {compact(a)}: {compact(b)}" for a, b in v.items()) + "\n }"
            )
        elif isinstance(v, list) and len(v) > LONG:
            body = "[\n" + ",\n".join(f"  {compact(x)}" for x in v) + "\n ]"
        else:
            body = json.dumps(v, indent=1, default=_jsonable).replace("\n", "\n ")
        parts.append(f" {compact(k)}: {body}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _compact() -> Callable[[Any], str]:
    """One value's JSON text on one line, as ``json.dumps(v, separators=(", ", ": "))``
    writes it, by json's C encoder made once (``json.dumps`` makes one a call: 0.2 of the
    0.6 s of a 96-layer plan's 100k entries); ``json.dumps`` where Python has none."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return lambda v: json.dumps(v, default=_jsonable, separators=(", ", ": "))
    enc = make(None, _jsonable, json.encoder.encode_basestring_ascii, None, ": ", ", ",
               False, False, True)  # fmt: skip
    return lambda v: "".join(enc(v, 0))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    raise TypeError(f"cannot write {type(x).__name__} to a plan file")


# --- the plan file's schema ------------------------------------------------------------------
_FIX = "re-run `autolayout plan` (or `evaluate`) to write it again"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _finite_numbers(x: Any, where: str) -> str | None:
    """The first number under ``x`` (nested dicts and lists) that is not finite, named."""
    if _number(x):
        return None if math.isfinite(x) else f"{where} is {x}"
    if isinstance(x, dict):
        items = x.items()
    elif isinstance(x, list):
        items = ((str(i), v) for i, v in enumerate(x))
    else:
        return None
    for k, v in items:
        bad = _finite_numbers(v, f"{where}.{k}")
        if bad:
            return bad
    return None


def _spec_problem(spec: Any, mesh: dict[str, Any], shape: Any = None) -> str | None:
    """What is wrong with one layout (a list per tensor axis of mesh axis names), or None."""
    if not isinstance(spec, list) or not all(isinstance(a, list) for a in spec):
        return f"layout {spec!r} is not a list of mesh-axis lists"
    if shape is not None and len(spec) != len(shape):
        return f"layout {spec!r} has {len(spec)} axes for a tensor of rank {len(shape)}"
    used = [a for axes in spec for a in axes]
    for a in used:
        if a not in mesh:
            return f"layout {spec!r} names mesh axis {a!r}, which the mesh lacks"
    dup = sorted({a for a in used if used.count(a) > 1})
    if dup:
        return f"layout {spec!r} uses mesh axis {dup[0]!r} twice"
    if shape is not None:
        for size, axes in zip(shape, spec, strict=True):
            parts = math.prod(mesh[a] for a in axes)
            if parts > 1 and size % parts:
                return f"layout {spec!r}: size {size} does not split into {parts}"
    return None


def check_plan_file(d: dict[str, Any], source: str = "plan") -> None:
    """A plan file's contents against its schema, before anything reads them: mesh sizes
    positive integers whose product is the stated device count and the hardware's, every
    rule's dim carried by an input and its axes in the mesh, each input's layout one entry
    per axis of its shape naming mesh axes that divide it, every number finite. Raises
    :class:`PlanError`, one line naming the file, the field and the fix."""

    def bad(what: str, fix: str = _FIX) -> PlanError:
        return PlanError(f"{source}: {what}; {fix}")

    for key in ("status", "model", "hardware", "mesh", "rules", "inputs", "predicted",
                "collectives"):  # fmt: skip
        if key not in d:
            raise bad(f"corrupted plan (no {key!r} field)")
    mesh_d = d["mesh"]
    if not isinstance(mesh_d, dict) or not isinstance(mesh_d.get("axes"), dict):
        raise bad("corrupted plan ('mesh' has no 'axes')")
    mesh = mesh_d["axes"]
    for name, size in mesh.items():
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise bad(
                f"mesh axis {name!r} has size {size!r}; mesh axis sizes are positive integers"
            )
    devices = math.prod(mesh.values())
    stated = mesh_d.get("devices", devices)
    shown = mesh_text(mesh) or "(no axes)"
    if stated != devices:
        raise bad(f"the mesh {shown} has {devices} devices and the file says {stated!r}")
    try:
        hw = hardware(str(d["hardware"]))
    except HardwareError:
        hw = None  # a profile file not here, or a name this version lacks: not checked
    if hw is not None and hw.num_devices != devices:
        raise bad(
            f"the mesh {shown} has {devices} devices and {d['hardware']} has {hw.num_devices}",
            "plan for that hardware again (`autolayout run --rescale` shrinks a plan's mesh "
            "to the devices it runs on)",
        )
    inputs = d["inputs"]
    if not isinstance(inputs, list):
        raise bad("corrupted plan ('inputs' is not a list)")
    dims: set[str] = set()
    for i in inputs:
        if not isinstance(i, dict) or not {"path", "shape", "dims", "spec"} <= set(i):
            raise bad(f"corrupted plan (an input without path, shape, dims and spec: {i!r:.80})")
        shape, path = i["shape"], i["path"]
        if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
        ):
            raise bad(f"input {path}: shape {shape!r} is not a list of sizes")
        if not isinstance(i["dims"], list) or len(i["dims"]) != len(shape):
            raise bad(f"input {path}: dims {i['dims']!r} for a shape of rank {len(shape)}")
        dims.update(x for x in i["dims"] if isinstance(x, str))
        problem = _spec_problem(i["spec"], mesh, shape)
        if problem:
            raise bad(f"input {path}: {problem}")
    for op in d.get("ops", []):  # the step's other dims (a rule may split an activation's)
        if isinstance(op, dict) and isinstance(op.get("dims"), str):
            dims.update(op["dims"].split(","))
    rules = d["rules"]
    if not isinstance(rules, list):
        raise bad("corrupted plan ('rules' is not a list)")
    for r in rules:
        if not (isinstance(r, list) and len(r) == 2 and isinstance(r[0], str)
                and isinstance(r[1], list)):  # fmt: skip
            raise bad(f"rule {r!r} is not [dim, [mesh axes]]")
        if inputs and r[0] not in dims:
            raise bad(f"rule {r[0]} -> {'+'.join(map(str, r[1]))} names dim {r[0]!r}, which {d['model']} "
                      "lacks")  # fmt: skip
        for a in r[1]:
            if a not in mesh:
                raise bad(f"rule {r[0]} -> {'+'.join(map(str, r[1]))} names mesh axis {a!r}, "
                          f"which the mesh {shown} lacks")  # fmt: skip
    for k, out in enumerate(d.get("outputs", [])):
        problem = _spec_problem(out, mesh)
        if problem:
            raise bad(f"output {k}: {problem}")
    for c in d["collectives"]:
        if not isinstance(c, dict):
            raise bad(f"corrupted plan (a collective {c!r:.60})")
        for a in c.get("axes", []):
            if a not in mesh:
                raise bad(f"collective of {c.get('op')} runs over mesh axis {a!r}, which the "
                          f"mesh {shown} lacks")  # fmt: skip
        for key in ("bytes_per_device", "time_s"):
            v = c.get(key, 0)
            if not _number(v) or v < 0:
                raise bad(f"collective of {c.get('op')}: {key} {v!r} is not a size >= 0")
    predicted = d["predicted"]
    if not isinstance(predicted, dict) or not _number(predicted.get("step_time_s")):
        raise bad("corrupted plan ('predicted' has no step_time_s)")
    for key, v in predicted.items():
        if _number(v) and v < 0 and (key.endswith("_s") or "bytes" in key or "flops" in key):
            raise bad(f"predicted {key} is {v}, below zero")
    for key in ("predicted", "collectives", "ops"):
        problem = _finite_numbers(d.get(key), key)
        if problem:
            raise bad(f"{problem}: every number in a plan is finite")
