"""Where an experiment writes its results.

``--out DIR`` names the folder. Without it a run writes to a fresh
``experiments/results/runs/<date-time>/`` (git-ignored), so rerunning an experiment never
replaces a committed result by accident; the committed results are rewritten only when asked
for by name: ``--out experiments/results``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"  # the committed results


def fresh() -> Path:
    """A new folder under ``experiments/results/runs/``, named by the time."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = RESULTS / "runs" / stamp, 1
    while path.exists():
        path, n = RESULTS / "runs" / f"{stamp}-{n}", n + 1
    return path


def take_out(argv: list[str] | None = None) -> Path:
    """Remove ``--out DIR`` (or ``--out=DIR``) from ``argv`` (``sys.argv`` by default), make
    the folder and return it; a fresh one where ``--out`` is not given."""
    argv = sys.argv if argv is None else argv
    out = None
    for i, a in enumerate(argv):
        if a == "--out" and i + 1 < len(argv):
            out = Path(argv[i + 1])
            del argv[i : i + 2]
            break
        if a.startswith("--out="):
            out = Path(a.removeprefix("--out="))
            del argv[i]
            break
    out = out or fresh()
    out.mkdir(parents=True, exist_ok=True)
    print(f"results go to {out}", file=sys.stderr)
    return out
