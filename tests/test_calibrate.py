"""`autolayout calibrate` on 8 CPU devices: the mechanism (every microbenchmark runs, the
fits land in a profile that loads and plans), not the figures."""

import os
import subprocess
import sys

import jax
import pytest

import autolayout as al
from autolayout.runtime.calibrate import fit_rate_and_call, host_link


def test_the_rate_and_call_fit_recovers_a_line_and_holds_points_out():
    work = [1e9, 2e9, 4e9, 8e9]
    secs = [w / 5e11 + 2e-4 for w in work]
    fit = fit_rate_and_call(work, secs)
    assert fit["rate"] == pytest.approx(5e11)
    assert fit["call_s"] == pytest.approx(2e-4)
    assert fit["leave_one_out_ratio"] == pytest.approx([1.0] * 4)


def test_the_host_link_is_timed_each_way():
    """The host-link microbenchmark's mechanism, on a CPU device's pinned host memory (the
    figure means nothing there: calibrate runs it on accelerators only)."""
    got = host_link(jax.devices()[0], [1, 4], reps=2)
    assert [r["mib"] for r in got["rows"]] == [1, 4]
    assert all(r["to_host_s"] > 0 and r["to_device_s"] > 0 for r in got["rows"])
    assert got["bandwidth"] > 0


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "measured.toml"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    r = subprocess.run(
        [sys.executable, "-c", "from autolayout._cli import main; main()", "calibrate", "--devices", "8", "--quick", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return out, r


def test_calibrate_writes_a_profile_that_records_what_it_measured(measured):
    out, r = measured
    assert "wrote" in r.stdout and "measuring collectives" in r.stderr
    hw = al.hardware(str(out))
    assert hw.num_devices == 8 and hw.kind == "cpu"
    from autolayout.core import load_profile

    cal = load_profile(out)["calibration"]
    assert {row["dtype"] for row in cal["matmul"]} == {"float32", "bfloat16"}
    assert all(row["flops_per_s"] > 0 for row in cal["matmul"])
    assert cal["memory"] and cal["conv"]
    kinds = {(row["axis"], row["kind"]) for row in cal["collectives"]}
    # every collective on every axis of the 1-D and the 2-D mesh
    for axis in ("all", "outer", "inner"):
        for kind in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
            assert (axis, kind) in kinds
    assert "NVIDIA" in cal["attention_note"]  # skipped here, and says why
    # no host link on CPU devices (one memory): none written, and said why
    assert "one memory" in cal["host_link_note"] and hw.chip.host_bandwidth is None
    # the fitted figures are the measured ones
    best = max(row["flops_per_s"] for row in cal["matmul"] if row["dtype"] == "float32")
    assert hw.chip.peak_flops["f32"] >= best * 0.999
    assert hw.topology.intra_bandwidth > 0
    # the 3-D convolutions' median rate, as a fraction of the peak it was measured against
    rates = sorted(row["flops_per_s"] for row in cal["conv"])
    assert rates[0] <= hw.efficiency.conv3d * hw.chip.peak_flops["f32"] <= rates[-1] * 1.001


def test_a_measured_profile_plans(measured):
    out, _ = measured
    wl = al.load_workload("experiments/models/mlp.py")
    p = al.plan(wl, al.hardware(str(out)), time_limit_s=10, deterministic=True)
    # a loaded 2-core machine can stop the search at its limit (TIMEOUT): the plan it has
    # still stands and fits
    assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT") and p.summary()["fits"], p


def test_calibrate_refuses_more_devices_than_there_are_in_one_line():
    r = subprocess.run([sys.executable, "-c", "from autolayout._cli import main; main()", "calibrate", "--devices", "999"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0
    assert "--devices 999" in r.stderr and "Traceback" not in r.stderr
