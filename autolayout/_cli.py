"""The ``autolayout`` command line (click). Bad input is one line on stderr, exit 2;
``--debug`` shows the traceback instead."""

from __future__ import annotations

import ast
import collections
import functools
import json
import os
import shutil
import sys
import textwrap
import time
from typing import Any

import click
import jax
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from .core import (
    ACCUMULATION,
    DEFAULT_GAP,
    DEFAULT_REMAT,
    DEFAULT_SCHEDULE,
    DEFAULT_TIME_LIMIT_S,
    AutolayoutError,
    ModelFileError,
    Plan,
    PlanError,
    accumulation_for_plan,
    atomic_write,
    axes_in_use,
    check_gap,
    check_limit,
    check_writable,
    diff,
    frame_text,
    gc_paused,
    hardware,
    inner_splits,
    list_profiles,
    load_workload,
    mesh_text,
    mfu_text,
    profile_sources,
    remat_for_plan,
    report_text,
    rule_lines,
    shown_ops,
    shown_strategies,
    status_text,
    trace,
    whole_sorts,
)
from .cost_models import evaluate, kernel_notes
from .runtime import (
    HEARTBEAT_S,
    KEEP,
    MEMORY_TOLERANCE,
    SUPERVISED,
    calibrate,
    cluster_identity,
    detect_cluster,
    init_distributed,
    run,
    supervise,
    validate,
    write_profile,
)
from .search import WORK_SHARE, standard_layout, stoppable
from .search import compare as search_compare
from .search import mark as mark_interrupted
from .search import plan as search_plan


def parse_sets(items: tuple[str, ...]) -> dict[str, Any]:
    """``("size=gpt3-175b", "layers=4", "scan=true")`` -> ``{"size": "gpt3-175b", "layers": 4, "scan": True}``."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        low = raw.lower()
        if low in ("true", "false"):
            value: Any = low == "true"
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                value = raw
        out[key.strip()] = value
    return out


_set_option = click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option for the model's workload().",
)


_HW_HELP = "Hardware: a name (tpu-v4-256, h100-64, cpu-8) or a profile file (mine.toml)."
_devices_option = click.option(
    "--devices",
    "hw_devices",
    type=int,
    help="The device count, where --hw does not give one (a profile file without devices = N).",
)


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AutolayoutError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C outside a search (a search ends with its plan)
            click.echo("autolayout: interrupted (SIGINT)", err=True)
            sys.exit(130)
        except BrokenPipeError:  # the reader left (`autolayout plan ... | head`): stop quietly
            try:
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter's flush at exit
            except OSError:
                pass
            sys.exit(0)
        except Exception as e:  # a bug of ours or of a library: one line, not a traceback
            if ctx.obj and ctx.obj.get("debug"):
                raise
            text = " ".join(str(e).split())
            text = text if len(text) <= 300 else text[:300] + " ..."
            click.echo(
                f"error: {type(e).__name__}: {text} (an unexpected failure: `autolayout --debug "
                "...` shows the traceback, worth a bug report)",
                err=True,
            )
            sys.exit(3)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(package_name="autolayout")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """autolayout: choose how to split every tensor of a JAX training step, and the mesh."""
    ctx.obj = {"debug": debug}


@main.command("hw")
@click.argument("name", required=False)
def hw_cmd(name: str | None) -> None:
    """List hardware profiles, or show one slice/cluster (e.g. tpu-v4-256, h100-64) with
    the source of each figure."""
    if name:
        hw = hardware(name)
        for line in hw.describe().splitlines():
            _echo(line)
        _echo("sources (docs/hardware-facts.md collects them):")
        for key, source in profile_sources(hw):
            _echo(f"  {key}: {source}")
        return
    click.echo(f"{'family':<14} {'kind':<5} {'bf16 FLOP/s':>12} {'HBM GiB':>8}  example")
    for fam in list_profiles():
        h = hardware(f"{fam}-8" if fam.startswith("tpu") else fam)
        example = {"tpu": f"{fam}-256", "gpu": f"{fam}-64", "cpu": "cpu-8"}[h.kind]
        bf16 = h.chip.peak_flops.get("bf16", max(h.chip.peak_flops.values()))
        approx = " (approximate)" if h.approximate else ""
        click.echo(
            f"{fam:<14} {h.kind:<5} {bf16:>12.3g} {h.chip.hbm_bytes / 2**30:>8.1f}  {example}{approx}"
        )


@main.command("calibrate")
@click.option("--devices", "n_devices", type=int,
              help="Measure the first N devices (default: all JAX finds; on a CPU set "
              "XLA_FLAGS=--xla_force_host_platform_device_count=N first).")  # fmt: skip
@click.option("--base", type=click.Path(dir_okay=False),
              help="The profile to start from (default: the shipped one of these devices).")  # fmt: skip
@click.option("--quick", is_flag=True, help="Small shapes: seconds, to see it work.")
@click.option("--out", default="measured.toml", show_default=True,
              type=click.Path(dir_okay=False), help="The profile file to write.")  # fmt: skip
def calibrate_cmd(n_devices, base, quick, out) -> None:
    """Measure these devices (matmuls, HBM, attention, convolutions, collectives on every
    mesh axis) into a hardware profile file that plans like any other."""
    check_writable(out)
    devices = jax.devices()
    if n_devices is not None:
        if n_devices < 1 or n_devices > len(devices):
            raise click.UsageError(
                f"--devices {n_devices}: JAX finds {len(devices)} {devices[0].platform} "
                "device(s); on a CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N"
            )
        devices = devices[:n_devices]
    prof = calibrate(devices, base=base, quick=quick,
                     progress=lambda s: click.echo(f"measuring {s}...", err=True))  # fmt: skip
    path = write_profile(prof, out)
    hw = hardware(str(path))
    for line in hw.describe().splitlines():
        _echo(line)
    _echo(f"wrote {path}: plan with --hw {path}")


@main.command("trace")
@click.argument("model", type=click.Path(dir_okay=False))
@_set_option
def trace_cmd(model: str, sets: tuple[str, ...]) -> None:
    """Trace MODEL.py's train step: named dims with sizes, op counts by kind, opaque ops."""
    wl = load_workload(model, **parse_sets(sets))
    g = trace(wl)
    families = g.families
    click.echo(
        f"{g.name}: {len(g.ops)} ops, {len(g.inputs)} inputs, {g.total_flops:.4g} FLOPs per step"
    )
    click.echo("\ndims:")
    for name, d in g.dim_info.items():
        fam = families[d.family]
        note = f"  (family {d.family}: {', '.join(fam)})" if len(fam) > 1 else ""
        src = "" if d.user else "  [inferred]"
        click.echo(f"  {name:<28} {d.size:>8}{src}{note}")
    click.echo("\nops by kind:")
    counts = collections.Counter(op.primitive for op in g.ops)
    for prim, n in counts.most_common():
        click.echo(f"  {prim:<28} {n:>8}")
    for loop in g.loops:
        click.echo(
            f"\n{loop.kind} {loop.name}: {len(loop.ops)} body ops x {loop.length if loop.length_known else '?'} trips"
        )
    click.echo(f"\nopaque ops: {len(g.opaque)}")
    for op in g.opaque:
        click.echo(f"  {op.name}: {op.param('reason')}")


