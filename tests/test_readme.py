"""Every shell command in the README runs as written, in a fresh folder, as a newcomer's shell
would run it (no XLA_FLAGS): each ```bash block is one script. The set-up half of the main
job (`pip install -e .`) is what this suite runs under already, and `bash .ci/run` is CI
itself; both are left out of the scripts, nothing else is."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
INSTALL = re.compile(r"^python -m pip install [^&]*&&\s*")


def _blocks() -> list[list[str]]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        lines, cur = [], ""
        for raw in block.splitlines():
            cur += raw.rstrip("\\").strip() + " " if raw.rstrip().endswith("\\") else raw.strip()
            if raw.rstrip().endswith("\\"):
                continue
            line, cur = INSTALL.sub("", cur).strip(), ""
            if line and not line.startswith("#") and line != "bash .ci/run":
                lines.append(line)
        if lines:
            out.append(lines)
    return out


BLOCKS = _blocks()


def test_the_readme_has_its_two_commands():
    """The main job plans a model that must be split; the test command is .ci/run."""
    assert "```bash\nbash .ci/run\n```" in README
    main = BLOCKS[0][0]
    assert main.startswith("autolayout plan experiments/models/gpt.py --hw tpu-v4-256")
    assert (ROOT / ".ci" / "run").read_text().count("python -m pytest") == 1


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """One folder for the whole README, as a reader runs it top to bottom (a later block
    runs the plan.json an earlier one wrote)."""
    folder = tmp_path_factory.mktemp("readme")
    for name in ("experiments", "hw_profiles"):
        (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.mark.parametrize("k", range(len(BLOCKS)), ids=[b[0][:60] for b in BLOCKS])
def test_readme_commands_run_as_written(shell, k):
    tmp_path = shell
    env = {key: v for key, v in os.environ.items() if key not in ("XLA_FLAGS", "COLUMNS")}
    script = "set -euo pipefail\n" + "\n".join(BLOCKS[k]) + "\nwait\n"
    r = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{script}\n{out[-4000:]}"
    assert "Traceback" not in out and "INFEASIBLE" not in out, out[-4000:]
    if k == 0:  # the main job: a feasible plan that splits the model
        assert re.search(r"\((OPTIMAL|FEASIBLE|TIMEOUT)\)", out), out
        assert re.search(r"rules \(how the inputs are split\):\n  \w", out), out


PYTHON = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if b.startswith("import")]


@pytest.mark.parametrize("k", range(len(PYTHON)), ids=[f"python-{k}" for k in range(len(PYTHON))])
def test_readme_python_blocks_run(monkeypatch, k):
    """The README's self-contained python blocks (those that start with their imports) run
    from the repository root; the others continue a block above them (`plan.summary()`)."""
    assert len(PYTHON) >= 3
    monkeypatch.chdir(ROOT)
    exec(compile(PYTHON[k], f"README.md python block {k}", "exec"), {"__name__": "readme"})
