"""Experiments write where they are asked to (issue 38): ``--out DIR``, by default a fresh
``experiments/results/runs/<time>/`` (git-ignored); only ``--out experiments/results``
replaces a committed result, and that is the command each script's docstring records."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

EXPERIMENTS = ROOT / "experiments"
sys.path.insert(0, str(EXPERIMENTS))
import _out  # noqa: E402

# the scripts that write files (flax_logical trains and prints only)
WRITERS = sorted(
    p for p in EXPERIMENTS.glob("*.py")
    if not p.name.startswith("_") and p.name != "flax_logical.py"
)  # fmt: skip


def test_take_out_reads_and_removes_the_flag(tmp_path):
    argv = ["x.py", "20", "--out", str(tmp_path / "a"), "--plot"]
    assert _out.take_out(argv) == tmp_path / "a" and (tmp_path / "a").is_dir()
    assert argv == ["x.py", "20", "--plot"]
    argv = ["x.py", f"--out={tmp_path / 'b'}"]
    assert _out.take_out(argv) == tmp_path / "b" and argv == ["x.py"]
    fresh = _out.fresh()
    assert fresh.parent == ROOT / "experiments" / "results" / "runs" and not fresh.exists()


def test_every_script_writes_to_out_and_says_so():
    assert len(WRITERS) >= 12
    for p in WRITERS:
        text = p.read_text()
        assert "--out" in text, f"{p.name} takes no --out"
        # the committed folder is read (RESULTS) or written through --out, never named itself
        assert not re.search(r'(ROOT|HERE)\s*/\s*"results"', text), p.name
        for cmd in re.findall(r"python experiments/\S+\.py[^\n`]*", text):
            if "results" in cmd:
                assert "--out experiments/results" in cmd, f"{p.name}: {cmd}"


def test_runs_folder_is_ignored_by_git():
    r = subprocess.run(["git", "check-ignore", "-q", "experiments/results/runs/x/a.csv"],
                       cwd=ROOT)  # fmt: skip
    assert r.returncode == 0


def test_a_redraw_writes_to_out_not_to_the_committed_results(tmp_path):
    committed = {p.name: p.stat().st_mtime_ns for p in (EXPERIMENTS / "results").glob("report_*")}
    env = {**os.environ, "MPLBACKEND": "Agg"}
    r = subprocess.run(
        [sys.executable, "experiments/report_figures.py", "--plot", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert {p.name for p in tmp_path.glob("report_*.png")} == {
        "report_step_time.png", "report_mesh_shapes.png", "report_memory.png",
        "report_roofline.png",
    }  # fmt: skip
    after = {p.name: p.stat().st_mtime_ns for p in (EXPERIMENTS / "results").glob("report_*")}
    assert after == committed