def parse_pairs(text: str | None, what: str) -> list[tuple[str, str]]:
    """``"data=16,model=8"`` -> ``[("data", "16"), ("model", "8")]``, in order."""
    out = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise click.BadParameter(
                f"expected NAME=VALUE[,NAME=VALUE...], got {item!r}", param_hint=what
            )
        out.append((key.strip(), value.strip()))
    return out


def parse_axes(text: str | None, what: str) -> dict[str, Any]:
    """``"data=16,model=8"`` -> ``{"data": "16", "model": "8"}``; a name given twice is
    refused (rules, whose dims may repeat, read :func:`parse_pairs`)."""
    out: dict[str, Any] = {}
    for key, value in parse_pairs(text, what):
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice", param_hint=what)
        out[key] = value
    return out


def _mesh(text: str) -> dict[str, int]:
    mesh = parse_axes(text, "--mesh")
    try:
        return {k: int(v) for k, v in mesh.items()}
    except ValueError:
        raise click.BadParameter(
            f"mesh axis sizes are integers, got {text!r}", param_hint="--mesh"
        ) from None


def _width() -> int:
    """The terminal's columns (``COLUMNS`` where set; 80 where neither says)."""
    return max(60, shutil.get_terminal_size((80, 24)).columns)


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _gib(nbytes: float) -> str:
    """Bytes as GiB: three decimals, or three significant digits below 1 GiB (a small
    model's memory read 0.001 GiB against a 0.0008 GiB limit)."""
    g = nbytes / 2**30
    return f"{g:.3f}" if g >= 1 else f"{g:.3g}"


def _summary_lines(plan) -> list[str]:

    s = plan.summary()
    gib = 2**30
    w = _width()
    mesh = mesh_text(plan.mesh)
    used = axes_in_use(plan)
    unused = [a for a, n in plan.mesh.items() if n > 1 and a not in used]
    lines = [f"{plan.model} on {plan.hardware}: mesh {mesh}", f"status: {status_text(plan)}"]
    if unused:
        lines.append(f"  (mesh axis {', '.join(unused)} splits nothing: its devices repeat "
                     "the same work, which the cost model finds faster than splitting here)")  # fmt: skip
    rules = rule_lines(plan)
    lines.append("rules (how the inputs are split):" + ("" if rules else " none, all replicated"))
    lines += [_fit(f"  {r}", w) for r in rules]
    inner = inner_splits(plan)
    if inner:
        lines.append("also inside the step (activations the rules do not show):")
        lines += [_fit(f"  {r}", w) for r in inner]
    exceptions = (plan.solver or {}).get("exceptions", [])
    if exceptions:
        lines.append(
            f"exceptions: {len(exceptions)} inputs are laid out otherwise than the rules say "
            "(partition_specs() has them all; `autolayout report PLAN --exceptions` lists them)"
        )
    lines += [
        f"step time {s['step_time_s']:.4g} s (compute {s['compute_s']:.4g} s, communication "
        f"{s['comm_s']:.4g} s, exposed {s['exposed_comm_s']:.4g} s; no-overlap bound "
        f"{s['step_time_no_overlap_s']:.4g} s)",
        f"MFU {mfu_text(s['mfu'])}, memory {_gib(s['memory_bytes_per_device'])} GiB per device of "
        f"{s['memory_limit_bytes'] / gib:.3g} GiB{'' if s['fits'] else ' -- DOES NOT FIT'}",
    ]

    return [x for line in lines for x in _wrapped(line, w)]


