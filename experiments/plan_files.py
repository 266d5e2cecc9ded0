"""Plan files of the example models, as digests: a refactoring that moves code must leave
every one byte-identical.

    python experiments/plan_files.py --out experiments/results   # plan_files.csv there

Each row is one plan file written by ``Plan.to_json``: every example model (tiny) under every
standard layout on ``cpu-8`` and ``tpu-v4-256`` (``al.evaluate``), and the planner's own plan
on ``cpu-8`` (``al.plan``, deterministic). The fields that measure this machine rather than
the plan (wall times, phases) are left out before hashing; a deterministic plan the wall
clock cut is marked and not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from _out import take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.search.baselines import standard_layouts  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODELS = ("mlp", "gpt", "moe", "t5", "unet3d", "my_transformer")
VOLATILE = {"wall_s", "trace_s", "phases_s"}


def _strip(x):
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def digest(plan: al.Plan) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.json"
        plan.to_json(path)
        data = _strip(json.loads(path.read_text()))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def rows():
    for name in MODELS:
        wl = al.load_workload(ROOT / "models" / f"{name}.py", target="cpu")  # one trace for both
        g = al.trace(wl)
        for hw in ("cpu-8", "tpu-v4-256"):
            n = al.hardware(hw).num_devices
            for layout, (mesh, rules) in standard_layouts(g, n).items():
                p = al.evaluate(wl, hw, mesh=mesh, rules=rules, graph=g)
                yield name, hw, layout, digest(p)
        p = al.plan(wl, "cpu-8", time_limit_s=20, deterministic=True, graph=g)
        mark = "" if p.solver.get("deterministic") else " (wall-clock cut: not comparable)"
        yield name, "cpu-8", "plan" + mark, digest(p)


def main(out: Path) -> None:
    lines = ["model,hardware,layout,sha256"]
    for r in rows():
        lines.append(",".join(r))
        print(*r, flush=True)
    Path(out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(take_out() / "plan_files.csv")
