"""Mesh axes that split only together are one axis (``search/final.py::_merge``): a plan
found on ``fsdp=4 x fsdp2=2`` whose every layout, rule and op's split uses the two axes
together, in that order, is the plan of ``fsdp=8``: the same devices in the same order (row
major over the mesh), the same collectives, the same price. An engineer writes the one axis;
the bound is solved on that mesh's smaller request (GPT-3 175B's 96 layers on tpu-v4-1024:
the per-op bound's 5.7% on 32 x 16, the LP's 1.0% on 512)."""

from __future__ import annotations

import pytest

import autolayout as al
from autolayout.cost_models import donated_inputs
from autolayout.search.final import _joint_axes, _merge, _rules_exactly
from autolayout.search.structure import analyse
from conftest import load_model

MESH = {"fsdp": 4, "fsdp2": 2, "tensor": 2}


def test_two_neighbours_that_split_only_together_are_found():
    lays = {"w": (("fsdp", "fsdp2"), ()), "x": (("fsdp", "fsdp2", "tensor"), ())}
    assert _joint_axes(MESH, lays, [("batch", ("fsdp", "fsdp2"))], None) == ("fsdp", "fsdp2")
    # an axis used nowhere with its neighbour used nowhere: one replica axis
    assert _joint_axes({"a": 2, "b": 4}, {"w": ((), ())}, [], None) == ("a", "b")


@pytest.mark.parametrize(
    "lays,rules,assigns",
    [
        ({"w": (("fsdp",), ("fsdp2",))}, [], None),  # apart in one layout
        ({"w": (("fsdp2", "fsdp"), ())}, [], None),  # the other order
        ({"w": (("fsdp", "fsdp2"), ())}, [("d", ("fsdp",))], None),  # a rule with one
        ({"w": (("fsdp", "fsdp2"), ())}, [], {"dot": (("fsdp",), ("fsdp2",))}),  # an op's split
        ({"w": (("fsdp", "tensor", "fsdp2"), ())}, [], None),  # not neighbours in the layout
    ],
)
def test_axes_apart_anywhere_are_not_merged(lays, rules, assigns):
    got = _joint_axes(MESH, lays, rules, assigns)
    assert got != ("fsdp", "fsdp2"), got


# the examples' plans on cpu-8 (deterministic: what the work budget finds, on any machine)
MODELS = ["mlp", "gpt", "my_transformer", "stranger_lm", "moe", "t5"]


@pytest.fixture(scope="module", params=MODELS)
def planned(request):
    wl = load_model(request.param)
    return wl, al.plan(wl, "cpu-8", time_limit_s=10, deterministic=True)


def test_no_plan_keeps_two_axes_that_split_only_together(planned):
    """The invariant the merge keeps, on every example's plan: no two neighbouring axes of
    its mesh split only together (a user's mesh aside)."""
    _, p = planned
    joint = _joint_axes(dict(p.mesh), p.layouts, p.rules(), None)
    assert joint is None, (p.mesh, p.rules())


@pytest.mark.parametrize("hw_name", ["cpu-8", "h100-8", "tpu-v5e-8", "tpu-v5p-16", "tpu-v4-16"])
@pytest.mark.parametrize("model", ["mlp", "gpt", "t5"])
def test_a_layout_on_two_axes_that_split_together_is_the_same_plan_on_one(model, hw_name):
    """Data parallelism written on ``a x b`` (``batch -> (a, b)``) is merged into ``a`` of
    ``a * b`` devices, priced again there: the same step time and memory, on every kind of
    machine (a torus, open or closed; GPU nodes; the CPU)."""
    hw = al.hardware(hw_name)
    wl = load_model(model, target=hw)
    g = al.trace(wl)
    st = analyse(g, donated=donated_inputs(wl, g))
    n = hw.num_devices
    mesh = {"a": n // 2, "b": 2}
    step, rules, layouts, priced, _ = _rules_exactly(g, hw, mesh, [("batch", ("a", "b"))], st)
    joint = _joint_axes(mesh, layouts, rules, None)
    assert joint == ("a", "b"), rules
    got = _merge(g, hw, st, mesh, joint, layouts, None, rules, priced, False)
    assert got is not None, f"{model} on {hw_name}: merging a x b changed its price"
    merged, _, rules1, again, parts = got
    assert merged == {"a": n} and parts["a"] == ("a", "b"), (merged, parts)
    assert dict(rules1)["batch"] == ("a",)
    assert again["predicted"]["step_time_s"] == pytest.approx(step, rel=1e-9)
    assert (
        again["predicted"]["memory_bytes_per_device"]
        == priced["predicted"]["memory_bytes_per_device"]
    )


def test_a_users_mesh_keeps_its_axes():
    """``mesh=`` is the user's: two axes that split only together stay two."""
    wl = load_model("mlp")
    p = al.plan(wl, "cpu-8", mesh={"x": 4, "y": 2}, time_limit_s=5, deterministic=True)
    assert dict(p.mesh) == {"x": 4, "y": 2}
    assert "merged_axes" not in p.solver