def _wrapped(line: str, width: int) -> list[str]:
    """``line`` as lines of at most ``width`` columns, those after the first indented."""
    if len(line) <= width:
        return [line]
    lead = " " * (len(line) - len(line.lstrip()))
    return textwrap.wrap(line, width, subsequent_indent=lead + "    ", break_on_hyphens=False)


def _echo(line: str = "", err: bool = False) -> None:
    """``click.echo`` at the terminal's width (80 columns in tests)."""
    for x in _wrapped(line, _width()):
        click.echo(x, err=err)


def _collector_paused(command):
    """A command that builds a step's graph, prices or searches it and writes its plan, with
    Python's collector off to its end: each collection walked every graph, request and table
    kept (GPT-3 175B at 96 layers: 4 s of 21; the plan file's 100k lists 2.1 s with it, 1.0
    without). Run as the ``autolayout`` command, whose process ends next, what it made is
    frozen, not collected; in-process callers (tests') collect as usual."""

    @functools.wraps(command)
    def run_command(*args, **kwargs) -> None:
        with gc_paused(collect=not _AS_COMMAND[0]):
            command(*args, **kwargs)

    return run_command


@main.command("evaluate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--hw", "hw_name", required=True, help=_HW_HELP)
@_devices_option
@click.option("--mesh", "mesh_text", help="Mesh axes, e.g. data=16,model=8.")
@click.option(
    "--rules",
    "rules_text",
    help="Layout rules, e.g. batch=data,heads=model (a+b for several axes; a dim given again "
    "is its fallback where an earlier rule took the first one's axes).",
)
@click.option(
    "--layout",
    help="A standard layout instead: dp, fsdp, megatron, 2d, megatron_fsdp, spatial.",
)
@_set_option
@click.option("--out", type=click.Path(dir_okay=False), help="Write the plan file here.")
@_collector_paused
def evaluate_cmd(model, hw_name, hw_devices, mesh_text, rules_text, layout, sets, out) -> None:
    """Price one layout of MODEL.py on HW: given rules on a given mesh, or a standard layout."""

    if out:
        check_writable(out)
    hw = hardware(hw_name, hw_devices)
    wl = load_workload(model, target=hw, **parse_sets(sets))
    g = trace(wl)
    if layout:
        if mesh_text or rules_text:
            raise click.UsageError("give either --layout or --mesh/--rules, not both")
        mesh, rules = standard_layout(g, layout, hw.num_devices)
    else:
        if not mesh_text:
            raise click.UsageError("give --mesh (and --rules), or --layout")
        mesh = _mesh(mesh_text)
        rules = [(k, tuple(v.split("+"))) for k, v in parse_pairs(rules_text, "--rules")]
    plan = evaluate(wl, hw, mesh=mesh, rules=rules, graph=g)
    _print_plan(plan, out)


def _where(op: str, layer: str) -> str:
    """An op and where it is in the model: ``w1 grad (layers.3)``; ``(other)``, no layer,
    not nested in parentheses."""
    if not layer:
        return op
    return f"{op} {layer}" if layer.startswith("(") else f"{op} ({layer})"


def _print_plan(plan, out: str | None) -> None:
    for line in _summary_lines(plan):
        click.echo(line)
    top = plan.report().assign(t=lambda r: (r.compute_s + r.comm_s) * r.trips)
    rows = list(top.nlargest(3, "t").itertuples())
    looped = max((int(r.trips) for r in rows), default=1)
    _echo(
        "costliest ops (seconds a step"
        + (f"; an op in a layer loop summed over its {looped} trips)" if looped > 1 else ")")
        + ":"
    )
    w = _width()
    shown = shown_strategies([r.strategy for r in rows])
    what = shown_ops(plan)
    for r in rows:
        op = what.get(r.op, r.op)
        where = _where(op, r.layer)
        how = shown.get(r.strategy) or "replicated"
        line = f"  {where:<28} {r.t:.4g} s  {r.collective or '-':<12} {how}"
        click.echo(_fit(line, w))
    opaque = (plan.solver or {}).get("opaque") or []
    if opaque:
        share = sum(r["share"] for r in opaque)
        _echo(f"opaque ops: {len(opaque)}, {share:.1%} of the step (run whole on every device, "
              "as XLA runs an op it cannot partition):")  # fmt: skip
        for r in opaque[:3]:
            op = what.get(r["op"], r["op"])
            where = _where(op, r["layer"])
            _echo(f"  {where} {r['time_s']:.3g} s, {r['share']:.1%}: {r['reason']}")
    if out:
        plan.to_json(out)
        click.echo(f"plan written to {out}")


