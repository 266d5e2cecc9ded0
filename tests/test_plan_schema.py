"""Plan files are checked against their schema on load, and model options are typed by
``workload()``'s signature: every hand-broken file or option is one line, exit 2, in every
command that reads it (``report``, ``diff``, ``validate``, ``run``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import autolayout as al
from autolayout._cli import main
from conftest import MODELS

GPT = str(MODELS / "gpt.py")
MLP = str(MODELS / "mlp.py")


@pytest.fixture(scope="module")
def plan_dict(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "plan.json"
    r = CliRunner().invoke(main, ["evaluate", GPT, "--hw", "cpu-8", "--mesh", "data=2,model=4",
                                  "--rules", "batch=data,heads=model", "--out", str(path)])  # fmt: skip
    assert r.exit_code == 0, r.output
    return json.loads(path.read_text())


def _broken(d: dict) -> dict[str, tuple[dict, str]]:
    """Hand-broken copies of a good plan (data=2 x model=4 on cpu-8), with what the error
    must say."""
    mesh = d["mesh"]
    cases = {
        "negative mesh": ({**d, "mesh": {"axes": {"fsdp": -2, "data": -4}, "devices": 8}},
                          "mesh axis 'fsdp' has size -2"),
        "zero axis": ({**d, "mesh": {"axes": {"data": 0, "model": 4}, "devices": 0}},
                      "mesh axis 'data' has size 0"),
        "4x4 on cpu-8": ({**d, "mesh": {"axes": {"data": 4, "model": 4}, "devices": 16}},
                         "has 16 devices and cpu-8 has 8"),
        "devices stated wrong": ({**d, "mesh": {**mesh, "devices": 16}},
                                 "has 8 devices and the file says 16"),
        "rule for a missing dim": ({**d, "rules": d["rules"] + [["experts", ["model"]]]},
                                   "names dim 'experts'"),
        "rule for a missing axis": ({**d, "rules": d["rules"] + [["d_ff", ["tensor"]]]},
                                    "names mesh axis 'tensor'"),
        "spec rank": ({**d, "inputs": [{**d["inputs"][0], "spec": [[]]}] + d["inputs"][1:]},
                      "for a tensor of rank 2"),
        "spec axis": ({**d, "inputs": [{**d["inputs"][0], "spec": [["pipe"], []]}]
                       + d["inputs"][1:]}, "names mesh axis 'pipe'"),
        "not finite": ({**d, "predicted": {**d["predicted"], "step_time_s": float("nan")}},
                       "predicted.step_time_s is nan"),
        "negative bytes": ({**d, "predicted": {**d["predicted"],
                                               "memory_bytes_per_device": -1}},
                           "memory_bytes_per_device is -1, below zero"),
    }  # fmt: skip
    return cases


def test_every_hand_broken_plan_is_one_line_in_every_command(plan_dict, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(plan_dict))
    for name, (d, says) in _broken(plan_dict).items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(json.dumps(d))
        with pytest.raises(al.PlanError, match=None) as e:
            al.Plan.load(path)
        assert says in str(e.value) and str(path) in str(e.value), (name, e.value)
        for args in (["report", str(path)], ["diff", str(good), str(path)],
                     ["validate", GPT, "--plan", str(path)],
                     ["run", GPT, "--plan", str(path), "--steps", "1"]):  # fmt: skip
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 2, (name, args[0], r.output)
            lines = r.output.strip().splitlines()
            assert len(lines) == 1 and says in lines[0], (name, args[0], r.output)
            assert "Traceback" not in r.output
    assert al.Plan.load(good).mesh == {"data": 2, "model": 4}  # the good one still loads


def test_a_plan_for_another_slice_is_not_refused_on_load(plan_dict, tmp_path):
    """The hardware's device count is checked where the name is a profile; a profile file
    that is not here is not (the plan still reads)."""
    d = {**plan_dict, "hardware": "mine-8"}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    assert al.Plan.load(path).hardware == "mine-8"


def test_options_are_typed_by_the_workload_signature():
    with pytest.raises(al.ModelFileError, match=r"scan='maybe' refused: .* true or false"):
        al.load_workload(GPT, scan="maybe")
    with pytest.raises(al.ModelFileError, match=r"layers=2.5 refused: .*whole number"):
        al.load_workload(MLP, layers=2.5)  # annotated int
    with pytest.raises(al.ModelFileError, match=r"layers=2.5 refused: workload\(\) made it 2"):
        al.load_workload(GPT, layers=2.5)  # **overrides, rounded by the model: caught after
    with pytest.raises(al.ModelFileError, match="unexpected keyword argument 'scan'"):
        al.load_workload(MLP, scan=True)
    assert al.load_workload(GPT, dtype=None, layers=1).options["layers"] == 1  # str | None
    assert al.load_workload(MODELS / "moe.py", capacity_factor=2).options["capacity_factor"] == 2.0


def test_unannotated_options_are_typed_by_their_defaults(tmp_path):
    model = tmp_path / "old.py"
    model.write_text(
        "import autolayout as al\n"
        "def workload(layers=2, scan=False, name='x', scale=1.0, extra=None):\n"
        "    return al.Workload(lambda w: (w * scale).sum(), (al.spec((4,), ('d',)),),\n"
        "                       options=dict(layers=layers, scan=scan, scale=scale))\n"
    )
    assert al.load_workload(model, layers=3, scale=2, name=5, extra=[1]).options["scale"] == 2.0
    for bad, says in ((dict(scan="maybe"), "true or false (default False)"),
                      (dict(layers=2.5), "whole number (default 2)"),
                      (dict(scale=True), "a number (default 1.0)")):  # fmt: skip
        with pytest.raises(al.ModelFileError, match=r"refused: workload\(\) takes"):
            al.load_workload(model, **bad)
        r = CliRunner().invoke(
            main, ["trace", str(model), "--set", f"{next(iter(bad))}={next(iter(bad.values()))}"]
        )
        assert r.exit_code == 2 and says in r.output and len(r.output.splitlines()) == 1, r.output


def test_set_options_are_refused_in_one_line_by_the_cli():
    for args in (["trace", GPT, "--set", "scan=maybe"], ["trace", GPT, "--set", "layers=2.5"],
                 ["evaluate", MLP, "--hw", "cpu-8", "--layout", "dp", "--set", "layers=2.5"]):  # fmt: skip
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 2 and "refused" in r.output, (args, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
