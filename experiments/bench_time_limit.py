"""Does ``--time-limit T`` bound the whole command? (issue 34, item 2)

Runs ``autolayout plan`` as a user does (a process each: loading the model, the trace, the
search, ``remat=auto``, writing the plan) on the largest models the project plans, and
records the wall time against the limit, the work the search did, and whether the wall-clock
stop fired (a plan it cut may differ between runs). The issue's goal: at most 1.2 T + 5 s.
With ``--busy N``, N busy-loop processes run beside each plan (a loaded CI machine).

python experiments/bench_time_limit.py --limit 30 --busy 0,2 --out experiments/results
(writes bench_time_limit.csv and .png into --out; default a fresh folder under /tmp)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import fresh  # noqa: E402

ROOT = Path(__file__).resolve().parent
MODELS = ROOT / "models"
# (label, model file, --set options, profile)
CASES = [
    ("HF Flax Mistral-7B, 32 layers unrolled", "libraries/hf_mistral.py", ["size=mistral-7b"],
     "h100-64"),
    ("HF Flax Mistral-7B, 32 layers unrolled", "libraries/hf_mistral.py", ["size=mistral-7b"],
     "tpu-v5p-128"),
    ("HF Flax T5-3B, 24+24 layers unrolled", "libraries/hf_t5.py", ["size=t5-3b"], "h100-64"),
    ("Llama-3 70B shapes, scanned", "gpt.py", ["size=llama3-70b", "scan=true"], "h100-256"),
    ("GPT-3 175B, 96 layers unrolled", "gpt.py", ["size=gpt3-175b", "attention=naive"],
     "tpu-v4-1024"),
]  # fmt: skip


def run_case(label, model, sets, hw, limit, out: Path, busy: int) -> dict:
    plan_path = out / f"plan_{len(list(out.glob('plan_*.json')))}.json"
    args = [sys.executable, "-m", "autolayout._cli", "plan", str(MODELS / model), "--hw", hw,
            "--time-limit", str(limit), "--out", str(plan_path)]  # fmt: skip
    for s in sets:
        args += ["--set", s]
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    env = {k: v for k, v in os.environ.items() if k != "AUTOLAYOUT_WALL_SLACK"}
    t = time.perf_counter()
    try:
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=20 * limit)
    finally:
        for p in loops:
            p.kill()
    wall = time.perf_counter() - t
    row = {"model": label, "hardware": hw, "limit_s": limit, "busy": busy, "rc": r.returncode,
           "wall_s": round(wall, 1), "goal_s": 1.2 * limit + 5,
           "load": round(os.getloadavg()[0], 1)}  # fmt: skip
    if plan_path.exists():
        s = json.loads(plan_path.read_text())["solver"]
        row.update(
            status=s["status"], work_s=round(s.get("work_s", float("nan")), 1),
            deterministic=s.get("deterministic"), stopped=s.get("stopped", ""),
            trace_s=round(s.get("phases_s", {}).get("trace", float("nan")), 1),
            remat=s.get("remat", {}).get("policy"),
        )  # fmt: skip
    else:
        row["error"] = (r.stderr or r.stdout).strip().splitlines()[-1:]
    print(row, flush=True)
    return row


def figure(df: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.5 * len(df)))
    labels = [f"{m} on {h}" + (f" (+{b} busy)" if b else "") for m, h, b in
              zip(df.model, df.hardware, df.busy, strict=True)]  # fmt: skip
    ax.barh(labels, df.wall_s, color="tab:blue", label="wall time of the command")
    ax.scatter(df.goal_s, labels, color="tab:red", marker="|", s=300, label="1.2 x limit + 5 s")
    ax.scatter(df.limit_s, labels, color="black", marker="|", s=300, label="--time-limit")
    ax.set_xlabel("seconds")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=float, default=30.0)
    ap.add_argument("--busy", default="0", help="busy-loop processes beside each plan: N or N,M")
    ap.add_argument("--only", help="run the cases whose label contains this")
    ap.add_argument("--out", type=Path, default=None, help="default: a fresh results/runs/<time>/")
    a = ap.parse_args()
    out = a.out or fresh()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="plans_"))
    rows = [
        run_case(*c, a.limit, work, int(busy))
        for busy in a.busy.split(",")
        for c in CASES
        if a.only is None or a.only.lower() in c[0].lower()
    ]
    df = pd.DataFrame(rows)
    df.to_csv(out / "bench_time_limit.csv", index=False)
    figure(df, out / "bench_time_limit.png")
    print(df.to_string(), f"\nwritten to {out}", sep="\n")


if __name__ == "__main__":
    main()