def _pipeline_lines(p) -> list[str]:
    """What a pipelined plan runs (its schedule, bubble and transfers), and what the search
    compared: the best plan with stages against the best without."""
    out = []
    pipe = p.solver.get("pipeline")
    if pipe:
        out.append(
            f"pipeline: {pipe['stages']} stages ({pipe['dim']} -> stage) x "
            f"{pipe['microbatches']} microbatches, {pipe['schedule']} schedule, bubble "
            f"{pipe['bubble']:.1%}; each stage {pipe['stage_mesh'] and mesh_text(pipe['stage_mesh'])}"
            f" runs a microbatch through its layers in {pipe['stage_microbatch_s']:.4g} s and "
            f"sends {pipe['transfer_bytes_per_microbatch'] / 2**20:.3g} MiB to the next over the "
            f"{pipe['link']} ({pipe['transfer_s_per_microbatch']:.3g} s)"
        )
    ch = p.solver.get("pipeline_choice")
    if ch:

        def side(d):
            fits = "fits" if d["fits"] else "does not fit"
            return (f"{mesh_text(d['mesh'])}: {d['step_time_s']:.4g} s, MFU {mfu_text(d['mfu'])}, "
                    f"{d['memory_bytes_per_device'] / 2**30:.3g} GiB ({fits})")  # fmt: skip

        if ch["with"] and ch["without"]:
            won = "with" if pipe else "without"
            out.append(f"with stages {side(ch['with'])}; without {side(ch['without'])}: "
                       f"chose {won}")  # fmt: skip
        elif ch["why_none"]:
            out.append(f"no pipeline: {ch['why_none']}")
    return out


class _Progress:
    """A progress bar (rich, on stderr) over the mesh shapes being seeded and solved."""

    def __init__(self) -> None:

        self.bar = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
            disable=not sys.stderr.isatty(),  # a log or a pipe gets no bar (nor its blank line)
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def __call__(self, event: dict[str, Any]) -> None:
        stage = event["stage"]
        label = {"seed": "hand layouts per mesh shape", "solve": "ILP on the best shapes"}[stage]
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(label, total=event["of"])
        mesh = "x".join(str(v) for v in event["mesh"].values())
        # the ILP refines near shapes past the best few: the total grows with them
        self.bar.update(self.tasks[stage], completed=event["done"],
                        total=max(event["of"], event["done"]), description=f"{label} ({mesh})")  # fmt: skip


def _stoppable(command):
    """A search command that the first SIGINT/SIGTERM ends with the best plan found so far
    (printed, and written where asked) and exit status 130/143; a second ends it at once
    (``search.interrupt``)."""

    @functools.wraps(command)
    def run_command(*args, **kwargs) -> None:
        with stoppable() as stop:
            try:
                command(*args, **kwargs)
            except SystemExit:  # an INFEASIBLE plan's status 1: the signal's comes first
                if stop.signal is None:
                    raise
            if stop.signal is not None:
                # exit while the handlers are in: a second signal during the interpreter's
                # shutdown met SIG_DFL and killed the process (status -2, not 130) under load
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(stop.exit_code)

    return run_command


def _checked_limits(time_limit: float, memory_limit: float | None = None) -> None:
    check_limit("--time-limit", time_limit, "seconds")
    if memory_limit is not None:
        check_limit("--memory-limit", memory_limit, "GiB")


def _plan_options(f):
    f = click.option(
        "--time-limit",
        "time_limit",
        default=DEFAULT_TIME_LIMIT_S,
        show_default=True,
        help="Seconds for the whole command, loading the model included (the search works "
        "half of it by default; the rest is a margin for a slower or busier machine).",
    )(f)
    f = _set_option(f)
    f = _devices_option(f)
    f = click.option("--hw", "hw_name", required=True, help=_HW_HELP)(f)
    return click.argument("model", type=click.Path(dir_okay=False))(f)


@main.command("plan")
@_plan_options
@click.option("--mesh", "mesh_text", help="Fix the mesh, e.g. data=16,model=8.")
@click.option("--memory-limit", type=float, help="GiB per device (default: HBM x headroom).")
@click.option("--objective", type=click.Choice(["time", "memory"]), default="time",
              show_default=True,
              help="Least step time that fits, or least memory per device (Mesh-TF's auto_mtf).")  # fmt: skip
@click.option("--deterministic/--wall-clock", default=True, show_default=True,
              help="Budget the search in work (the same plan on any machine and load; the "
                   "limit is a safety stop), or in the wall clock's seconds.")  # fmt: skip
@click.option("--remat", default=DEFAULT_REMAT, show_default=True,
              help="auto (the step as written where it fits, else the fastest remat policy that "
                   "fits: the candidates ranked on a share of the budget, the best searched "
                   "with the rest), as_written, or a policy: nothing_saveable, dots_saveable, "
                   "dots_with_no_batch_dims_saveable, save_only_these_names:NAME,NAME (values "
                   "tagged with jax.ad_checkpoint.checkpoint_name; auto tries the step's tags), "
                   "each with +regather (weights gathered again in the backward pass) and/or "
                   "+offload (what it saves kept in host memory, where the profile gives "
                   "chip.host_bandwidth), or regather.")  # fmt: skip
@click.option("--pipeline", is_flag=True,
              help="Also try pipeline stages: a scanned layer stack split over a 'stage' axis "
                   "(the slowest links), the batch cut into microbatches.")  # fmt: skip
@click.option("--stages", type=int, help="Pipeline stages (implies --pipeline).")
@click.option("--microbatches", type=int,
              help="Microbatches a step: with --pipeline/--stages the pipeline's; alone, "
                   "gradients accumulated over that many (a scan over microbatches).")  # fmt: skip
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]), default=DEFAULT_SCHEDULE,
              show_default=True,
              help="gpipe (what autolayout run runs) or 1f1b (priced as Megatron-LM runs it).")  # fmt: skip
