"""Training jobs that survive: Orbax checkpoints and ``--resume`` (the losses of a run never
stopped, also into another plan's layout), SIGTERM (every process saves at one step and
exits 0), a dead peer (one line naming it, within a minute), metrics as they happen, and a
two-process run started from SLURM's variables alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import autolayout as al
from autolayout.runtime.cluster import cluster_identity, dead_peers, detect_cluster
from autolayout.runtime.run import run
from conftest import MODELS, load_model

ROOT = Path(__file__).resolve().parent.parent
GPT = str(MODELS / "gpt.py")


@pytest.fixture(scope="module")
def gpt():
    wl = load_model("gpt", layers=1)
    plan = al.evaluate(wl, "cpu-8", mesh={"data": 2, "model": 4},
                       rules={"batch": "data", "heads": "model", "d_ff": "model"})  # fmt: skip
    return wl, plan, run(plan, wl, steps=24).losses  # a run never stopped


def test_sigterm_then_resume_gives_the_losses_of_a_run_never_stopped(gpt, tmp_path):
    """3 steps, SIGTERM, --resume to 6: the straight run's losses (1e-6); the metrics file has
    a line per finished step, the resumed steps once; TensorBoard's event file is written."""
    wl, plan, straight = gpt
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"

    def preempt(i, loss, dt):
        if i == 2:  # after the third step, as a scheduler would
            os.kill(os.getpid(), signal.SIGTERM)

    first = run(plan, wl, steps=6, checkpoint_dir=str(ck), save_every=2, on_step=preempt,
                metrics=str(metrics))  # fmt: skip
    assert first.stopped == "SIGTERM" and first.steps_done == 3
    assert first.checkpoint == str(ck / "3") and sorted(os.listdir(ck)) == ["2", "3"]
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [1, 2, 3]
    with metrics.open("a") as f:  # a line of a step the checkpoint does not hold
        f.write(json.dumps({"step": 4, "loss": 0.0}) + "\n")
    again = run(plan, wl, steps=6, checkpoint_dir=str(ck), resume=True, metrics=str(metrics),
                tensorboard=str(tmp_path / "tb"))  # fmt: skip
    assert again.start_step == 3 and not again.stopped
    assert again.losses == pytest.approx(straight[:6], rel=1e-6, abs=0)
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    assert [x["loss"] for x in lines] == pytest.approx(straight[:6], rel=1e-6)
    assert all(x["tokens_per_s"] > 0 and 0 < x["mfu"] and x["predicted_mfu"] > 0 for x in lines)
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 100


def test_resume_on_another_plan_and_refusals(gpt, tmp_path):
    """A checkpoint of one plan (data=2 x model=4) continues in another (fsdp=8): the losses
    within 1e-5; a checkpoint of other options is refused in one line. The one resumed was
    saved in the background while the next steps took (donated) its arrays."""
    wl, plan, straight = gpt
    ck = tmp_path / "ck"
    run(plan, wl, steps=3, checkpoint_dir=str(ck), save_every=1)
    shutil.rmtree(ck / "3")  # resume from step 2, saved before step 3 ran
    other = al.evaluate(wl, "cpu-8", mesh={"fsdp": 8}, rules={"batch": "fsdp", "d_model": "fsdp"})
    res = run(other, wl, steps=6, checkpoint_dir=str(ck), resume=True)
    assert res.start_step == 2 and res.losses == pytest.approx(straight[:6], rel=1e-5)
    assert any("restored into mesh fsdp=8" in n for n in res.notes), res.notes
    two = load_model("gpt", layers=2)
    p2 = al.evaluate(two, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    with pytest.raises(al.PlanError, match="resume with the model and options it was saved"):
        run(p2, two, steps=6, checkpoint_dir=str(ck), resume=True)
    with pytest.raises(al.PlanError, match="resume with --seed 0"):
        run(plan, wl, steps=8, checkpoint_dir=str(ck), resume=True, seed=1)


def test_bad_checkpoint_and_metrics_paths_are_found_before_the_first_step(tmp_path):
    plan = tmp_path / "plan.json"
    load = load_model("gpt", layers=1)
    al.evaluate(load, "cpu-8", mesh={"data": 8}, rules={"batch": "data"}).to_json(plan)
    (tmp_path / "file").write_text("")
    from click.testing import CliRunner

    from autolayout._cli import main

    for extra, says in ((["--checkpoint-dir", str(tmp_path / "file")], "is a file"),
                        (["--metrics", str(tmp_path / "no" / "m.jsonl")], "does not exist"),
                        (["--resume"], "--resume needs --checkpoint-dir")):  # fmt: skip
        r = CliRunner().invoke(main, ["run", GPT, "--plan", str(plan), "--set", "layers=1",
                                      "--steps", "1", *extra])  # fmt: skip
        assert r.exit_code == 2 and says in r.output and "step 1" not in r.output, r.output


def test_cluster_environments_are_detected():
    slurm = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}  # fmt: skip
    assert detect_cluster(slurm) == "SLURM" and cluster_identity(slurm) == (1, 2)
    assert detect_cluster({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: no start-up
    assert detect_cluster({"OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1",
                           "OMPI_COMM_WORLD_SIZE": "4"}) == "Open MPI"  # fmt: skip
    assert detect_cluster({"TPU_WORKER_HOSTNAMES": "w0,w1,w2,w3"}) == "TPU pod"
    assert detect_cluster({}) is None
    log = ["E1206 coordination_service.cc:1549] ... UNAVAILABLE: The following tasks are "
           "unhealthy (stopped sending heartbeats):", "1", "The tasks have crashed."]  # fmt: skip
    assert dead_peers(log) == ([1], False)
    assert dead_peers(["... Either the leader task was preempted/died ..."]) == ([], True)


# --- several processes ---------------------------------------------------------------------


def _free_port(low: int = 20000, high: int = 60000) -> int:
    for port in range(low + os.getpid() % 1000, high):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def _start(plan: Path, tmp: Path, i: int, extra: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autolayout._cli", "run", GPT, "--plan", str(plan), "--set",
         "layers=1", "--devices", "4", *extra],
        env=env, cwd=ROOT, stdout=(tmp / f"out{i}").open("w"), stderr=(tmp / f"err{i}").open("w"),
    )  # fmt: skip


def _wait_for(path: Path, text: str, limit_s: float = 240) -> None:
    end = time.monotonic() + limit_s
    while text not in path.read_text():
        assert time.monotonic() < end, path.read_text()[-2000:]
        time.sleep(0.2)


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS" and not k.startswith("SLURM")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def test_two_slurm_processes_stop_on_sigterm_and_resume(gpt, tmp_path):
    """Two processes started with SLURM's variables and no coordinator flags train; SIGTERM
    to one makes both save at the same step and exit 0 with one line; both resume from it
    with the losses of a run never stopped."""
    wl, plan, straight = gpt
    path = tmp_path / "plan.json"
    plan.to_json(path)
    port = _free_port(61440, 65535)  # JAX's SLURM port: 61440 + job id % 4096
    ck = tmp_path / "ck"

    def start(extra):
        return [_start(path, tmp_path, i, ["--checkpoint-dir", str(ck), *extra],
                       _env(SLURM_JOB_ID=str(port - 61440), SLURM_NTASKS="2",
                            SLURM_PROCID=str(i), SLURM_LOCALID=str(i),
                            SLURM_STEP_NODELIST="localhost"))
                for i in range(2)]  # fmt: skip

    procs = start(["--steps", "1000", "--metrics", str(tmp_path / "m.jsonl")])
    _wait_for(tmp_path / "out1", "step 2:")
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=240) for p in procs]
    outs = [(tmp_path / f"out{i}").read_text() for i in range(2)]
    assert codes == [0, 0], outs + [(tmp_path / f"err{i}").read_text() for i in range(2)]
    assert "(2 processes, cpu, SLURM)" in outs[0]
    stops = [o.strip().splitlines()[-1] for o in outs]
    k = int(stops[0].split("after step ")[1].split(":")[0])
    for i, line in enumerate(stops):
        assert line == (f"[process {i}] stopped by SIGTERM after step {k}: checkpoint {ck / str(k)}"
                        "; continue with --resume"), line  # fmt: skip
    metrics = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in metrics] == list(range(1, k + 1))
    procs = start(["--steps", str(k + 2), "--resume", "--out", str(tmp_path / "r.json")])
    codes = [p.wait(timeout=240) for p in procs]
    assert codes == [0, 0], (tmp_path / "err0").read_text()
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["start_step"] == k and got["processes"] == 2
    assert k + 2 <= len(straight), k
    assert got["losses"] == pytest.approx(straight[: k + 2], rel=1e-5)


