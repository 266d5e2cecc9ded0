"""Export: ``plan.logical_axis_rules()`` drives Flax's own logical partitioning unchanged
(``experiments/flax_logical.py`` trains with it on 8 CPU devices)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax

from autolayout.core import partition_spec

EXAMPLE = Path(__file__).resolve().parent.parent / "experiments" / "flax_logical.py"


def test_flax_example_trains_with_the_plans_rules():
    spec = importlib.util.spec_from_file_location("flax_logical", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    plan, rules, losses, specs, got = mod.main(steps=4, time_limit_s=5)
    # every dim of the inputs has a rule; the plan's rules come first, in its order
    assert [d for d, _ in rules][: len(plan.rules())] == [d for d, _ in plan.rules()]
    assert {"embed", "mlp", "batch"} <= {d for d, _ in rules}
    assert any(axes is not None for _, axes in rules)  # the planner split something
    # Flax laid the parameters out exactly as the plan says
    assert len(got) == 4
    for path, s in got.items():
        assert s == partition_spec(specs[path]), path
    assert all(x == x for x in losses) and losses[-1] < losses[0]
    assert jax.device_count() == 8
