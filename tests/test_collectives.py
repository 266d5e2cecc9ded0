"""Golden collective times, derived by hand in the comments (formulas in
cost_models/collectives.py and docs/hardware-facts.md)."""

import pytest

import autolayout as al
from autolayout.cost_models.collectives import MeshError, collective_time, place_mesh

MiB = 2**20


def test_torus_with_wraparound():
    # tpu-v4-256 is a 4x4x8 torus, every axis closed. Mesh data=8 x model=16: model (the
    # inner 16 chips) spans x (4) and y (4), both whole and wrapped; data spans z (8).
    hw = al.hardware("tpu-v4-256")
    p = place_mesh(hw, {"data": 8, "model": 16})
    assert [(s.length, s.wraparound) for s in p["model"]] == [(4, True), (4, True)]
    assert [(s.length, s.wraparound) for s in p["data"]] == [(8, True)]
    # all-gather of 64 MiB over model: two bidirectional rings, W = 2 dims * 2 * 4.5e10 * 0.82
    #   = 1.476e11 B/s; V (N-1)/N = 64 MiB * 15/16 = 62914560 B -> 4.2625e-4 s (> 4 hops * 1 us)
    t = collective_time(hw, "all-gather", p["model"], 64 * MiB)
    assert t == pytest.approx(64 * MiB * 15 / 16 / (2 * 2 * 4.5e10 * 0.82))
    assert t == pytest.approx(4.2625e-4, rel=1e-4)
    assert collective_time(hw, "all-reduce", p["model"], 64 * MiB) == pytest.approx(2 * t)
    assert collective_time(hw, "reduce-scatter", p["model"], 64 * MiB) == pytest.approx(t)
    assert collective_time(hw, "all-to-all", p["model"], 64 * MiB) == pytest.approx(t / 4)


def test_torus_without_wraparound_is_about_half_as_fast():
    # tpu-v4-32 is 2x2x4 (16 chips, under a 4x4x4 cube): no wraparound. Mesh data=4 x model=4:
    # model spans x and y (2 each, open), data spans z (4, open).
    hw = al.hardware("tpu-v4-32")
    p = place_mesh(hw, {"data": 4, "model": 4})
    assert [(s.length, s.wraparound) for s in p["data"]] == [(4, False)]
    # one unidirectional ring of 4: W = 4.5e10 * 0.82 = 3.69e10; 16 MiB * 3/4 / 3.69e10 = 3.41e-4 s
    t = collective_time(hw, "all-gather", p["data"], 16 * MiB)
    assert t == pytest.approx(16 * MiB * 3 / 4 / (4.5e10 * 0.82))
    # the same ring closed (a full 4x4x4 cube's z axis) is twice as fast
    closed = place_mesh(al.hardware("tpu-v4-128"), {"data": 4, "model": 16})["data"]
    assert closed[0].wraparound
    assert collective_time(hw, "all-gather", closed, 16 * MiB) == pytest.approx(t / 2)
    assert collective_time(hw, "all-to-all", p["data"], 16 * MiB) == pytest.approx(t / 2)
    # latency-bound: 64 bytes over 3 hops costs 3 us, not 64 B / W
    assert collective_time(hw, "all-gather", p["data"], 64) == pytest.approx(3e-6)


def test_an_axis_spanning_two_gpu_nodes_is_priced_at_network_bandwidth():
    # h100-16 = 2 nodes of 8. Mesh data=2 x model=8: model is inside a node (NVLink),
    # data crosses the two nodes (network, 5e10 B/s per GPU).
    hw = al.hardware("h100-16")
    p = place_mesh(hw, {"data": 2, "model": 8})
    assert [(s.level, s.length) for s in p["model"]] == [("nvlink", 8)]
    assert [(s.level, s.length) for s in p["data"]] == [("network", 2)]
    # data all-gather of 1 GiB: V (D-1)/(D W) = 2**30 * 1/2 / (5e10 * 0.8) = 1.342e-2 s,
    # plus 1 ring step * 4 us
    t = collective_time(hw, "all-gather", p["data"], 2**30)
    assert t == pytest.approx(2**30 / 2 / (5e10 * 0.8) + 4e-6)
    # the same bytes over NVLink (8 GPUs): 2**30 * 7/8 / (4.5e11 * 0.8) + 7 * 1.9 us = 2.61e-3 s
    t_nv = collective_time(hw, "all-gather", p["model"], 2**30)
    assert t_nv == pytest.approx(2**30 * 7 / 8 / (4.5e11 * 0.8) + 7 * 1.9e-6)
    assert t > 5 * t_nv
    # an axis of 16 spans both levels; the slower (network) level dominates
    both = place_mesh(hw, {"data": 16})["data"]
    assert [(s.level, s.length) for s in both] == [("nvlink", 8), ("network", 2)]
    assert collective_time(hw, "all-gather", both, 2**30) == pytest.approx(
        2**30 / 2 / (5e10 * 0.8) + 15 * 4e-6
    )
    # a halo exchange along that axis: the pair across the node boundary goes over the
    # network, 1 MiB / (5e10 * 0.8) + 4 us (over NVLink alone: 1 MiB / (4.5e11 * 0.8) + 1.9 us)
    assert collective_time(hw, "collective-permute", both, 2**20) == pytest.approx(
        2**20 / (5e10 * 0.8) + 4e-6
    )
    assert collective_time(hw, "collective-permute", p["model"], 2**20) == pytest.approx(
        2**20 / (4.5e11 * 0.8) + 1.9e-6
    )


def test_a_group_of_one_costs_nothing():
    hw = al.hardware("h100-8")
    p = place_mesh(hw, {"data": 8, "model": 1})
    assert p["model"] == () and collective_time(hw, "all-reduce", p["model"], 2**20) == 0.0


@pytest.mark.parametrize(
    "hw, mesh, message",
    [
        (
            "tpu-v4-256",
            {"data": 16, "model": 4},
            r"mesh data=16 x model=4 has 64 devices but tpu-v4-256 has 128",
        ),
        ("h100-16", {"data": 0, "model": 16}, r"positive integers"),
    ],
)
def test_meshes_that_do_not_fit_are_errors(hw, mesh, message):
    with pytest.raises(MeshError, match=message):
        place_mesh(al.hardware(hw), mesh)


def test_unknown_collective_kind():
    with pytest.raises(ValueError, match="unknown collective kind 'allreduce'"):
        collective_time(al.hardware("h100-8"), "allreduce", (), 1.0)
