import pytest
from click.testing import CliRunner

from autolayout._cli import main, parse_sets
from conftest import MODELS


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_hw_lists_every_family():
    r = run("hw")
    assert r.exit_code == 0
    for fam in ("tpu-v4", "tpu-v5e", "h100", "gb200-nvl72", "cpu"):
        assert fam in r.output


def test_hw_shows_one_slice_with_its_topology():
    r = CliRunner().invoke(main, ["hw", "tpu-v4-256"], env={"COLUMNS": "80"})
    assert r.exit_code == 0
    assert "devices      128" in r.output and "4x4x8 torus (wrap,wrap,wrap)" in r.output
    assert max(map(len, r.output.splitlines())) <= 80  # the sources' notes wrap
    assert "efficiency   matmul 0." in r.output and "0.0000" not in r.output  # 3 digits


def test_trace_prints_dims_op_counts_and_opaque_ops():
    r = run("trace", str(MODELS / "gpt.py"), "--set", "scan=true", "--set", "layers=3")
    assert r.exit_code == 0, r.output
    assert "d_model                            64" in r.output
    assert "layers                              3" in r.output
    assert "(family seq: seq, seq#2)" in r.output
    assert "dot_general" in r.output and "opaque ops: 0" in r.output
    assert "x 3 trips" in r.output


def test_a_numeric_size_preset_is_found():
    # --set size=128 arrives as an integer; the U-Net's presets are named "128", "256"
    r = run("trace", str(MODELS / "unet3d.py"), "--set", "size=128")
    assert r.exit_code == 0, r.output
    assert "depth" in r.output and "128" in r.output


def test_set_values_are_parsed():
    assert parse_sets(("size=gpt3-175b", "layers=4", "scan=true", "lr=1e-3")) == {
        "size": "gpt3-175b", "layers": 4, "scan": True, "lr": 1e-3,
    }  # fmt: skip


@pytest.mark.parametrize(
    "content, message",
    [
        (None, r"error: model file '.*missing.py' does not exist"),
        (
            "x = 1\n",
            r"error: .*model.py defines no workload\(\) function; a model file must define workload",
        ),
        (
            "raise RuntimeError('boom')\n",
            r"error: .*model.py: importing the model file raised RuntimeError: boom",
        ),
        (
            "def workload(**kw):\n    raise ValueError('bad size')\n",
            r"error: .*model.py: workload\(\) raised ValueError: bad size",
        ),
        (
            "def workload(**kw):\n    return 3\n",
            r"error: .*model.py: workload\(\) returned int, expected al.Workload",
        ),
    ],
)
def test_bad_model_files_are_one_line_errors(tmp_path, content, message):
    import re

    path = tmp_path / ("missing.py" if content is None else "model.py")
    if content is not None:
        path.write_text(content)
    r = run("trace", str(path))
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and re.match(message, lines[0]), r.output
    assert "Traceback" not in r.output


