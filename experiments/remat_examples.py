"""The README's remat examples, planned as written: models that do not fit as written, and
what ``remat="auto"`` (the CLI's default) makes of them.

    python experiments/remat_examples.py --out experiments/results

writes ``remat_examples.json`` to ``--out``: per example its command, the least
memory the step as written was found to need (gpt3-xl), and the chosen plan (policy, mesh, memory,
MFU, recomputed FLOPs, gap to the bound). GPT-3 175B's rows take ~2 min each on a 2-core
machine (60 s of search, the policies priced, the trace).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _out import RESULTS, take_out

import autolayout as al

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
COMMAND: list[str] = []  # the arguments it was run with, recorded beside the results
GIB = 2**30
# (hardware, time limit, the gpt.py options, whether to plan the step as written on its own:
# the README quotes it for gpt3-xl; for GPT-3 175B it is another minute a row)
# Loaded for the hardware, as `autolayout plan --hw` loads them: attention `auto` is the fused
# kernel there; `naive` rows keep the materialised scores (what remat has most to answer)
EXAMPLES = [
    ("tpu-v4-256", 10.0, dict(size="gpt3-xl", scan=True), True),
    ("tpu-v4-256", 10.0, dict(size="gpt3-xl", scan=True, attention="naive"), True),
    ("tpu-v4-1024", 60.0, dict(size="gpt3-175b", attention="naive"), False),
    ("tpu-v4-1024", 60.0, dict(size="gpt3-175b"), False),
]


def row(hw: str, limit: float, options: dict, as_written: bool) -> dict:
    wl = al.load_workload(ROOT / "models" / "gpt.py", target=hw, **options)
    written = al.plan(wl, hw, time_limit_s=limit, remat="as_written") if as_written else None
    p = al.plan(wl, hw, time_limit_s=limit, remat="auto")
    s, rm = p.summary(), p.solver["remat"]
    sets = " ".join(f"--set {k}={str(v).lower()}" for k, v in options.items())
    return {
        "command": f"autolayout plan experiments/models/gpt.py --hw {hw} {sets} "
        f"--time-limit {limit:g}",
        "as_written_memory_gib": (
            written.summary()["memory_bytes_per_device"] / GIB if written else None
        ),
        "as_written_fits": rm["policy"] == "as_written",
        "status": p.status,
        "policy": rm["policy"],
        "mesh": dict(p.mesh),
        "memory_gib": s["memory_bytes_per_device"] / GIB,
        "memory_limit_gib": s["memory_limit_bytes"] / GIB,
        "mfu": s["mfu"],
        "step_time_s": s["step_time_s"],
        "recompute_tflop_per_device": rm["recompute_flops_per_device"] / 1e12,
        "gap": p.solver.get("gap"),
    }


def main() -> None:
    OUT.mkdir(exist_ok=True)
    rows = []
    for hw, limit, options, as_written in EXAMPLES:
        rows.append(row(hw, limit, options, as_written))
        print(json.dumps(rows[-1]), flush=True)
    (OUT / "remat_examples.json").write_text(
        json.dumps(
            {"command": " ".join(["python experiments/remat_examples.py", *COMMAND]), "rows": rows},
            indent=1,
        )
    )


if __name__ == "__main__":
    COMMAND = sys.argv[1:]
    OUT = take_out()
    main()
