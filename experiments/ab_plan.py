"""A/B: the same ``autolayout plan`` commands under two checkouts, interleaved.

A change meant to make planning faster (or no slower) must give the same plans: this runs
each command under checkout A and checkout B in turn (A, B, A, B, ...; so a machine other
work keeps busy slows both alike), records the process's wall time and peak memory and the
plan's answer (status, mesh, step time, gap), and says where the answers differ.

    python experiments/ab_plan.py --a /tmp/civenv9/bin/python --b python --rounds 2 \\
        --out experiments/results

``--a``/``--b``: Python interpreters whose ``autolayout`` is the checkout to time (each run
from ``/`` so that an editable install's own checkout is imported, not this folder's). Writes
``ab_plan.csv`` (a row a run) and ``ab_plan.png`` (wall time per command, A beside B) into
``--out`` (default a fresh ``results/runs/<time>/``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import take_out  # noqa: E402

ROOT = Path(__file__).resolve().parent
GPT = str(ROOT / "models" / "gpt.py")
# (label, arguments of `autolayout plan`): the issue-37 targets and the README's main job
COMMANDS = [
    ("llama3-8b h100-64 mesh search",
     [GPT, "--hw", "h100-64", "--set", "size=llama3-8b", "--set", "scan=true", "--set", "batch=16"]),
    ("gpt3-175b 96 layers tpu-v4-1024 remat=auto 10 s",
     [GPT, "--hw", "tpu-v4-1024", "--set", "size=gpt3-175b", "--set", "attention=naive",
      "--time-limit", "10"]),
    ("gpt3-175b 96 layers tpu-v4-1024 remat=auto 60 s",
     [GPT, "--hw", "tpu-v4-1024", "--set", "size=gpt3-175b", "--set", "attention=naive",
      "--time-limit", "60"]),
    ("README main job (gpt3-6.7b tpu-v4-256)",
     [GPT, "--hw", "tpu-v4-256", "--set", "size=gpt3-6.7b", "--set", "scan=true", "--set",
      "remat=full", "--time-limit", "20"]),
]  # fmt: skip


# the CLI, printing its own peak memory as it exits
_CHILD = (
    "import atexit, resource, sys; atexit.register(lambda: print('PEAK_RSS_KB', "
    "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)); "
    "sys.argv[0] = 'autolayout'; from autolayout._cli import entry; entry()"
)


def run_once(python: str, args: list[str]) -> dict:
    """One ``autolayout plan`` process: its wall time, peak memory and answer."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = [python, "-c", _CHILD, "plan", *args, "--out", str(out)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd="/", capture_output=True, text=True)
        wall = time.perf_counter() - t0
        rss = [ln.split()[1] for ln in proc.stderr.splitlines() if ln.startswith("PEAK_RSS_KB ")]
        row = {"wall_s": wall, "rc": proc.returncode,
               "peak_rss_gib": int(rss[-1]) / 2**20 if rss else None}  # fmt: skip
        if proc.returncode != 0 or not out.exists():
            row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return row
        p = json.loads(out.read_text())
        s = p["solver"]
        row.update(status=p["status"], mesh=json.dumps(p["mesh"]["axes"]),
                   step_time_s=p["predicted"]["step_time_s"], gap=s.get("gap"),
                   bound_kind=s.get("bound_kind", ""), solver_wall_s=s.get("wall_s"),
                   work_s=s.get("work_s"), remat=(s.get("remat") or {}).get("policy", ""))  # fmt: skip
        return row


def main() -> pd.DataFrame:
    out = take_out()
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="python of checkout A (the baseline)")
    ap.add_argument("--b", required=True, help="python of checkout B (the change)")
    ap.add_argument("--rounds", type=int, default=2)
    o = ap.parse_args()
    rows = []
    for r in range(o.rounds):
        for label, args in COMMANDS:
            for side, python in (("A", o.a), ("B", o.b)):
                row = {"round": r, "command": label, "side": side, **run_once(python, args)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "ab_plan.csv", index=False)
    plot(df, out / "ab_plan.png")
    answers = df.groupby(["command", "side"])[["mesh", "step_time_s"]].first().unstack("side")
    print(answers.to_string())
    return df


def plot(df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 3.5))
    cmds = list(dict.fromkeys(df.command))
    for i, c in enumerate(cmds):
        for j, side in enumerate(("A", "B")):
            d = df[(df.command == c) & (df.side == side)]
            ax.scatter([d.wall_s.to_numpy()], [i + 0.15 * (j * 2 - 1)] * len(d),
                       color=f"C{j}", label=side if i == 0 else None)  # fmt: skip
    ax.set_yticks(range(len(cmds)), cmds, fontsize=8)
    ax.set_xlabel("autolayout plan, whole process (s)")
    ax.set_xlim(left=0)
    ax.legend(title="checkout")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