@click.option("--gap", type=float, default=DEFAULT_GAP, show_default=True,
              help="Stop once the plan is proven within this fraction of the best possible "
                   "(0.02: 2%; 0: proven exactly, where the search can prove it).")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False), help="Write the plan file here.")
@_stoppable
@_collector_paused
def plan_cmd(model, hw_name, hw_devices, sets, time_limit, mesh_text, memory_limit, objective,
             deterministic, remat, pipeline, stages, microbatches, schedule, gap, out) -> None:  # fmt: skip
    """Choose the layout and the mesh shape of MODEL.py on HW (least predicted step time).
    The first Ctrl-C (or SIGTERM) ends the search with the best plan found so far (written
    to --out, exit status 130 or 143); a second stops at once."""
    # the time limit counts from here (loading the model too), or from the process's start
    # where this is the `autolayout` command (Python's imports too)
    started = time.perf_counter() - (_process_age() if _AS_COMMAND[0] else 0.0)
    _checked_limits(time_limit, memory_limit)
    check_gap("--gap", gap)
    if out:
        check_writable(out)
    hw = hardware(hw_name, hw_devices)
    wl = load_workload(model, target=hw, **parse_sets(sets))
    mesh = _mesh(mesh_text) if mesh_text else None
    limit = memory_limit * 2**30 if memory_limit is not None else None
    with _Progress() as progress:
        p = search_plan(wl, hw, mesh=mesh, memory_limit=limit, time_limit_s=time_limit, progress=progress,
                 objective=objective, deterministic=deterministic, remat=remat,
                 pipeline=pipeline, stages=stages,
                 microbatches=microbatches, schedule=schedule, started_at=started, gap=gap)  # fmt: skip
    mark_interrupted(p)
    if p.status == "INFEASIBLE":
        need = p.solver.get("least_memory_bytes", p.predicted["memory_bytes_per_device"])
        _echo(
            f"no layout found fits in {p.predicted['memory_limit_bytes'] / 2**30:.3g} GiB per "
            f"device; the least memory found needs {need / 2**30:.3g} GiB (shown below)",
            err=True,
        )
        copies = p.predicted["memory_by_category"].get("copies", 0)
        if copies > 0.25 * need:
            _echo(
                f"{copies / 2**30:.2f} GiB of it are resharded copies alive at the peak: XLA's "
                "partitioner keeps a weight gathered in the forward pass for the backward "
                "(it caches all-gathers); a layer stack under lax.scan gathers per layer",
                err=True,
            )
    _print_plan(p, out)
    if "lower_bound_s" in p.solver:
        _echo(
            f"bound: no layout on this mesh beats {p.solver['lower_bound_s']:.4g} s "
            f"({p.solver.get('bound_kind', 'a lower bound')}): this plan is within "
            f"{p.solver['gap']:.1%} of it"
        )
    for line in _pipeline_lines(p):
        _echo(line)
    acc = p.solver.get("accumulation")
    if acc and (acc["microbatches"] > 1 or acc["tried"]):  # where it was chosen or considered
        _echo(f"accumulation: {acc['microbatches']} microbatches ({acc['why']})")
    rm = p.solver.get("remat")
    if rm and (rm["policy"] != "as_written" or rm["tried"]):
        tried_text = "; ".join(
            f"{t['policy']}: {t['step_time_s']:.4g} s, {t['memory_bytes_per_device'] / 2**30:.3g} GiB"
            + ("" if t["fits"] else " (does not fit)")
            for t in rm["tried"] if "step_time_s" in t
        )  # fmt: skip
        k = acc["microbatches"] if acc else 1
        why = (
            "(as given)" if not rm["tried"]
            else f"(the step as written fits over {k} microbatches, not whole)"
            if rm["policy"] == "as_written" and k > 1
            else "(the step as written does not fit)"
        )  # fmt: skip
        _echo(
            f"remat: {rm['policy']} {why}" + ", recomputing "
            f"{rm['recompute_flops_per_device'] / 1e12:.3g} TFLOP per device per step"
            + (
                f"; each policy ranked on {rm.get('ranked_s', 0):.3g} s of the budget, then "
                + (
                    "the fastest that fits"
                    if p.predicted["fits"]
                    else "none fits: the least memory"
                )
                + f" searched with the rest: {tried_text}"
                if tried_text
                else ""
            )
        )
    for note in [*(kernel_notes(p.graph, hw) if p.graph is not None else ()), *whole_sorts(p)]:
        _echo(f"note: {note}")
    tried = p.solver["mesh_shapes_tried"]
    count = {k: sum(r.get("status") in ks for r in tried) for k, ks in (
        ("solved by the ILP", ("OPTIMAL", "FEASIBLE", "TIMEOUT", "INFEASIBLE")),
        ("ruled out by a lower bound", ("PRUNED",)),
        ("priced by hand layouts only", ("SEEDED",)),
        ("not reached in the time limit", ("SKIPPED",)),
    )}  # fmt: skip
    parts = ", ".join(f"{n} {what}" for what, n in count.items() if n)
    work = (
        f", {p.solver['work_s']:.1f} s of work of a {p.solver['time_limit_s'] * WORK_SHARE:.3g} s "
        "budget"
        if p.solver.get("deterministic")
        else ""
    )
    _echo(f"searched {len(tried)} mesh shapes ({parts}) in {p.solver['wall_s']:.1f} s{work}")
    if p.solver.get("source", "search") != "search":
        _echo(f"chosen: {p.solver['source']}")
    for axis, parts_of in p.solver.get("merged_axes", {}).items():
        _echo(f"mesh: {' x '.join(parts_of)} split only together in the plan found: one axis "
              f"{axis}={p.mesh[axis]} (the same devices in the same order)")  # fmt: skip
    if p.status == "INFEASIBLE":
        sys.exit(1)