def test_a_dead_peer_ends_the_other_process_with_one_line(gpt, tmp_path):
    """One of two processes SIGKILLed: the other exits (1) within 60 s, one line on stderr
    naming the dead process and the last checkpoint, no C++ frames; its metrics file has a
    whole line per finished step."""
    _, plan, _ = gpt
    path = tmp_path / "plan.json"
    plan.to_json(path)
    port, ck = _free_port(), tmp_path / "ck"
    procs = [
        _start(path, tmp_path, i, ["--steps", "100000", "--coordinator", f"127.0.0.1:{port}",
                                   "--num-processes", "2", "--process-id", str(i),
                                   "--checkpoint-dir", str(ck), "--save-every", "2",
                                   "--heartbeat-timeout", "5", "--metrics",
                                   str(tmp_path / "m.jsonl")], _env())
        for i in range(2)
    ]  # fmt: skip
    _wait_for(tmp_path / "out0", "step 3:")
    # the save of step 2 runs in the background: under load it may not have landed by step 3
    end = time.monotonic() + 240
    while not any(d.name.isdigit() for d in ck.glob("*")):
        assert time.monotonic() < end and all(q.poll() is None for q in procs)
        time.sleep(0.2)
    procs[1].kill()
    t = time.monotonic()
    rc = procs[0].wait(timeout=90)
    took = time.monotonic() - t
    err = (tmp_path / "err0").read_text().strip().splitlines()
    assert rc == 1 and took < 60, (rc, took, err)
    assert len(err) == 1 and err[0].startswith("error: process 0 of 2: process 1 stopped "), err
    saved = sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    assert saved and f"last checkpoint: {ck / str(saved[-1])};" in err[0], (err, saved)
    printed = (tmp_path / "out0").read_text().count("] step ")
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, len(lines) + 1))
    assert len(lines) >= printed >= 3


def test_a_background_save_failure_is_not_logged_as_a_traceback(tmp_path, caplog):
    """Orbax logs a save its thread failed (a peer died mid-save) with a traceback; the wait
    after it raises the failure again, so the run says it in one line: the log is dropped,
    and Orbax's other errors are not."""
    import logging

    from autolayout.runtime.checkpoint import Checkpoints

    ck = Checkpoints(tmp_path / "ck", save_every=1)
    absl = logging.getLogger("absl")
    with caplog.at_level(logging.ERROR, logger="absl"):
        try:
            raise RuntimeError("barrier timed out")
        except RuntimeError:
            absl.error("[process=0] Failed to run 4 Handler Commit operations or the Commit "
                       "callback in background save thread, directory: x", exc_info=True)  # fmt: skip
        absl.error("another failure")
    assert [r.getMessage() for r in caplog.records] == ["another failure"]
    ck.close()
