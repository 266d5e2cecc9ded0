"""autolayout's planner beside meta-pytorch/autoparallel's on the LLaMA-3-8B shape (issue 37, 4)

The shape: Llama-3-8B (dim 4096, 32 layers, 32 heads, 8 KV heads, ffn 14336, vocab 128256)
at sequence 8192, global batch 16, bf16, on 64 H100s. Each round runs, in this order, one
process each (interleaved, so a machine that other work keeps busy slows all three alike):

1. autoparallel on a fixed 8 x 8 mesh (``_autoparallel_llama.py`` in the torch venv: its own
   llama3 model, a fake 64-rank process group, ``optimize_placement()``, CBC through PuLP);
2. autolayout on the fixed mesh: ``autolayout plan experiments/models/gpt.py --hw h100-64
   --set size=llama3-8b --set scan=true --set batch=16 --mesh data=8,model=8``;
3. autolayout's mesh search: the same without ``--mesh``.

Both planners' default time limits (autolayout: 60 s for the command; autoparallel: CBC to
optimality, no limit). Recorded a run: ``plan_s``, the planning from the model's build to the
answer (autoparallel: the model built on the meta device to ``optimize_placement()``'s return;
autolayout: ``load_workload`` to the plan file written); ``process_s``, the whole process
(Python's imports of torch or JAX included); ``peak_rss_gib``, the planner process's own
``ru_maxrss``; ``tree_rss_gib`` and ``children_rss_gib``, the peaks of the process and its
children together and of the children alone, sampled every 0.1 s (CBC runs in a process of
its own); and the answer. autoparallel's: CBC's status and objective (microseconds: its cost
model's compute and communication costs of every op, summed without overlap; not a step time
to set beside autolayout's), the parameters' placements. autolayout's: the plan's status,
mesh, MFU, predicted step time and the gap to its bound; ``solver_wall_s`` is the plan file's
``solver.wall_s``, counted from the process's start.

The committed results (2 rounds, on a 2-core machine shared with other work):

    python experiments/bench_autoparallel.py --rounds 2 --out experiments/results

(writes bench_autoparallel.csv and .png into --out; default a fresh results/runs/<time>/).

The torch side, a venv of its own (a CPU torch; autoparallel from its public repository,
here the commit in the CSV's ``version`` column):

    python -m venv /tmp/apvenv
    /tmp/apvenv/bin/pip install torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \\
        pulp filecheck typing_extensions numpy   # the CPU wheel, or --index-url .../cpu
    git clone https://github.com/meta-pytorch/autoparallel /tmp/autoparallel-src
    /tmp/apvenv/bin/pip install --no-deps -e /tmp/autoparallel-src

autoparallel assumes CUDA; on a CPU torch ``_autoparallel_llama.py`` makes it plan as for
H100s with three patches (a ``cpu`` fake mesh, the H100 entry of its cost model, the cuDNN
attention op its H100 traces use): see ``fake_gpu`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import fresh  # noqa: E402

ROOT = Path(__file__).resolve().parent
AP_CHILD = ROOT / "_autoparallel_llama.py"
GPT = ROOT / "models" / "gpt.py"
AUTOLAYOUT_SETS = ["--set", "size=llama3-8b", "--set", "scan=true", "--set", "batch=16"]

# autolayout's command in a process of its own, as the `autolayout` entry point runs it (the
# time limit counted from the process's start), with the planning timed from the model's load
AL_CHILD = """
import json, resource, sys, time
from autolayout import _cli
marks = {}
_load = _cli.load_workload
def load_workload(*a, **k):
    marks.setdefault("t0", time.perf_counter())
    return _load(*a, **k)
_cli.load_workload = load_workload
sys.argv = ["autolayout", *sys.argv[1:]]
code = 0
try:
    _cli.entry()
except SystemExit as e:
    code = e.code or 0