@main.command("compare")
@_plan_options
@_stoppable
def compare_cmd(model, hw_name, hw_devices, sets, time_limit) -> None:
    """One table: the planner's layout beside DP, FSDP, Megatron, 2-D, Megatron+FSDP and
    (for convolutions) spatial partitioning."""

    _checked_limits(time_limit)
    hw = hardware(hw_name, hw_devices)
    wl = load_workload(model, target=hw, **parse_sets(sets))
    with _Progress() as progress:
        df = search_compare(wl, hw, time_limit_s=time_limit,
                     progress=progress)  # fmt: skip
    click.echo(
        f"{'layout':<14} {'mesh':<22} {'step s':>10} {'exposed comm':>12} {'GiB/dev':>9} "
        f"{'fits':>5} {'MFU':>6}"
    )
    for r in df[df.status != "SKIPPED"].itertuples():
        click.echo(
            f"{r.layout:<14} {r.mesh:<22} {r.step_time_s:>10.4g} {r.exposed_comm_share:>12.1%} "
            f"{r.memory_gib:>9.3g} {'yes' if r.fits else 'NO':>5} {r.mfu:>6.3f}"
        )
    for r in df[df.status == "SKIPPED"].itertuples():
        click.echo(_fit(f"{r.layout:<14} not priced: {r.note}", _width()))


@main.command("report")
@click.argument("plan_path", type=click.Path(dir_okay=False))
@click.option("--html", "html_out", type=click.Path(dir_okay=False),
              help="Write one self-contained HTML page (tables and figures) here.")  # fmt: skip
@click.option("--by", default="layer", show_default=True, help="Group the time by this column.")
@click.option("--top", default=10, show_default=True, help="Rows of the costliest ops.")
@click.option("--exceptions", "show_exceptions", is_flag=True,
              help="List the inputs the rules do not lay out, with their layouts.")  # fmt: skip
def report_cmd(plan_path, html_out, by, top, show_exceptions) -> None:
    """Read a plan file: its summary, the costliest ops, time per layer and per collective."""

    if html_out:
        check_writable(html_out, "--html")
    plan = Plan.load(plan_path)
    if by not in plan.report().columns:
        raise click.BadParameter(f"no column {by!r} in the report", param_hint="--by")

    w = _width()
    click.echo(report_text(plan, width=w, by=by, top=top, title=f"plan {plan_path}"))
    if show_exceptions:
        import pandas as pd  # heavy (pandas): only where a table is asked for

        rows = (plan.solver or {}).get("exceptions", [])
        layouts = ["(" + ", ".join("x".join(a) or "-" for a in lay) + ")" for _, lay in rows]
        frame = pd.DataFrame({"input": [p for p, _ in rows], "layout": layouts})
        click.echo("\n" + frame_text(frame, f"exceptions to the rules ({len(rows)} inputs; "
                                      "layout: mesh axes per tensor axis)", w))  # fmt: skip
    if html_out:
        plan.to_html(html_out)
        click.echo(f"HTML report written to {html_out}")


@main.command("diff")
@click.argument("plan_a", type=click.Path(dir_okay=False))
@click.argument("plan_b", type=click.Path(dir_okay=False))
@click.option("--top", default=10, show_default=True, help="Rows of ops and inputs shown.")
def diff_cmd(plan_a, plan_b, top) -> None:
    """Where two plans of one model split differently, and what each difference costs."""

    d = diff(Plan.load(plan_a), Plan.load(plan_b))
    w = _width()
    _echo(f"a = {plan_a}")
    _echo(f"b = {plan_b}")
    for df, title, index in (
        (d.summary, "a against b", None),
        (d.inputs.head(top), f"inputs laid out differently ({len(d.inputs)})", None),
        (d.ops.head(top), f"ops split differently ({len(d.ops)}), largest change first", None),
        (d.layers.head(top), "time per step by layer (s)", "layer"),
    ):
        click.echo("\n" + frame_text(df, title, w, index=index))


@main.command("run")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False))
@click.option("--steps", default=10, show_default=True,
              help="Train until this many steps are done (a resumed run counts the "
                   "checkpoint's).")  # fmt: skip
@click.option("--devices", type=int,
              help="Devices per process: on a CPU, this many fake devices (default: the plan's, "
                   "divided by the processes).")  # fmt: skip
@click.option("--rescale", is_flag=True,
              help="Keep the plan's rules and shrink its mesh axes to the devices here.")  # fmt: skip
@click.option("--seed", default=0, show_default=True, help="Seed of the state and the batches.")
@click.option("--coordinator", envvar="JAX_COORDINATOR_ADDRESS",
              help="HOST:PORT of process 0, for a multi-process run (jax.distributed); on "
                   "SLURM, Open MPI or a TPU pod the launcher's environment says it.")  # fmt: skip
