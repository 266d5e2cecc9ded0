"""``autolayout run``: laid-out training steps give the unsharded losses, on one process and
on two (jax.distributed over gloo), and bad input is refused with a clear message."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from click.testing import CliRunner

import autolayout as al
from autolayout._cli import main
from autolayout.runtime.run import reference_losses, rescale, run
from autolayout.search.baselines import standard_layouts
from conftest import MODELS, load_model

ROOT = Path(__file__).resolve().parent.parent
# the tiny sizes (float32), one layer where the model has a stack: the compile is the cost
F32 = {
    "gpt": {"layers": 1},
    "mlp": {},
    "moe": {"layers": 1},
    "t5": {"layers": 1},
    "unet3d": {"batch": 8},
}
STEPS = 3


@pytest.mark.parametrize("model", sorted(F32))
def test_sharded_losses_equal_the_unsharded_run(model):
    wl = load_model(model, **F32[model])
    g = al.trace(wl)
    ref = reference_losses(wl, steps=STEPS)
    layouts = standard_layouts(g, 8)
    assert len(layouts) >= 3
    for name, (mesh, rules) in layouts.items():
        p = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
        got = run(p, wl, steps=STEPS).losses
        for a, b in zip(got, ref, strict=True):
            assert abs(a - b) <= 1e-5 * abs(b), (model, name, got, ref)


@pytest.mark.parametrize("model", sorted(F32))
def test_searched_plan_runs_with_the_unsharded_losses(model):
    """The planner's own plan (not only the rule layouts): its new state comes back in the
    inputs' layouts, so step 2 onwards takes step 1's outputs (a donation warning is an
    error in this suite)."""
    wl = load_model(model, **F32[model])
    p = al.plan(wl, "cpu-8", time_limit_s=3, deterministic=True)
    got = run(p, wl, steps=5).losses
    assert got == pytest.approx(reference_losses(wl, steps=5), rel=1e-5), (model, p)


def test_plan_with_exceptions_runs_and_is_the_same_on_every_run(monkeypatch):
    """A user's transformer (float32, AdamW, no dim names) whose plan keeps some weights
    whole while their updates are computed split ("exceptions to the rules"): the update is
    gathered back into the stored layout, as priced, so 5 steps run with the unsharded
    losses and the compiled all-gathers are the predicted ones. Its equal-cost layouts are
    many; two runs of the same request give one plan. (The search's own layout: a plain
    hand layout within 1% would replace it, as megatron_sp does here.)"""
    from autolayout.search import final

    monkeypatch.setattr(final, "SIMPLER_WITHIN", 0.0)
    wl = al.load_workload(ROOT / "experiments/models/my_transformer.py")
    plans = [al.plan(wl, "cpu-8", time_limit_s=10) for _ in range(2)]
    p = plans[0]
    assert p.solver["exceptions"], p.solver
    for q in plans[1:]:
        assert q.layouts == p.layouts and q.mesh == p.mesh
    assert p.outputs and len(p.outputs) == len(p.graph.outputs)
    ins, outs = p.partition_specs(), p.out_partition_specs()
    assert outs[0] == ins[0] and outs[1] == ins[1]  # new state in the old state's layout
    assert al.Plan.from_dict(p.to_dict()).outputs == p.outputs  # and in the plan file
    got = run(p, wl, steps=5).losses
    assert got == pytest.approx(reference_losses(wl, steps=5), rel=1e-5)
    v = al.validate(p).set_index("quantity")
    assert abs(v.loc["all-gather", "ratio"] - 1) <= 0.1, v  # validate's bound (1.077 here)
    assert v.loc["all-gather", "predicted_count"] == v.loc["all-gather", "compiled_count"], v


def test_run_cli_prints_losses_and_measured_against_predicted(tmp_path):
    plan = tmp_path / "plan.json"
    r = CliRunner().invoke(
        main, ["evaluate", str(MODELS / "gpt.py"), "--hw", "cpu-8", "--layout", "2d",
               "--out", str(plan)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    out = tmp_path / "run.json"
    r = CliRunner().invoke(
        main, ["run", str(MODELS / "gpt.py"), "--plan", str(plan), "--steps", "3",
               "--out", str(out)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.output.count("loss ") == 3
    assert "measured" in r.output and "predicted" in r.output and "cpu-8" in r.output
    res = json.loads(out.read_text())
    assert res["losses"] == pytest.approx(reference_losses(load_model("gpt"), steps=3), rel=1e-5)
    assert res["predicted_step_s"] == pytest.approx(al.Plan.load(plan).predicted["step_time_s"])


def test_run_refuses_bad_input(tmp_path):
    gpt = str(MODELS / "gpt.py")
    plan = tmp_path / "plan.json"
    CliRunner().invoke(main, ["evaluate", gpt, "--hw", "cpu-8", "--layout", "dp", "--out",
                              str(plan)])  # fmt: skip
    d = json.loads(plan.read_text())

    def run_cli(path, *extra):
        return CliRunner().invoke(main, ["run", gpt, "--plan", str(path), "--steps", "1", *extra])

    old = tmp_path / "old.json"
    old.write_text(json.dumps({**d, "version": 99}))
    r = run_cli(old)
    assert r.exit_code == 2 and "version 99" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text(plan.read_text()[:200])
    r = run_cli(bad)
    assert r.exit_code == 2 and "corrupted plan file" in r.output
    r = run_cli(plan, "--set", "d_model=128")  # another size than the plan's
    assert r.exit_code == 2 and "made with d_model=64, not --set d_model=128" in r.output
    r = run_cli(plan, "--set", "size=gpt3-small")  # it used to run the tiny model silently
    assert r.exit_code == 2 and "made with size='tiny', not --set size=gpt3-small" in r.output
    assert run_cli(plan, "--set", "d_model=64").exit_code == 0  # restating the plan's is fine
    infeasible = tmp_path / "infeasible.json"
    infeasible.write_text(json.dumps({**d, "status": "INFEASIBLE"}))
    r = run_cli(infeasible)
    assert r.exit_code == 2 and "INFEASIBLE" in r.output and "--force" in r.output
    assert run_cli(infeasible, "--force").exit_code == 0
    huge = tmp_path / "huge.json"
    over = {**d["predicted"], "memory_bytes_per_device": 50 * 2**30}
    huge.write_text(json.dumps({**d, "predicted": over}))
    r = run_cli(huge)
    assert r.exit_code == 2 and "50.00 GiB per device" in r.output and "3.60 GiB" in r.output
    r = CliRunner().invoke(main, ["run", str(MODELS / "mlp.py"), "--plan", str(plan)])
    assert r.exit_code == 2 and "another model" in r.output
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**d, "hardware": "cpu-16",  # a plan for a larger slice
                               "mesh": {"axes": {"data": 8, "model": 2}, "devices": 16}}))  # fmt: skip
    r = run_cli(big)
    assert r.exit_code == 2 and "16 devices" in r.output and "--rescale" in r.output
    r = run_cli(big, "--rescale")
    assert r.exit_code == 0, r.output
    assert (
        "rescaled the mesh data=8 x model=2 (16 devices) to data=4 x model=2 (8 devices)"
        in r.output
    )


def test_a_lone_process_stops_with_a_message(tmp_path):
    """One process of two, whose peer never comes: a one-line error after --join-timeout,
    exit 2 (JAX's own time-out aborts from C++ with a stack trace)."""
    plan = tmp_path / "plan.json"
    p = al.evaluate(load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    p.to_json(plan)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run(
        [sys.executable, "-m", "autolayout._cli", "run", str(MODELS / "gpt.py"), "--plan",
         str(plan), "--devices", "4", "--coordinator", f"127.0.0.1:{_free_port()}",
         "--num-processes", "2", "--process-id", "1", "--join-timeout", "2"],
        env=env, capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "process 1 of 2: the coordinator at 127.0.0.1:" in r.stderr
    assert "did not join within 2 s" in r.stderr and "Traceback" not in r.stderr


def test_rescale_shrinks_the_largest_axes_first():
    p = al.evaluate(load_model("gpt"), "cpu-8", mesh={"data": 2, "model": 4},
                    rules={"batch": "data", "d_ff": "model"})  # fmt: skip
    p.mesh = {"data": 16, "model": 8}
    assert rescale(p, 8)[0] == {"data": 2, "model": 4}
    assert rescale(p, 2)[0] == {"data": 1, "model": 2}  # ties: the first axis shrinks
    with pytest.raises(al.MeshError, match="does not divide"):
        rescale(p, 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_give_the_single_process_losses(tmp_path):
    wl = load_model("gpt")
    p = al.evaluate(wl, "cpu-8", mesh={"data": 2, "model": 4},
                    rules={"batch": "data", "heads": "model", "d_ff": "model"})  # fmt: skip
    plan = tmp_path / "plan.json"
    p.to_json(plan)
    single = run(p, wl, steps=3).losses
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autolayout._cli",
                "run",
                str(MODELS / "gpt.py"),
                "--plan",
                str(plan),
                "--steps",
                "3",
                "--devices",
                "4",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--out",
                str(tmp_path / f"{i}.json"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )  # fmt: skip
        for i in range(2)
    ]
    outs = [pr.communicate(timeout=300)[0] for pr in procs]
    for pr, out in zip(procs, outs, strict=True):
        assert pr.returncode == 0, out
    for i in range(2):
        res = json.loads((tmp_path / f"{i}.json").read_text())
        assert res["processes"] == 2
        assert res["losses"] == pytest.approx(single, rel=1e-5)
        assert f"[process {i}]" in outs[i] and "on 8 devices (2 processes" in outs[i]
    assert jax.device_count() == 8
