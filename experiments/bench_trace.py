"""Benchmark: tracing GPT-3-175B-shaped train steps from al.spec arguments.

    python experiments/bench_trace.py            # writes experiments/results/bench_trace.{csv,json,png}

For 1..96 unrolled layers (and the lax.scan stack) it records the wall time of
``jax.make_jaxpr`` + the dim passes (``al.trace``), the op and dim counts, and checks that
nothing was allocated on a device (``jax.live_arrays()`` stays empty) and how much the
process's peak RSS grew.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import autolayout as al  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results"


def main(layer_counts=(1, 2, 8, 24, 48, 96)) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    rows = []
    for scan in (False, True):
        for layers in layer_counts:
            wl = al.load_workload(
                ROOT / "models" / "gpt.py",
                size="gpt3-175b",
                layers=layers,
                scan=scan,
                attention="naive",
            )
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.perf_counter()
            g = al.trace(wl)
            wall = time.perf_counter() - t0
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            params = sum(
                g.tensors[t].size
                for t in g.inputs
                if (g.tensors[t].path or "").startswith("params/")
            )
            rows.append(
                dict(
                    layers=layers,
                    scan=scan,
                    trace_s=round(wall, 3),
                    ops=len(g.ops),
                    dims=len(g.dims),
                    opaque=len(g.opaque),
                    params=params,
                    live_device_arrays=len(jax.live_arrays()),
                    peak_rss_growth_mib=round((rss1 - rss0) / 1024, 1),
                )
            )
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "bench_trace.csv", index=False)
    meta = {
        "command": "python experiments/bench_trace.py",
        "machine": f"{sys.platform}, {len(jax.devices())} jax CPU device(s)",
        "jax": jax.__version__,
        "rows": rows,
    }
    (OUT / "bench_trace.json").write_text(json.dumps(meta, indent=2))
    fig, ax = plt.subplots(figsize=(6, 4))
    for scan, part in df.groupby("scan"):
        ax.plot(
            part["layers"],
            part["trace_s"],
            marker="o",
            label="lax.scan stack" if scan else "unrolled",
        )
    ax.axhline(30, color="grey", ls="--", lw=1, label="goal: 30 s for 96 layers")
    ax.set_xlabel("layers (GPT-3 175B widths)")
    ax.set_ylabel("al.trace wall time (s)")
    ax.set_title("Tracing a GPT-3-175B train step from specs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "bench_trace.png", dpi=120)
    return df


if __name__ == "__main__":
    main()