t1 = time.perf_counter()
print("RESULT " + json.dumps({"plan_s": t1 - marks.get("t0", t1),
      "self_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}), flush=True)
sys.exit(code)
"""


def tree_rss(pid: int) -> tuple[int, int]:
    """Resident bytes now of ``pid`` and its descendants, and of the descendants alone (Linux's
    /proc). A child that still runs its parent's program (a fork before its exec, sharing the
    parent's pages) is not counted."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = children = 0
    todo: list[tuple[int, str | None]] = [(pid, None)]
    while todo:
        p, parent_exe = todo.pop()
        try:
            exe = os.readlink(f"/proc/{p}/exe")
            with open(f"/proc/{p}/statm") as f:
                rss = int(f.read().split()[1]) * page
            if exe != parent_exe:
                total += rss
                children += rss if parent_exe is not None else 0
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [(int(c), exe) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total, children


def run(args: list[str], timeout: float) -> tuple[int, str, float, float, float]:
    """Run ``args``; return its exit status, its stdout and stderr, the wall time and the
    peaks of the resident memory (GiB, sampled) of its process tree and of its children."""
    peak = [0, 0]
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT.parent
        )
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.1):
                total, children = tree_rss(proc.pid)
                peak[0], peak[1] = max(peak[0], total), max(peak[1], children)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        wall = time.perf_counter() - t
        done.set()
        sampler.join()
        log.seek(0)
        return rc, log.read(), wall, peak[0] / 2**30, peak[1] / 2**30


def result_line(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1].removeprefix("RESULT ")) if lines else {}


def measured(tool: str, setting: str, command: str, args: list[str], timeout: float):
    """Runs ``args``: the row's common columns, the child's RESULT line and its output."""
    rc, text, wall, tree, kids = run(args, timeout)
    r = result_line(text)
    row = {"tool": tool, "setting": setting, "command": command, "rc": rc,
           "plan_s": r.get("plan_s"), "process_s": wall, "peak_rss_gib": r.get("self_maxrss_gib"),
           "tree_rss_gib": tree, "children_rss_gib": kids}  # fmt: skip
    return row, r, text


def autoparallel(ap_python: str, timeout: float) -> dict:
    args = [ap_python, str(AP_CHILD), "--size", "8b", "--world", "64", "--tp", "8",
            "--seq", "8192", "--batch", "16"]  # fmt: skip
    command = " ".join(["python", str(AP_CHILD.relative_to(ROOT.parent)), *args[2:]])
    row, r, text = measured("autoparallel", "fixed mesh dp=8 x tp=8", command, args, timeout)
    if r:
        row.update(
            status=r["status"], mesh=r["mesh"], objective=r["objective"],
            build_s=r["build_s"], solve_s=r["solve_s"], ilp_variables=r["ilp_variables"],
            ilp_constraints=r["ilp_constraints"], params=json.dumps(r["params"]),
            answer=f"{r['status']} (CBC), objective {r['objective'] / 1e6:.4g} s",
            version=f"torch {r['torch']}, autoparallel {ap_commit()}",
        )  # fmt: skip
    else:
        row["error"] = error_of(text)
    return row


def autolayout(mesh: str | None, timeout: float, work: Path) -> dict:
    plan = work / f"plan_{len(list(work.glob('plan_*.json')))}.json"
    cli = ["plan", str(GPT.relative_to(ROOT.parent)), "--hw", "h100-64", *AUTOLAYOUT_SETS]
    cli += ["--mesh", mesh] if mesh else []
    args = [sys.executable, "-c", AL_CHILD, *cli, "--out", str(plan)]
    setting = f"fixed mesh {mesh}" if mesh else "mesh search"
    command = " ".join(["autolayout", *cli, "--out", "PLAN.json"])
    row, _, text = measured("autolayout", setting, command, args, timeout)
    if plan.exists():
        p = json.loads(plan.read_text())
        s, pred = p["solver"], p["predicted"]
        shape = " x ".join(f"{k}={v}" for k, v in p["mesh"]["axes"].items())
        row.update(
            status=p["status"], mesh=shape, mfu=pred.get("mfu"),
            step_time_s=pred.get("step_time_s"), gap=s.get("gap"), bound_kind=s.get("bound_kind"),
            lower_bound_s=s.get("lower_bound_s"), remat=(s.get("remat") or {}).get("policy"),
            solver_wall_s=s.get("wall_s"), shapes_tried=len(s.get("mesh_shapes_tried") or []),
            memory_gib=pred.get("memory_bytes_per_device", 0) / 2**30,
            answer=f"{p['status']}: {shape}, MFU {pred.get('mfu', float('nan')):.3f}",
            version=f"autolayout {al_commit()}",
        )  # fmt: skip
    else:
        row["error"] = error_of(text)
    return row


def error_of(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-3:])[-500:]


