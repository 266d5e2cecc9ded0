"""Issue 35: a searched mesh's axes are named for what they split, as Megatron-LM and MaxText
engineers read them (``data``, ``fsdp``, ``tensor``, ``expert``, ``seq``, ``space``,
``replica``; ``stage`` is the pipeline's), never ``model``; a mesh the user gave keeps its
names. Plans of the example models on cpu-8, and ``search.final._axis_names`` on fixed
strategies for the cases a small plan does not choose."""

from __future__ import annotations

import pytest

import autolayout as al
from autolayout.cost_models import RuleSet
from autolayout.search.final import _axis_names
from autolayout.search.request import build
from autolayout.search.seeds import ShapeResult, choice_of_rules
from autolayout.search.structure import analyse
from conftest import load_model

GENERATED = {"data", "fsdp", "tensor", "expert", "seq", "space", "replica"}


def _generated(mesh: dict[str, int]) -> bool:
    """Every axis a generated name (``tensor2`` for a second tensor axis), none ``model``."""
    return all(a.rstrip("0123456789") in GENERATED and not a.startswith("model") for a in mesh)


def _names(g: al.Graph, mesh: dict[str, int], rules: dict[str, tuple[str, ...]]) -> dict:
    """The names the planner gives the generic axes of ``mesh`` laid out as ``rules``."""
    req = build(analyse(g), al.hardware("cpu-8"), mesh)
    choice = choice_of_rules(req, RuleSet(g, mesh, list(rules.items())))
    r = ShapeResult(dict(mesh), None, "SEEDED", 0.0, request=req)
    return _axis_names(g, r, req.layouts_of(choice), req.assigns_of(choice))


@pytest.fixture(scope="module")
def gpt() -> al.Graph:
    return al.trace(load_model("gpt"))


def test_a_megatron_plan_names_its_axis_tensor_and_the_batch_axis_data():
    """GPT tiny on cpu-8: heads, d_ff and vocab on one axis (Megatron's tensor parallelism,
    once named ``model``), the batch alone on the other."""
    p = al.plan(load_model("gpt"), "cpu-8", time_limit_s=5, deterministic=True)
    rules = dict(p.rules())
    assert rules["heads"] == rules["d_ff"] == ("tensor",), p.rules()
    assert rules["batch"] == ("data",), p.rules()
    assert _generated(p.mesh), p.mesh


def test_an_moe_plan_with_expert_parallelism_names_its_axis_expert():
    """The MoE at tiny widths with 8 experts of d_ff 4096: the experts split over all 8
    devices (the tokens moved to them by all-to-all), the axis named ``expert``."""
    wl = load_model("moe", experts=8, d_ff=4096, d_model=256)
    p = al.plan(wl, "cpu-8", time_limit_s=5, deterministic=True)
    assert dict(p.rules()).get("experts") == ("expert",), (p.mesh, p.rules())
    assert _generated(p.mesh), p.mesh


def test_a_small_mlp_plan_names_no_axis_model():
    p = al.plan(load_model("mlp"), "cpu-8", time_limit_s=5, deterministic=True)
    assert _generated(p.mesh), p.mesh


def test_a_users_mesh_keeps_its_names():
    p = al.plan(load_model("mlp"), "cpu-8", mesh={"data": 2, "model": 4}, time_limit_s=3,
                deterministic=True)  # fmt: skip
    assert p.mesh == {"data": 2, "model": 4}


@pytest.mark.parametrize(
    "rules,want",
    [
        ({"batch": ("a", "b")}, {"a": "data", "b": "data2"}),  # pure DP
        ({"batch": ("a",), "heads": ("b",), "d_ff": ("b",)}, {"a": "data", "b": "tensor"}),
        ({"batch": ("a",), "d_model": ("a",), "heads": ("b",)}, {"a": "fsdp", "b": "tensor"}),
        # context parallelism: the sequence split, no weight
        ({"batch": ("a",), "seq": ("b",)}, {"a": "data", "b": "seq"}),
        ({"heads": ("a",), "d_ff": ("b",)}, {"a": "tensor", "b": "tensor2"}),
        ({"batch": ("a",)}, {"a": "data", "b": "replica"}),  # b splits nothing
    ],
)
def test_gpt_axes_are_named_for_what_they_split(gpt, rules, want):
    assert _names(gpt, {"a": 2, "b": 4}, rules) == want


def test_a_rules_plan_is_named_for_what_its_rules_split_not_the_choice_it_came_from():
    """A stranger's Equinox MLP (eqx.nn.MLP 256-512-512-512-10, batch 64) on cpu-8: the
    search's choice split the batch inside the step; the plan returned is its rules without
    their exceptions, which split only the hidden units: its axes are ``tensor``, not the
    ``fsdp=4 x fsdp2=2`` the choice's names said (2026-12-07)."""
    eqx = pytest.importorskip("equinox")
    import jax
    import jax.numpy as jnp
    import optax

    def init(key):
        return eqx.filter(eqx.nn.MLP(256, 10, 512, 3, key=key), eqx.is_array)

    static = eqx.filter(eqx.nn.MLP(256, 10, 512, 3, key=jax.random.PRNGKey(0)), eqx.is_array,
                        inverse=True)  # fmt: skip

    def loss_fn(params, b):
        logits = jax.vmap(eqx.combine(params, static))(b["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

    spec = {"x": jax.ShapeDtypeStruct((64, 256), jnp.float32),
            "y": jax.ShapeDtypeStruct((64,), jnp.int32)}  # fmt: skip
    wl = al.train_workload(loss_fn, optax.adam(1e-3), init, spec, lambda rng: None)
    p = al.plan(wl, "cpu-8", time_limit_s=20)
    assert {"features", "hidden", "hidden2", "classes", "batch"} == set(p.graph.dims)
    split = {a for _, axes in p.rules() for a in axes}
    batch_split = any(
        axes for t, lay in p.layouts.items()
        for d, axes in zip(p.graph.tensors[t].dims, lay, strict=True) if d == "batch"
    )  # fmt: skip
    for a in p.mesh:
        if a.startswith("fsdp") or a.startswith("data"):
            assert batch_split, (p.mesh, p.rules())
    assert split <= set(p.mesh)


def test_an_axis_that_splits_the_experts_is_expert_even_where_it_splits_the_batch():
    """MaxText's ``expert`` axis: the expert weights split on it, the batch of the other
    layers too (expert parallelism over a data-parallel base, ``seeds._expert_choice``)."""
    g = al.trace(load_model("moe"))
    assert _names(g, {"a": 2, "b": 4}, {"batch": ("a", "b"), "experts": ("b",)}) == {
        "a": "data",
        "b": "expert",
    }
    assert _names(g, {"a": 2, "b": 4}, {"batch": ("a",), "experts": ("b",)}) == {
        "a": "data",
        "b": "expert",
    }
