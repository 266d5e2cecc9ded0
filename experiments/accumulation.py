"""Gradient accumulation where memory binds: a Llama-style 8B whose attention materialises its
scores (float32, sequence 8192) on tpu-v5p-128, planned by the default search (remat="auto",
which tries accumulation where the step as written does not fit) and with the microbatches fixed.

    python experiments/accumulation.py --out experiments/results

writes ``accumulation.csv`` and ``accumulation.json`` to ``--out``: per row the batch, how the
microbatches were chosen, the plan's status, mesh, microbatches and remat policy, memory and
MFU, why (``plan.solver["accumulation"]["why"]``) and the candidates tried. Each row is one
``al.plan`` call of ``LIMIT`` seconds (about 20-45 s of wall time on a 2-core machine).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

from _out import take_out

import autolayout as al

ROOT = Path(__file__).resolve().parent
HW = "tpu-v5p-128"
LIMIT = 60.0
GIB = 2**30
MODEL = dict(size="llama3-8b", scan=True, attention="naive", seq=8192, dtype="float32")
# (batch, fixed microbatches or None for the default search)
ROWS = [(128, None), (256, None), (128, 2)]


def row(batch: int, fixed: int | None) -> dict:
    wl = al.load_workload(ROOT / "models" / "gpt.py", target=HW, **MODEL, batch=batch)
    t = time.perf_counter()
    p = al.plan(wl, HW, time_limit_s=LIMIT, microbatches=fixed)
    wall = time.perf_counter() - t
    s, acc = p.predicted, p.solver.get("accumulation", {})
    sets = " ".join(f"--set {k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in {**MODEL, "batch": batch}.items())  # fmt: skip
    fix = f" --microbatches {fixed}" if fixed else ""
    return {
        "command": f"autolayout plan experiments/models/gpt.py --hw {HW} {sets}{fix} "
        f"--time-limit {LIMIT:g}",
        "batch": batch,
        "microbatches_given": fixed or "",
        "status": p.status,
        "mesh": " x ".join(f"{a}={n}" for a, n in p.mesh.items()),
        "microbatches": acc.get("microbatches", 1),
        "remat": p.solver.get("remat", {}).get("policy", "as_written"),
        "memory_gib": s["memory_bytes_per_device"] / GIB,
        "memory_limit_gib": s["memory_limit_bytes"] / GIB,
        "fits": bool(s["fits"]),
        "step_time_s": s["step_time_s"],
        "mfu": s["mfu"],
        "wall_s": wall,
        "why": acc.get("why", ""),
        "tried": acc.get("tried", []),
        "remat_tried": p.solver.get("remat", {}).get("tried", []),
    }


def main() -> None:
    out = take_out()
    command = "python experiments/accumulation.py " + " ".join(sys.argv[1:] + ["--out", str(out)])
    rows = []
    for batch, fixed in ROWS:
        r = row(batch, fixed)
        print(f"batch {batch} microbatches {r['microbatches']}: {r['status']} {r['mesh']} "
              f"{r['memory_gib']:.1f} GiB MFU {r['mfu']:.3f} ({r['why']})", flush=True)  # fmt: skip
        rows.append(r)
    (out / "accumulation.json").write_text(
        json.dumps({"command": command, "hardware": HW, "model": MODEL, "rows": rows}, indent=1)
    )
    cols = [k for k in rows[0] if k not in ("tried", "remat_tried")]
    with open(out / "accumulation.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
