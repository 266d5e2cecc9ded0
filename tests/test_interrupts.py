"""Ctrl-C and SIGTERM (``search/interrupt.py``): the first ends a search with the best plan so
far, marked interrupted, exit status 130 (143); a second ends the process at once; a CP-SAT
solve no longer swallows a Ctrl-C or leaves SIG_DFL behind (OR-Tools 9.15: of 9 Ctrl-Cs
during `autolayout plan`, 5 were ignored and 4 killed it without a word)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import autolayout as al
from autolayout.search import clock, ilp, interrupted, stoppable
from autolayout.search import request as rq
from autolayout.search import structure as st_mod
from autolayout.search.interrupt import mark
from autolayout.search.meshes import mesh_shapes
from conftest import MODELS, load_model

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads the handlers from /proc (Linux)"
)


def caught(sig: int, pid: int | str = "self") -> bool:
    """Whether the process has a handler of ``sig`` installed at the C level (SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def signal_self_and_wait(stop, sig=signal.SIGINT) -> None:
    """Sends ``sig`` to this process inside a :func:`stoppable` block (there only: outside
    the main thread nothing is installed, and the signal would end the test run)."""
    assert threading.current_thread() is threading.main_thread()
    os.kill(os.getpid(), sig)
    t = time.perf_counter()
    while stop.signal is None and time.perf_counter() - t < 2:
        time.sleep(0.01)


def test_a_solve_leaves_python_s_handler_in_place():
    # CP-SAT's solve left SIG_DFL at the C level: the next Ctrl-C killed the process
    g = al.trace(load_model("gpt"))
    req = rq.build(st_mod.analyse(g), al.hardware("cpu-8"), {"data": 8})
    # a budget of work, not of seconds: on a loaded machine 5 s of wall time did not build
    # the model (UNKNOWN, 2026-12-06, beside two busy loops)
    assert ilp.solve(req, time_limit_s=5, deterministic=True).status in ("OPTIMAL", "FEASIBLE")
    assert caught(signal.SIGINT)


def test_a_signal_stops_a_solve_under_way():
    hw = al.hardware("tpu-v4-256")
    g = al.trace(load_model("gpt", target=hw, size="gpt3-xl", layers=2))
    req = rq.build(st_mod.analyse(g, share=True), hw, mesh_shapes(hw)[3])  # a 30 s solve
    before = signal.getsignal(signal.SIGINT)
    with stoppable() as stop:
        timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        t = time.perf_counter()
        sol = ilp.solve(req, time_limit_s=30)
        took = time.perf_counter() - t
        timer.join()
        assert interrupted()
    assert stop.signal == signal.SIGINT and stop.exit_code == 130
    assert took < 5, took  # 1.5 s to the signal, then stop_search
    assert sol.status in ("FEASIBLE", "UNKNOWN")
    assert not interrupted()  # the flag lives as long as the block
    assert signal.getsignal(signal.SIGINT) is before and caught(signal.SIGINT)


def test_blocks_nest_and_give_the_handlers_back():
    term = signal.getsignal(signal.SIGTERM)
    with stoppable() as outer:
        with stoppable() as inner:
            assert inner is outer
        assert signal.getsignal(signal.SIGTERM) is not term
    assert signal.getsignal(signal.SIGTERM) is term


def test_a_plan_returned_after_a_signal_says_so():
    p = al.evaluate(load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    assert "interrupted" not in mark(p).solver
    with stoppable() as stop:
        signal_self_and_wait(stop, signal.SIGTERM)
        mark(p)
    assert p.solver["interrupted"] is True and p.status == "EVALUATED"
    assert p.solver["stopped"].startswith("interrupted by SIGTERM")


# --- `autolayout plan` as a process --------------------------------------------------------


def _deadlines_end_on_a_signal() -> bool:
    """Whether the search's clock reads every deadline as passed once a signal came (the
    hook search/clock.py's ``now()`` needs; without it a search runs to its limit)."""
    with stoppable() as stop:
        signal_self_and_wait(stop)
        return clock.now() > time.perf_counter() + 1e6


# gpt3-xl at 2 layers on tpu-v4-256: 22 mesh shapes, ~60 s of search here; tracing 0.4 s,
# seeding 2-5 s (by the machine's load), the ILP after; the process exits 1-2 s after a signal
COMMAND = [sys.executable, "-m", "autolayout._cli", "plan", str(MODELS / "gpt.py"), "--hw",
           "tpu-v4-256", "--set", "size=gpt3-xl", "--set", "layers=2", "--time-limit", "60"]  # fmt: skip
# CPU seconds of the command's, after its handlers are in, at which SIGINT is sent: tracing,
# seeding the shapes, the ILP (CPU seconds, not wall: a busy machine stretches the wall time
# of each stage, so fixed wall delays all fell on seeding there)
DELAYS = (0.0, 0.5, 1.5, 2.5, 4.0, 6.0)  # two a stage (ten took 80 s of the suite)


def _cpu_s(pid: int) -> float:
    """The CPU seconds process ``pid`` has used (user + system, /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(tmp: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp / "plan.json"
    p = subprocess.Popen(COMMAND + ["--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    return p, out


def _signal(p: subprocess.Popen, out: Path, signals: list[tuple[float, int]], then=None) -> dict:
    """Sends ``(delay, signal)``s once the command's handlers are in, calls ``then`` (the
    next command's start: its imports beside this one's answer), and waits: the exit status,
    seconds from the last signal to the exit, stderr, and the plan file (None if absent)."""
    t0 = time.perf_counter()
    while p.poll() is None and not caught(signal.SIGTERM, p.pid):  # python catches SIGINT always
        assert time.perf_counter() - t0 < 60, "the command did not start"
        time.sleep(0.02)
    start, sent = _cpu_s(p.pid), time.perf_counter()
    for k, (delay, sig) in enumerate(signals):
        if k:  # a second signal: ``delay`` wall seconds after the first
            time.sleep(max(0.0, delay - signals[k - 1][0]))
        else:
            while p.poll() is None and _cpu_s(p.pid) < start + delay:
                time.sleep(0.01)
        sent = time.perf_counter()
        p.send_signal(sig)
    nxt = then() if then else None
    try:
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    plan = json.loads(out.read_text()) if out.exists() else None
    return {"rc": p.returncode, "answer_s": time.perf_counter() - sent, "stderr": err,
            "plan": plan, "next": nxt}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not _deadlines_end_on_a_signal():
        pytest.skip("search/clock.py's now() does not read interrupted() yet (issue 34 item 4)")
    cases = {f"SIGINT at {d} s": [(d, signal.SIGINT)] for d in DELAYS}
    cases["SIGTERM at 2 s"] = [(2.0, signal.SIGTERM)]
    cases["SIGINT twice"] = [(1.5, signal.SIGINT), (1.55, signal.SIGINT)]
    # one at a time, each started as the one before answers (~45 s for the eight): two at
    # once on the 2-core machine, beside others' work, took up to 5.9 s to answer where one
    # alone took 1.5
    out, names = {}, list(cases)
    started = _start(tmp_path_factory.mktemp("run"))
    for i, name in enumerate(names):
        last = i == len(names) - 1
        then = None if last else lambda: _start(tmp_path_factory.mktemp("run"))
        out[name] = _signal(*started, cases[name], then)
        started = out[name].pop("next")
    return out


def _stage(plan: dict) -> str:
    """How far the search had got when the signal came, from the shapes it reports."""
    tried = plan["solver"]["mesh_shapes_tried"]
    if any(r["status"] in ("OPTIMAL", "FEASIBLE", "TIMEOUT", "INFEASIBLE") for r in tried):
        return "ilp"
    return "seeding" if sum(r["status"] != "SKIPPED" for r in tried) > 1 else "before seeding"


def test_a_sigint_ends_the_search_with_the_best_plan_in_5_s(runs):
    stages = []
    for name, r in runs.items():
        if not name.startswith("SIGINT at"):
            continue
        assert r["rc"] == 130, (name, r["stderr"])
        assert r["answer_s"] < 5, (name, r["answer_s"])
        assert "Traceback" not in r["stderr"], (name, r["stderr"])
        assert sum("SIGINT" in line for line in r["stderr"].splitlines()) == 1, r["stderr"]
        p = r["plan"]
        assert p is not None, name
        assert p["solver"]["interrupted"] is True, name
        assert p["solver"]["stopped"].startswith("interrupted by SIGINT"), name
        assert p["status"] in ("OPTIMAL", "FEASIBLE", "TIMEOUT", "INFEASIBLE"), name
        stages.append(_stage(p))
    print({k: round(r["answer_s"], 2) for k, r in runs.items()}, stages)
    # the signals fell on tracing (the first shape is seeded all the same), seeding and the ILP
    assert {"before seeding", "seeding", "ilp"} <= set(stages), stages


def test_sigterm_ends_the_search_the_same_way_with_status_143(runs):
    r = runs["SIGTERM at 2 s"]
    assert r["rc"] == 143 and r["answer_s"] < 5, r
    assert r["plan"]["solver"]["stopped"].startswith("interrupted by SIGTERM")
    assert "Traceback" not in r["stderr"]


def test_a_second_sigint_ends_the_process_at_once(runs):
    r = runs["SIGINT twice"]
    # at once: os._exit from the watcher thread (0.03-0.08 s idle; a busy machine's scheduler
    # can hold the thread and the wait for the exit status a second or two)
    assert r["rc"] == 130 and r["answer_s"] < 2.5, r
    lines = r["stderr"].strip().splitlines()
    # the second stops it at once, unless the first's answer was out already (130 either way)
    again = lines[-1] == "autolayout: SIGINT again: stopped at once"
    assert again or lines[-1].startswith("autolayout: SIGINT: ending the search"), r["stderr"]
    assert "Traceback" not in r["stderr"]
