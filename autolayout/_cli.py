"""The ``autolayout`` command line (click). Bad input is one line on stderr, exit 2;
``--debug`` shows the traceback instead."""

from __future__ import annotations

import ast
import collections
import sys
from typing import Any

import click

from ._errors import AutolayoutError
from ._hardware import hardware, list_profiles
from ._trace import trace
from ._workload import load_workload


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


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AutolayoutError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


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
    """List hardware profiles, or show one slice/cluster (e.g. tpu-v4-256, h100-64)."""
    if name:
        click.echo(hardware(name).describe())
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


@main.command("trace")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option for the model's workload().",
)
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


if __name__ == "__main__":
    main()
