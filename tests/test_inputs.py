"""What a command or a call is handed is checked before the work starts (limits positive and
finite, output files writable), in one line; and every file autolayout writes is written
whole (``core/_atomic.py``): a reader never sees half of one."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
from click.testing import CliRunner

import autolayout as al
from autolayout._cli import main
from autolayout.core import InputError, atomic_write, check_limit, check_writable
from conftest import MODELS, load_model

GPT = str(MODELS / "gpt.py")


def cli(*args):
    return CliRunner().invoke(main, list(args))


def one_line_error(r, message: str) -> None:
    """Exit status 2 and one line on the terminal: ``error: <message>``."""
    assert r.exit_code == 2, r.output
    assert r.output == f"error: {message}\n"


# --- limits ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        # 0 and -1 returned a hand layout marked FEASIBLE; nan searched with no deadline
        (("--time-limit", "0"), "--time-limit must be a positive finite number of seconds, got 0"),
        (("--time-limit", "-1"), "--time-limit must be a positive finite number of seconds, got -1"),
        (("--time-limit", "nan"), "--time-limit must be a positive finite number of seconds, got nan"),
        (("--time-limit", "inf"), "--time-limit must be a positive finite number of seconds, got inf"),
        # "fits in -1 GiB"
        (("--memory-limit", "-1"), "--memory-limit must be a positive finite number of GiB, got -1"),
        (("--memory-limit", "nan"), "--memory-limit must be a positive finite number of GiB, got nan"),
        (("--memory-limit", "0"), "--memory-limit must be a positive finite number of GiB, got 0"),
    ],
)  # fmt: skip
def test_plan_refuses_a_limit_that_is_not_positive_and_finite(args, message):
    one_line_error(cli("plan", GPT, "--hw", "cpu-8", *args), message)


def test_compare_refuses_a_bad_time_limit():
    r = cli("compare", GPT, "--hw", "cpu-8", "--time-limit", "-5")
    one_line_error(r, "--time-limit must be a positive finite number of seconds, got -5")


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "60", True, None])
def test_check_limit_names_the_option_and_the_value(value):
    with pytest.raises(
        InputError, match=r"^time_limit_s must be a positive finite number of seconds, got "
    ):
        check_limit("time_limit_s", value, "seconds")
    assert check_limit("time_limit_s", 2, "seconds") == 2.0


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_al_plan_refuses_a_bad_time_limit(value):
    with pytest.raises(
        ValueError, match=r"time_limit_s must be a positive .*number of seconds, got"
    ):
        al.plan(load_model("mlp"), "cpu-8", time_limit_s=value)


def test_al_plan_refuses_a_negative_memory_limit():
    with pytest.raises(
        ValueError, match=r"memory_limit must be a positive finite number of bytes, got -1"
    ):
        al.plan(load_model("mlp"), "cpu-8", memory_limit=-1, time_limit_s=1)


# --- output files checked before the work --------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("plan", GPT, "--hw", "cpu-8", "--out", "{missing}/p.json"),
        ("evaluate", GPT, "--hw", "cpu-8", "--layout", "dp", "--out", "{missing}/p.json"),
        ("run", GPT, "--plan", "no-such-plan.json", "--out", "{missing}/p.json"),
        ("calibrate", "--out", "{missing}/p.json"),
    ],
    ids=["plan", "evaluate", "run", "calibrate"],
)
def test_an_out_file_in_a_missing_directory_is_refused_before_any_work(tmp_path, args):
    # plan searched for its whole time limit and then failed (exit 3); run would train and
    # calibrate measure first
    missing = tmp_path / "no" / "such"
    r = cli(*(a.format(missing=missing) for a in args))
    one_line_error(
        r, f"--out {missing}/p.json: directory {missing} does not exist (create it first)"
    )


def test_report_checks_its_html_file_before_reading_the_plan(tmp_path):
    r = cli("report", "no-such-plan.json", "--html", str(tmp_path / "x" / "r.html"))
    one_line_error(
        r, f"--html {tmp_path}/x/r.html: directory {tmp_path}/x does not exist (create it first)"
    )


def test_check_writable_says_what_is_wrong(tmp_path):
    assert check_writable(tmp_path / "p.json") == tmp_path / "p.json"
    with pytest.raises(InputError, match=r"^--out .*: is a directory; give a file name$"):
        check_writable(tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(
                InputError, match=r"^--html .*ro/p.html: directory .*ro is not writable$"
            ):
                check_writable(ro / "p.html", "--html")
        finally:
            ro.chmod(0o700)


# --- files written whole -------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_plans():
    wl = load_model("gpt")
    small = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    large = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    large.solver["padding"] = "x" * 2_000_000  # a rewrite of very different length
    return small, large


def test_a_reader_polling_a_plan_file_never_sees_invalid_json(tmp_path, two_plans):
    # Path.write_text truncated the file, then wrote it: a reader polling a plan saw invalid
    # JSON 131 times in 927 reads
    path = tmp_path / "plan.json"
    two_plans[0].to_json(path)
    done = threading.Event()

    def rewrite():
        for i in range(60):
            two_plans[i % 2].to_json(path)
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    reads, bad = 0, 0
    while not done.is_set():
        try:
            json.loads(path.read_text())
        except ValueError:
            bad += 1
        reads += 1
    writer.join()
    assert reads > 100 and bad == 0, (reads, bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]  # no temporary left


def test_a_rewrite_keeps_the_file_s_permissions_and_a_link(tmp_path):
    target = tmp_path / "real.json"
    atomic_write(target, "{}")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic_write(link, '{"a": 1}')
    assert link.is_symlink() and target.read_text() == '{"a": 1}'
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "p.json"
    atomic_write(path, "old")
    with pytest.raises(UnicodeEncodeError):
        atomic_write(path, "new \ud800")  # a lone surrogate: not UTF-8, fails mid-write
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]
