"""One set of defaults (issue 38, item 4): ``al.plan`` and ``autolayout plan`` read theirs from
``autolayout/core/_defaults.py``, so the API and the command line answer one question with
one plan; before, ``al.plan`` planned the step as written and answered INFEASIBLE where the
command line chose a remat policy (HF Flax Llama-2-7B on tpu-v4-256 and h100-64)."""

import gc
import inspect
import json

from test_clock import _cli_plan, _plan_file

import autolayout as al
from autolayout._cli import plan_cmd
from autolayout.core import DEFAULT_REMAT, DEFAULT_SCHEDULE, DEFAULT_TIME_LIMIT_S
from autolayout.search.planner import compare
from conftest import MODELS

# a memory limit (GiB a device) under which tiny GPT on cpu-8 fits only with remat: the step
# as written needs 1.64 MB at the least found, dots_saveable 0.94 MB
NEEDS_REMAT_GIB = 0.000992


def _cli_default(name: str):
    return next(p.default for p in plan_cmd.params if p.name == name)


def test_the_api_and_the_command_line_read_one_set_of_defaults():
    sig = inspect.signature(al.plan).parameters
    assert sig["remat"].default == _cli_default("remat") == DEFAULT_REMAT == "auto"
    assert sig["time_limit_s"].default == _cli_default("time_limit") == DEFAULT_TIME_LIMIT_S
    assert sig["schedule"].default == _cli_default("schedule") == DEFAULT_SCHEDULE
    assert inspect.signature(compare).parameters["time_limit_s"].default == DEFAULT_TIME_LIMIT_S


def test_a_model_that_needs_remat_gets_one_plan_from_the_api_and_the_command_line(tmp_path):
    cli = tmp_path / "cli.json"
    _cli_plan(MODELS / "gpt.py", "cpu-8", cli, "size=tiny", limit=20, remat=None,
              extra=("--memory-limit", str(NEEDS_REMAT_GIB)))  # fmt: skip
    wl = al.load_workload(MODELS / "gpt.py", size="tiny", target="cpu-8")
    p = al.plan(wl, "cpu-8", time_limit_s=20, memory_limit=NEEDS_REMAT_GIB * 2**30)
    # the call pauses the collector (search/planner.py::_call) and gives it back
    assert gc.isenabled()
    api = tmp_path / "api.json"
    p.to_json(api)
    a, c = _plan_file(api), _plan_file(cli)
    assert a["status"] != "INFEASIBLE" and a["solver"]["remat"]["policy"] != "as_written", a
    assert json.dumps(a, sort_keys=True) == json.dumps(c, sort_keys=True)