@click.option("--num-processes", type=int, envvar="JAX_NUM_PROCESSES", help="Processes in all.")
@click.option("--process-id", type=int, envvar="JAX_PROCESS_ID", help="This process's index.")
@click.option("--join-timeout", default=120.0, show_default=True,
              help="Seconds a process waits for the others of a multi-process run.")  # fmt: skip
@click.option("--heartbeat-timeout", default=float(HEARTBEAT_S), show_default=True,
              help="Seconds after which a silent process is taken for dead by the others.")  # fmt: skip
@click.option("--checkpoint-dir", type=click.Path(file_okay=False),
              help="Save the state here (Orbax, sharded, in the background): every "
                   "--save-every steps, after the last step, and on SIGTERM.")  # fmt: skip
@click.option("--save-every", type=int, help="Steps between checkpoints.")
@click.option("--keep", default=KEEP, show_default=True, help="Checkpoints kept.")
@click.option("--resume", is_flag=True,
              help="Continue from the newest checkpoint in --checkpoint-dir (into this plan's "
                   "layout, whichever plan saved it); from step 0 where there is none.")  # fmt: skip
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False),
              help="Append each step's loss, time, tokens/s and MFU here (JSON lines).")  # fmt: skip
@click.option("--tensorboard", type=click.Path(file_okay=False),
              help="Write TensorBoard event files into this folder.")  # fmt: skip
@click.option("--force", is_flag=True,
              help="Run a plan that is INFEASIBLE or predicted not to fit in memory here.")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False), help="Write losses and times (JSON).")
