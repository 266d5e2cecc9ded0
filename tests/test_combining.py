"""Collectives combined as XLA combines them (issue 21): the state's gathers and reductions
pay their share of one latency, and validate's counts are what the backend's combiners
leave (XLA:CPU: independent all-reduces merged, all-gathers one each)."""

import pytest

import autolayout as al
from autolayout.cost_models import COMBINE_BYTES, collective_time, place_mesh
from autolayout.search import standard_layout


def test_a_combined_collective_pays_its_share_of_the_latency():
    hw = al.hardware("h100-64")
    segs = place_mesh(hw, {"data": 64})["data"]
    small = 1e5
    whole = collective_time(hw, "all-reduce", segs, small)
    shared = collective_time(hw, "all-reduce", segs, small, combined=True)
    bandwidth = collective_time(hw, "all-reduce", segs, small, combined=True) - (
        whole - collective_time(hw, "all-reduce", segs, 0.0 + 1e-9)
    )
    assert shared < whole
    # 2 (n-1) steps of latency, scaled by the collective's share of one combined buffer
    latency = 2 * 63 * max(s.latency_s for s in segs)
    assert whole - shared == pytest.approx(latency * (1 - small / COMBINE_BYTES["gpu"]), rel=1e-6)
    assert bandwidth > 0
    # a collective bigger than the threshold pays its whole latency either way
    assert collective_time(hw, "all-reduce", segs, 1e9, combined=True) == collective_time(
        hw, "all-reduce", segs, 1e9
    )
    # activations' collectives (not the state's) are never combined
    assert collective_time(hw, "all-to-all", segs, small, combined=True) == collective_time(
        hw, "all-to-all", segs, small
    )


def test_gradient_all_reduces_under_dp_on_gpus_are_combined():
    wl = al.load_workload(
        "experiments/models/gpt.py", size="gpt3-small", batch=64, attention="naive"
    )
    g = al.trace(wl)
    mesh, rules = standard_layout(g, "dp", 64)
    p = al.evaluate(wl, "h100-64", mesh=mesh, rules=rules, graph=g)
    c = p.collectives()
    grads = c[c["kind"] == "all-reduce"]
    assert len(grads) > 100 and grads["combined"].all()
    hw = al.hardware("h100-64")
    segs = place_mesh(hw, mesh)["data"]
    alone = sum(collective_time(hw, "all-reduce", segs, b) for b in grads["bytes"])
    assert grads["time_s"].sum() < 0.8 * alone


@pytest.mark.parametrize("model", ["gpt.py", "t5.py", "moe.py", "my_transformer.py"])
@pytest.mark.parametrize("layout", ["dp", "fsdp"])
def test_predicted_collective_counts_are_what_xla_compiles(model, layout):
    wl = al.load_workload(f"experiments/models/{model}")
    g = al.trace(wl)
    mesh, rules = standard_layout(g, layout, 8)
    p = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
    rows = al.validate(p, wl)
    colls = rows[rows["predicted_count"].notna()]
    assert len(colls)
    for r in colls.itertuples():
        assert abs(r.predicted_count - r.compiled_count) <= max(1, round(0.1 * r.compiled_count)), r
        assert r.count_ok
    assert rows["ok"].all()
