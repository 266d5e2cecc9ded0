"""Benchmark: tracing train steps from al.spec arguments and from library models.

    python experiments/bench_trace.py --out experiments/results  # bench_trace.{csv,json,png} there
    python experiments/bench_trace.py --figure   # redraws the PNG from the committed CSV

GPT-3-175B-shaped steps (``model`` gpt3-175b) for 1..96 unrolled layers and the lax.scan
stack, then one row per model from another library at its published size (issue 34: the
unrolled Hugging Face Flax T5-3B and Mistral-7B among them). Each row records the wall time
of ``al.trace`` (``jax.make_jaxpr`` of the step + the dim passes), the op and dim counts,
that the trace allocated nothing on a device (``jax.live_arrays()`` does not grow) and how
much the process's peak RSS grew; ``load_s`` is ``al.load_workload`` (the model file's own work:
building the model, ``jax.eval_shape`` of its init; each library model is loaded and traced
at its tiny size first, so that importing its library is no row's), ``retrace_s`` a second ``al.trace`` of the same workload, which JAX answers from its
cache of the step's jaxpr: the tracer's own walk, dead-code removal and naming.
``jaxpr_s`` = ``trace_s - retrace_s``: what tracing the model's Python costs.
``trace_cpu_s``: the process's CPU time over ``al.trace`` (the machine is shared: wall
times grow with its load, CPU times much less).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
COMMAND: list[str] = []  # the arguments it was run with, recorded beside the results
LIB = ROOT / "models" / "libraries"
# file: (size, layers as the model counts them); published sizes, as experiments/libraries.py
LIBRARIES = {"hf_t5": ("t5-3b", 48), "hf_mistral": ("mistral-7b", 32),
             "hf_llama": ("llama2-7b", 32), "hf_bert": ("bert-large", 24),
             "eqx_vit": ("vit-l16", 24), "keras_gpt2": ("gpt2-xl", 48), "nnx_lm": ("base", 12)}  # fmt: skip


def measure(row: dict, path: Path, **options) -> dict:
    """``row`` (model, layers, scan) with the measures of the workload of model file
    ``path`` built with ``options``, traced twice."""
    t0 = time.perf_counter()
    wl = al.load_workload(path, **options)
    loaded = time.perf_counter() - t0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    arrays = len(jax.live_arrays())  # a library's model may hold one (HF: its PRNG key)
    t0, c0 = time.perf_counter(), time.process_time()
    g = al.trace(wl)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    again = al.trace(wl)
    retrace = time.perf_counter() - t0
    assert len(again.ops) == len(g.ops) and again.dims == g.dims  # the same graph
    params = sum(
        g.tensors[t].size for t in g.inputs if (g.tensors[t].path or "").startswith("params/")
    )
    return dict(
        **row,
        trace_s=round(wall, 3),
        trace_cpu_s=round(cpu, 3),
        ops=len(g.ops),
        dims=len(g.dims),
        opaque=len(g.opaque),
        params=params,
        live_device_arrays=len(jax.live_arrays()) - arrays,
        peak_rss_growth_mib=round((rss1 - rss0) / 1024, 1),
        load_s=round(loaded, 3),
        retrace_s=round(retrace, 3),
        jaxpr_s=round(wall - retrace, 3),
    )


def main(layer_counts=(1, 2, 8, 24, 48, 96)) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    load = [os.getloadavg()[0]]  # the machine is shared: its load explains wall times
    rows = []
    for scan in (False, True):
        for layers in layer_counts:
            row = dict(model="gpt3-175b", layers=layers, scan=scan)
            rows.append(measure(row, ROOT / "models" / "gpt.py",
                                size="gpt3-175b", layers=layers, scan=scan, attention="naive"))  # fmt: skip
            print(rows[-1], flush=True)
    for name, (size, layers) in LIBRARIES.items():
        al.trace(al.load_workload(LIB / f"{name}.py"))  # its library imported, out of the row
        row = dict(model=f"{name}:{size}", layers=layers, scan=False)
        rows.append(measure(row, LIB / f"{name}.py", size=size))
        print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(OUT / "bench_trace.csv", index=False)
    meta = {
        "command": " ".join(["python experiments/bench_trace.py", *COMMAND]),
        "machine": f"{sys.platform}, {len(jax.devices())} jax CPU device(s), {os.cpu_count()} cores",
        "load_average_1min_start_end": [*load, os.getloadavg()[0]],
        "jax": jax.__version__,
        "rows": rows,
    }
    (OUT / "bench_trace.json").write_text(json.dumps(meta, indent=2))
    figure(df)
    return df


def figure(df: pd.DataFrame) -> None:
    """Left: GPT-3 175B's trace time by layers; right: each library model's load and trace,
    the trace split into the model's Python (jax.make_jaxpr) and the tracer's passes."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 5))
    gpt = df[df.model == "gpt3-175b"]
    for scan, part in gpt.groupby("scan"):
        ax.plot(part["layers"], part["trace_s"], marker="o",
                label="lax.scan stack" if scan else "unrolled")  # fmt: skip
    ax.axhline(30, color="grey", ls="--", lw=1, label="goal: 30 s for 96 layers")
    ax.set_xlabel("layers (GPT-3 175B widths)")
    ax.set_ylabel("al.trace wall time (s)")
    ax.set_title("Tracing a GPT-3-175B train step from specs")
    ax.legend()
    lib = df[df.model != "gpt3-175b"].iloc[::-1]
    names = [f"{m} ({o:,} ops)" for m, o in zip(lib.model, lib.ops, strict=True)]
    bx.barh(names, lib.jaxpr_s, label="al.trace: jax.make_jaxpr of the step")
    bx.barh(names, lib.retrace_s, left=lib.jaxpr_s, label="al.trace: walk, DCE, naming")
    bx.barh(names, lib.load_s, left=lib.trace_s, color="lightgrey",
            label="al.load_workload (model, eval_shape of init)")  # fmt: skip
    bx.axvline(10, color="grey", ls="--", lw=1, label="goal: trace well under 10 s")
    bx.set_xlabel("wall time (s), 2-core machine")
    bx.set_title("Library models at published sizes (layers unrolled)")
    bx.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.4, -0.13), ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "bench_trace.png", dpi=120)


if __name__ == "__main__":
    COMMAND = sys.argv[1:]
    OUT = take_out()
    if sys.argv[1:] == ["--figure"]:
        figure(pd.read_csv(RESULTS / "bench_trace.csv"))
        sys.exit()
    main()