@_set_option
def run_cmd(model, plan_path, steps, devices, rescale, seed, coordinator, num_processes,
            process_id, join_timeout, heartbeat_timeout, checkpoint_dir, save_every, keep, resume,
            metrics_path, tensorboard, force, out, sets) -> None:  # fmt: skip
    """Train MODEL.py laid out as PLAN for N steps: per-step loss and time, then measured
    against predicted step time; checkpoints, resume, metrics as they happen."""

    if out:
        check_writable(out)
    if metrics_path:
        check_writable(metrics_path, "--metrics")
    plan = Plan.load(plan_path)
    cluster = None if coordinator else detect_cluster()
    me, count = (process_id, num_processes) if coordinator else cluster_identity()
    if (coordinator or cluster) and not os.environ.get(SUPERVISED) and "run" in sys.argv[1:]:
        # the job runs in a child, whose end by JAX's distributed service becomes one line
        sys.exit(supervise(sys.argv[1:], checkpoint_dir=checkpoint_dir,
                           heartbeat_s=heartbeat_timeout, identity=(me, count)))  # fmt: skip
    procs = num_processes or count or 1
    if coordinator:
        if num_processes is None or process_id is None:
            raise click.UsageError("--coordinator needs --num-processes and --process-id")
    local = devices or max(1, plan.devices // procs)
    try:  # CPU devices for this process (no effect on GPUs/TPUs)
        jax.config.update("jax_num_cpu_devices", local)
    except RuntimeError:  # jax already started (a notebook, a test): use its devices
        pass
    if coordinator or cluster:
        init_distributed(coordinator, num_processes, process_id, timeout_s=join_timeout,
                         heartbeat_s=heartbeat_timeout, cluster=cluster)  # fmt: skip
    wl = _workload_for_plan(model, plan, plan_path, parse_sets(sets))

    tag = f"[process {jax.process_index()}] " if jax.process_count() > 1 else ""
    n = len(jax.devices())
    click.echo(
        f"{tag}{plan.model}: mesh {mesh_text(plan.mesh)} "
        f"on {n} devices ({jax.process_count()} process{'es' if jax.process_count() > 1 else ''}, "
        f"{jax.default_backend()}{', ' + cluster if cluster else ''})"
    )
    bar = Progress("steps", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)  # fmt: skip
    with bar:
        task = bar.add_task("steps", total=steps)

        def on_step(i, loss, dt):
            bar.update(task, completed=i + 1)
            click.echo(f"{tag}step {i + 1}: loss {loss:.6f}  {dt * 1e3:.1f} ms")

        res = run(plan, wl, steps=steps, seed=seed, rescale_mesh=rescale, on_step=on_step,
                  force=force, checkpoint_dir=checkpoint_dir, save_every=save_every, keep=keep,
                  resume=resume, metrics=metrics_path, tensorboard=tensorboard,
                  heartbeat_s=heartbeat_timeout)  # fmt: skip
    for note in res.notes:
        click.echo(f"{tag}note: {note}")
    if out:
        atomic_write(out, json.dumps(res.to_dict(), indent=1))
    if res.stopped:
        saved = (f"checkpoint {res.checkpoint}; continue with --resume" if res.checkpoint
                 else "nothing saved (no --checkpoint-dir)")  # fmt: skip
        click.echo(f"{tag}stopped by {res.stopped} after step {res.steps_done}: {saved}")
        sys.exit(0 if res.checkpoint else 143)
    pred = (f"predicted {res.predicted_s * 1e3:.2f} ms on {res.local_hw}"
            if res.predicted_s is not None
            else "not predicted (the note says why)" if res.local_hw
            else "no profile for these devices to predict on")  # fmt: skip
    ratio = (
        f" (measured/predicted {res.measured_s / res.predicted_s:.2f})" if res.predicted_s else ""
    )
    first, mine = res.start_step + 1, steps - res.start_step
    which = (f"median of steps {first + 1}-{steps}" if mine > 2 else f"step {steps}" if mine
             else f"step {first}")  # fmt: skip
    click.echo(
        f"{tag}measured {res.measured_s * 1e3:.2f} ms per step ({which}), "
        f"{pred}{ratio}; compile {res.compile_s:.1f} s"
        + (f"; checkpoint {res.checkpoint}" if res.checkpoint else "")
    )


def _workload_for_plan(model: str, plan, plan_path: str, sets: dict):
    """The workload the plan was made for: the plan's options; a ``--set`` that says
    otherwise is refused (the plan would run a model it was not made for)."""

    def same(was: Any, v: Any) -> bool:  # `--set size=256` arrives as a number, typed str
        return was == v or (isinstance(was, str) and not isinstance(v, bool) and str(v) == was)

    other = {k: v for k, v in sets.items() if k not in plan.options or not same(plan.options[k], v)}
    other.pop("remat_policy", None)
    other.pop(ACCUMULATION, None)
    if other:
        k, v = next(iter(other.items()))
        was = f"{k}={plan.options[k]!r}" if k in plan.options else f"no {k!r} option"
        raise PlanError(
            f"{plan_path} was made with {was}, not --set {k}={v}: plan that model first "
            f"(autolayout plan {model} --set {k}={v} ...)"
        )
    options = dict(plan.options)
    options.pop("remat_policy", None)  # the planner's, applied to the model's step
    options.pop(ACCUMULATION, None)  # likewise: its gradients accumulated over microbatches
    try:
        return remat_for_plan(plan, accumulation_for_plan(plan, load_workload(model, **options)))
    except ModelFileError as e:
        raise PlanError(
            f"{plan_path} was made for {plan.model!r}, whose options {model} does not take: "
            f"a plan made for another model? ({e})"
        ) from e


@main.command("validate")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--plan", "plan_path", required=True, type=click.Path(dir_okay=False))
@click.option("--devices", type=int, help="Fake CPU devices to compile for (default: the plan's).")
@_set_option
@click.option("--tolerance", default=0.10, show_default=True, help="Allowed relative error.")
def validate_cmd(model, plan_path, devices, sets, tolerance) -> None:
    """Compile MODEL.py laid out as PLAN and compare its collectives and FLOPs with the plan."""

    plan = Plan.load(plan_path)
    n = devices or plan.devices
    flag = f"--xla_force_host_platform_device_count={n}"
    if flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    wl = _workload_for_plan(model, plan, plan_path, parse_sets(sets))

    v = validate(plan, wl, jax.devices()[:n] if devices else None, tolerance=tolerance)
    click.echo(f"{plan.model} laid out as {plan_path}, compiled for {n} devices:")
    click.echo(
        f"{'quantity':<20} {'predicted':>14} {'compiled':>14} {'ratio':>8}  {'':<8}{'count':>10}"
    )
    for r in v.itertuples():
        mark = ("ok" if r.ok else "OFF") if r.checked else "(shown)"
        count = ""
        if r.predicted_count == r.predicted_count and r.predicted_count is not None:  # not NaN
            count = f"{int(r.predicted_count)}/{int(r.compiled_count)}"
            count += "" if r.count_ok else " differ"
        click.echo(
            f"{r.quantity:<20} {r.predicted:>14.6g} {r.compiled:>14.6g} {r.ratio:>8.3f}  "
            f"{mark:<8}{count:>10}"
        )
    for r in v[v["note"] != ""].itertuples():
        click.echo(f"  {r.quantity}: {r.note}")
    bad = v[v["checked"] & ~v["ok"]]
    if len(bad):
        # each quantity against its own tolerance: memory is a factor either way
        off = [q for q in bad["quantity"] if q != "memory"]
        why = [f"{', '.join(off)} off by more than {tolerance:.0%}"] if off else []
        for r in bad[bad["quantity"] == "memory"].itertuples():
            f = 1 + MEMORY_TOLERANCE
            why.append(f"memory {r.ratio:.2f}x the prediction, outside 1/{f:g}x to {f:g}x")
        click.echo(f"error: {'; '.join(why)}", err=True)
        sys.exit(1)


_AS_COMMAND = [False]  # set by `entry`: the process is this command


def _process_age() -> float:
    """Seconds since this process started (Linux's /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


class _ReaderMayLeave:
    """The command's stdout, where a reader that leaves (``autolayout plan ... | head``) no
    longer ends the command: what it prints after goes to /dev/null, and it finishes (its
    ``--out`` file written, its exit status its own). A BrokenPipeError had ended it with
    status 0 and no plan file."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def _left(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)  # the fd too: the interpreter's flush at exit
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._left()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._left()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def entry() -> None:
    """The `autolayout` command: :func:`main`, its time limits counted from the process's
    start, its stdout one a reader may leave."""
    _AS_COMMAND[0] = True
    sys.stdout = _ReaderMayLeave(sys.stdout)
    main()


if __name__ == "__main__":
    entry()