def git_head(git_dir: Path, args: list[str] | None = None) -> str:
    try:
        out = subprocess.run(["git", *(args or []), "rev-parse", "--short=12", "HEAD"],
                             cwd=git_dir, capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def ap_commit() -> str:
    mirror = Path("/work/.mirror/meta-pytorch+autoparallel/repo")
    return git_head(mirror, ["--git-dir", str(mirror)]) if mirror.exists() else "?"


def al_commit() -> str:
    return git_head(ROOT.parent)


def figure(df: pd.DataFrame, path: Path) -> None:
    keys = list(dict.fromkeys(zip(df.tool, df.setting, strict=True)))
    labels = [f"{tool}\n{setting}" for tool, setting in keys]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.9 + 1.0 * len(keys)))
    for ax, col, extra, xlabel in [
        (axes[0], "plan_s", "process_s",
         "wall s (log): planning (bar: mean, dots: rounds), rings: whole process"),
        (axes[1], "tree_rss_gib", "peak_rss_gib",
         "peak RSS, GiB: planner + children (bar, dots), rings: planner alone"),
    ]:  # fmt: skip
        for i, key in enumerate(keys):
            colour = "tab:red" if key[0] == "autoparallel" else "tab:blue"
            runs = df[(df.tool == key[0]) & (df.setting == key[1])]
            vals = runs[col].dropna()
            if len(vals):
                ax.barh(i, vals.mean(), color=colour, alpha=0.6)
                ax.scatter(vals, [i] * len(vals), color="black", s=14, zorder=3)
                ax.scatter(runs[extra], [i] * len(runs), facecolors="none", edgecolors="black",
                           s=30, zorder=3)  # fmt: skip
                right = max(vals.max(), runs[extra].max())
                ax.text(right, i, f"  {vals.min():.3g}-{vals.max():.3g}", va="center")
        ax.set_yticks(range(len(keys)), labels if ax is axes[0] else [""] * len(keys))
        ax.set_xlabel(xlabel, fontsize=8)
        ax.invert_yaxis()
    axes[0].set_xscale("log")
    axes[0].set_xlim(1, df.process_s.max() * 4)
    axes[1].set_xlim(0, df.tree_rss_gib.max() * 1.35)
    fig.suptitle("LLaMA-3-8B, seq 8192, batch 16, 64 H100s: planning on this machine's CPU, "
                 f"{df['round'].nunique()} interleaved rounds", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ap-python", default="/tmp/apvenv/bin/python",
                    help="a Python with torch and autoparallel")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a run, at most")
    ap.add_argument("--out", type=Path, default=None, help="default: a fresh results/runs/<time>/")
    a = ap.parse_args()
    out = a.out or fresh()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="plans_"))
    rows = []
    for rnd in range(1, a.rounds + 1):
        for case in (lambda: autoparallel(a.ap_python, a.timeout),
                     lambda: autolayout("data=8,model=8", a.timeout, work),
                     lambda: autolayout(None, a.timeout, work)):  # fmt: skip
            load = os.getloadavg()[0]
            row = {"round": rnd, **case(), "load1_before": load}
            rows.append(row)
            print({k: v for k, v in row.items() if k not in ("params", "command")}, flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "bench_autoparallel.csv", index=False, float_format="%.4g")
    figure(df, out / "bench_autoparallel.png")
    show = ["round", "tool", "setting", "plan_s", "process_s", "peak_rss_gib", "tree_rss_gib",
            "answer"]  # fmt: skip
    print(df[[c for c in show if c in df]].to_string(), f"\nwritten to {out}", sep="\n")


if __name__ == "__main__":
    main()