def test_debug_shows_the_exception(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("raise RuntimeError('boom')\n")
    r = run("--debug", "trace", str(path))
    assert r.exit_code != 0 and isinstance(r.exception, Exception) and "boom" in str(r.exception)


def test_unknown_hardware_is_a_one_line_error():
    r = run("hw", "tpu-v9-8")
    assert r.exit_code == 2 and r.output.startswith("error: unknown hardware 'tpu-v9-8'")


def test_bad_set_is_a_usage_error():
    r = run("trace", str(MODELS / "mlp.py"), "--set", "oops")
    assert r.exit_code == 2 and "expected KEY=VALUE" in r.output


def test_evaluate_then_validate_a_plan_file(tmp_path):
    plan = tmp_path / "plan.json"
    gpt = str(MODELS / "gpt.py")
    r = run("evaluate", gpt, "--hw", "cpu-8", "--mesh", "data=2,model=4",
            "--rules", "batch=data,heads=model,d_ff=model", "--out", str(plan))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "mesh data=2 x model=4" in r.output and "heads -> model" in r.output
    assert plan.exists()
    r = run("validate", gpt, "--plan", str(plan))
    assert r.exit_code == 0, r.output
    assert "all-reduce" in r.output and "ok" in r.output


def test_validate_exits_non_zero_when_the_prediction_is_off(tmp_path):
    import json

    plan = tmp_path / "plan.json"
    gpt = str(MODELS / "gpt.py")
    assert (
        run("evaluate", gpt, "--hw", "cpu-8", "--layout", "fsdp", "--out", str(plan)).exit_code == 0
    )
    d = json.loads(plan.read_text())
    for c in d["collectives"]:
        if c["kind"] == "all-gather":
            c["bytes_per_device"] *= 2  # a prediction twice what XLA will compile
    plan.write_text(json.dumps(d))
    r = run("validate", gpt, "--plan", str(plan))
    assert r.exit_code == 1
    assert "all-gather off by more than 10%" in r.output


def test_validate_refuses_too_few_devices(tmp_path):
    plan = tmp_path / "plan.json"
    gpt = str(MODELS / "gpt.py")
    assert (
        run("evaluate", gpt, "--hw", "cpu-8", "--layout", "dp", "--out", str(plan)).exit_code == 0
    )
    r = run("validate", gpt, "--plan", str(plan), "--devices", "4")
    assert r.exit_code == 2
    assert "needs 8 devices but 4 are available" in r.output


def test_validate_refuses_a_plan_for_another_model(tmp_path):
    plan = tmp_path / "plan.json"
    assert run("evaluate", str(MODELS / "mlp.py"), "--hw", "cpu-8", "--layout", "dp",
               "--out", str(plan)).exit_code == 0  # fmt: skip
    r = run("validate", str(MODELS / "gpt.py"), "--plan", str(plan))
    assert r.exit_code == 2
    assert "was made for 'mlp'" in r.output and "another model" in r.output
    # the same model at another size: the arguments' shapes differ
    assert run("evaluate", str(MODELS / "gpt.py"), "--hw", "cpu-8", "--layout", "dp",
               "--out", str(plan)).exit_code == 0  # fmt: skip
    r = run("validate", str(MODELS / "gpt.py"), "--plan", str(plan), "--set", "d_ff=128")
    assert r.exit_code == 2
    assert "was made with d_ff=256, not --set d_ff=128" in r.output


def test_plan_prints_mesh_rules_and_writes_a_plan(tmp_path):
    out = tmp_path / "plan.json"
    r = run("plan", str(MODELS / "mlp.py"), "--hw", "cpu-8", "--set", "batch=64",
            "--time-limit", "15", "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "mesh" in r.output and "rules (how the inputs are split):" in r.output
    assert "MFU" in r.output
    assert "costliest ops (" in r.output and "searched 4 mesh shapes" in r.output
    import autolayout as al

    p = al.Plan.load(out)
    assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT") and p.devices == 8
    assert p.solver["stopped"], "why the search ended is always said"


def test_the_main_job_reads_as_a_success_in_80_columns(monkeypatch):
    """The README's main job (issue 38): every line within 80 columns, the first lines the
    mesh and a status in words (it read ``(TIMEOUT)`` on a plan within 0.8% of its bound),
    why the search ended, and no line a progress bar left."""
    monkeypatch.setenv("COLUMNS", "80")
    r = run("plan", str(MODELS / "gpt.py"), "--hw", "tpu-v4-256", "--set", "size=gpt3-6.7b",
            "--set", "scan=true", "--set", "remat=full", "--time-limit", "20")  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert all(len(x) <= 80 for x in lines), [x for x in lines if len(x) > 80]
    assert lines[0].startswith("gpt-gpt3-6.7b on tpu-v4-256: mesh "), lines[:2]
    assert lines[1].startswith(("status: found, within", "status: proven")), lines[1]
    assert "TIMEOUT" not in r.output and "INFEASIBLE" not in r.output
    assert "costliest ops (seconds a step; an op in a layer loop summed over its 32" in r.output


def test_plan_bad_mesh_and_infeasible_memory():
    r = run("plan", str(MODELS / "mlp.py"), "--hw", "cpu-8", "--mesh", "data=3")
    assert r.exit_code == 2 and "has 3 devices but cpu-8 has 8" in r.output
    r = run("plan", str(MODELS / "mlp.py"), "--hw", "cpu-8", "--memory-limit", "0.000001",
            "--time-limit", "10")  # fmt: skip
    assert r.exit_code == 1 and "the least memory found needs" in r.output


def test_compare_table_has_every_layout():
    r = run("compare", str(MODELS / "mlp.py"), "--hw", "cpu-8", "--time-limit", "10")
    assert r.exit_code == 0, r.output
    names = [ln.split()[0] for ln in r.output.splitlines() if ln.strip()]
    rows = names[names.index("layout") + 1 :]
    assert rows[0] == "auto" and {"dp", "fsdp", "megatron"} <= set(rows)
    # a layout that cannot be laid out says why (DP and FSDP used to vanish silently)
    assert "spatial        not priced: workload 'mlp': no convolution" in r.output, r.output


def test_an_unexpected_failure_is_one_line_not_a_traceback(monkeypatch):
    import autolayout._cli as cli

    def broken(*a, **k):
        raise RuntimeError("something deep\nbroke")

    monkeypatch.setattr(cli, "trace", broken)
    r = run("trace", str(MODELS / "gpt.py"))
    assert r.exit_code == 3
    assert r.output.strip().count("\n") == 0, r.output
    assert "error: RuntimeError: something deep broke" in r.output and "--debug" in r.output
    r = CliRunner().invoke(main, ["--debug", "trace", str(MODELS / "gpt.py")])
    assert isinstance(r.exception, RuntimeError)


def test_ctrl_c_outside_a_search_is_one_line_and_status_130(monkeypatch):
    """A Ctrl-C in a command without a search (trace, run, validate) printed click's
    "Aborted!" and exit status 1; a search's own answer is tests/test_interrupts.py's."""
    import autolayout._cli as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "trace", interrupted)
    r = run("trace", str(MODELS / "gpt.py"))
    assert r.exit_code == 130 and r.output == "autolayout: interrupted (SIGINT)\n", r.output


def test_a_users_mesh_keeps_its_names_and_rules_read_once_per_dim(tmp_path):
    """--mesh data=2,model=4 came back as model=2 x model2=4; a user's unrolled layers
    printed one rule per layer copy."""
    from conftest import ROOT

    model = str(ROOT / "experiments" / "models" / "my_transformer.py")
    r = run("plan", model, "--hw", "cpu-8", "--mesh", "data=2,model=4", "--time-limit", "10",
            "--deterministic", "--set", "layers=3", "--set", "d_model=128", "--set", "d_ff=512",
            "--out", str(tmp_path / "p.json"))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "mesh data=2 x model=4" in r.output
    import re

    block = r.output.split("rules (how the inputs are split):\n", 1)[1]
    rules = re.findall(r"^  (\S+) -> ", re.split(r"\n(?=\S)", block, maxsplit=1)[0], re.M)
    folded = [re.sub(r"/\d+/", "/*/", d) for d in rules]
    assert rules and len(set(folded)) == len(folded), rules  # one line per dim, not per copy


def test_a_reader_that_left_does_not_cost_the_plan_file(tmp_path):
    """``autolayout plan ... --out p.json | head``: the reader gone before the first line
    (a pipe whose reading end is closed), the command still writes its plan file and exits
    with its own status, quietly. It had stopped at the first line with status 0 and no
    file (a BrokenPipeError caught as "the reader left")."""
    import os
    import subprocess
    import sys

    out = tmp_path / "p.json"
    read, write = os.pipe()
    os.close(read)
    cmd = [sys.executable, "-m", "autolayout._cli", "plan", str(MODELS / "mlp.py"), "--hw",
           "cpu-8", "--time-limit", "5", "--out", str(out)]  # fmt: skip
    r = subprocess.run(cmd, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    os.close(write)
    assert r.returncode == 0, r.stderr
    assert out.exists()
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_an_mfu_under_a_hundredth_prints_its_digits():
    """A tiny model on 8 GPUs read ``MFU 0.000`` (a stranger's four models on h100-8), as if
    the step did no work: below 0.01 an MFU prints two significant digits."""
    from autolayout.core import mfu_text

    assert [mfu_text(x) for x in (0.3052, 0.0854, 0.0061, 0.00012, 0.0)] == [
        "0.305", "0.085", "0.0061", "0.00012", "0.000"]  # fmt: skip
