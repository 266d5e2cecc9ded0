"""A dim's further rules (Flax's ``logical_axis_rules``): a later rule for a dim applies where
an earlier rule took the mesh axes of its first one. Held equal to Flax's own resolution over
random rule lists, and derived by the planner where one rule per dim leaves inputs as
exceptions (a Mixtral-style MoE: dense weights split ``d_model`` over ``fsdpxexpert``, the
experts' weights over ``fsdp``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import flax.linen as nn
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autolayout as al
from autolayout.core import RuleError
from autolayout.cost_models import RuleSet
from autolayout.search.final import derive_rules

MOE = Path(__file__).resolve().parent.parent / "experiments" / "models" / "corpus" / "moe_rotary.py"
MESH = {"x": 2, "y": 2, "z": 2}
DIMS = ("a", "b", "c")


def _graph():
    return al.trace(al.Workload(lambda w: jnp.sum(w), (al.spec((8, 8, 8), DIMS),), name="w"))


AXES = st.lists(st.sampled_from(sorted(MESH)), max_size=2, unique=True).map(tuple)
RULES = st.lists(st.tuples(st.sampled_from(DIMS), AXES), min_size=1, max_size=6, unique=True)


@settings(max_examples=150, deadline=None)
@given(rules=RULES, order=st.permutations(DIMS))
def test_rules_resolve_as_flax_resolves_logical_axis_rules(rules, order):
    g = _graph()
    t = g.tensors[g.inputs[0]]
    t = dataclasses.replace(t, dims=tuple(order))
    got = RuleSet(g, MESH, rules).layout(t)
    flax_rules = [(d, a if a else None) for d, a in rules]
    spec = nn.logical_to_mesh_axes(tuple(order), flax_rules)
    want = tuple(() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in spec)
    assert got == want, (rules, order, spec)


def test_a_rule_given_twice_is_refused_in_one_line():
    with pytest.raises(RuleError, match="'a' -> x is given twice"):
        RuleSet(_graph(), MESH, [("a", "x"), ("b", "y"), ("a", "x")])


def test_the_planner_derives_fallbacks_where_one_rule_per_dim_leaves_exceptions():
    wl = al.load_workload(MOE)
    g = al.trace(wl)
    mesh = {"fsdp": 2, "expert": 4}
    rules = [("experts", ("expert",)), ("d_model", ("fsdp", "expert")), ("d_model", ("fsdp",))]
    layouts = {t: RuleSet(g, mesh, rules).layout(g.tensors[t]) for t in g.inputs}
    # the layout needs both: experts' weights split d_model on fsdp, dense ones on both axes
    w1 = next(t for t in g.inputs if g.tensors[t].path == "params/layers/0/w1")
    wq = next(t for t in g.inputs if g.tensors[t].path == "params/layers/0/wq")
    assert layouts[w1][:2] == (("expert",), ("fsdp",)) and layouts[wq][0] == ("fsdp", "expert")
    derived, exceptions = derive_rules(g, mesh, layouts)
    assert exceptions == [], (derived, exceptions[:3])
    assert sum(d == "d_model" for d, _ in derived) == 2
    rs = RuleSet(g, mesh, derived)
    assert all(rs.layout(g.tensors[t]) == layouts[t] for t in g.inputs)
    # and the plan's rules, with their fallback, lay the step out as the layouts do
    p = al.evaluate(wl, "cpu-8", mesh=mesh, rules=derived, graph=g)
    assert p.summary()["fits"] and dict(p.mesh) == mesh


def test_the_command_line_takes_a_dims_fallback_and_refuses_a_mesh_axis_given_twice():
    from click.testing import CliRunner

    from autolayout._cli import main

    rules = "experts=expert,d_model=fsdp+expert,d_model=fsdp"
    r = CliRunner().invoke(main, ["evaluate", str(MOE), "--hw", "cpu-8", "--mesh",
                                  "fsdp=2,expert=4", "--rules", rules])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "d_model -> fsdp  (where fsdpxexpert is taken)" in r.output, r.output
    r = CliRunner().invoke(main, ["evaluate", str(MOE), "--hw", "cpu-8", "--mesh",
                                  "fsdp=2,fsdp=4", "--rules", rules])  # fmt: skip
    assert r.exit_code == 2 and "'fsdp' is given twice" in r.output, r.output
