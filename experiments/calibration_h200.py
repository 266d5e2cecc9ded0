"""Predictions against one real NVIDIA H200 (``shared/calibration/``).

Two tables measured on the chip: ``h200-single-chip.csv`` (the example models' train steps at
commit fd9b8fc, with XLA's memory analysis) and ``h200-attention.csv`` (materialised vs
cuDNN flash attention, forward+backward). This script

1. fits the fused-attention kernel's rate and per-call time on the cuDNN rows (time =
   FLOPs / (peak x efficiency) + call), with the leave-one-out error of each row;
2. fits the two effects the single-chip steps show beyond the roofline (``fit_overheads``):
   a fixed cost per kernel that writes HBM (``efficiency.kernel_s``: launch and tail, what
   makes a many-op step slow) and extra HBM passes over the residuals a scan stacks for its
   backward scan (``efficiency.scan_stack_passes``: XLA:GPU copies each into the stack and
   out of it), least squares on the relative error of the rows without convolutions, with
   each row's leave-one-out error; and the 3-D convolutions' rate on the U-Net row
   (``efficiency.conv3d``, in-sample only: the table has one such row);
3. predicts every single-chip row with ``al.evaluate(wl, "h200-1", mesh={"data": 1},
   rules={})`` (models traced as they were measured: naive attention) and compares step time
   with the measured median and memory with XLA's ``temp + argument`` bytes.

    python experiments/calibration_h200.py

writes ``calibration_h200.{csv,json,png}`` to ``--out`` (default a fresh ``results/runs/<time>/``). The copy of the tables in
``experiments/calibration/`` is what the tests read (CI has shared/ too, but a clone may not).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.runtime.calibrate import fit_rate_and_call  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "calibration"
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
COMMAND: list[str] = []  # the arguments it was run with, recorded beside the results
PEAK_BF16 = 9.89e14  # hw_profiles/h200.toml chip.peak_flops.bf16


def read(name: str) -> list[dict]:
    with open(DATA / name) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def fit_attention(rows: list[dict], impl: str = "cudnn") -> dict:
    """Least squares of ``t = F / (peak * eff) + call`` over ``impl``'s rows; F as the table
    counts it (3.5 x the causal forward's matmul FLOPs). Leave-one-out: each row predicted by
    the fit of the others (``autolayout calibrate``'s fit, on the table's rows)."""
    rs = [r for r in rows if r["impl"] == impl]
    flops = [float(r["tflops"]) * 1e12 * float(r["fwd_bwd_s"]) for r in rs]
    t = [float(r["fwd_bwd_s"]) for r in rs]
    fit = fit_rate_and_call(flops, t)
    return {
        "impl": impl,
        "efficiency": fit["rate"] / PEAK_BF16,
        "call_s": fit["call_s"],
        "in_sample_ratio": [
            (f / fit["rate"] + fit["call_s"]) / s for f, s in zip(flops, t, strict=True)
        ],
        "leave_one_out_ratio": fit["leave_one_out_ratio"],
        "rows": [f"B={r['B']} S={r['S']} H={r['H']}" for r in rs],
    }


def row_workload(row: dict) -> al.Workload:
    options = {}
    for kv in row["options"].split(";"):
        k, v = kv.split("=")
        options[k] = {"true": True, "false": False}.get(v, int(v) if v.isdigit() else v)
    if row["model"].endswith(("gpt.py", "moe.py", "t5.py")):
        options.setdefault("attention", "naive")  # as measured (fd9b8fc): scores materialised
    return al.load_workload(str(ROOT / row["model"]), **options)


def _with(hw: al.Hardware, **eff) -> al.Hardware:
    return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **eff))


def fit_overheads(rows: list[dict]) -> dict:
    """``kernel_s`` and ``scan_stack_passes`` by least squares of the relative step-time
    error over the rows without convolutions, from each row's step priced without them and
    the time each adds per unit; leave-one-out: each row predicted by the fit of the others.
    Then ``conv3d`` from the rows with 3-D convolutions (what is left of their time)."""
    hw = al.hardware("h200-1")
    none = _with(hw, kernel_s=0.0, scan_stack_passes=0.0, conv3d=None)
    feats = []
    for row in rows:
        wl = row_workload(row)
        g = al.trace(wl)

        def step(h, wl=wl, g=g):
            return al.evaluate(wl, h, mesh={"data": 1}, rules={}, graph=g).predicted["step_time_s"]

        base = step(none)
        free = step(_with(none, conv3d=1e9))  # convs at no time beyond their HBM traffic
        feats.append({
            "row": row,
            "measured": float(row["step_s_median"]),
            "base": base,
            "kernels_s": step(_with(none, kernel_s=1.0)) - base,  # seconds per 1 s a kernel
            "stack_s": step(_with(none, scan_stack_passes=1.0)) - base,  # per pass
            "conv_free_s": free - base,  # <= 0
            # at 0.1% of peak every conv is compute-bound: 1000 x its FLOPs at peak
            "conv_s": step(_with(none, conv3d=1e-3)) - free,
        })  # fmt: skip
    plain = [f for f in feats if f["conv_free_s"] == 0.0]

    def solve(fs):
        a = np.array([[f["kernels_s"], f["stack_s"]] for f in fs]) / np.array(
            [[f["measured"]] for f in fs]
        )
        y = np.array([(f["measured"] - f["base"]) / f["measured"] for f in fs])
        return np.maximum(np.linalg.lstsq(a, y, rcond=None)[0], 0.0)

    coef = solve(plain)
    loo = []
    for i, f in enumerate(plain):
        c = solve(plain[:i] + plain[i + 1 :])
        loo.append((f["base"] + c[0] * f["kernels_s"] + c[1] * f["stack_s"]) / f["measured"])
    conv_rows = [f for f in feats if f["conv_free_s"] != 0.0]
    conv3d = None
    if conv_rows:  # the convs' time at 100% of peak against what is left of the measured step
        f = conv_rows[0]
        at_peak = f["conv_s"] * 1e-3  # the convs' FLOPs at peak, in seconds
        rest = f["base"] + f["conv_free_s"] + coef[0] * f["kernels_s"]  # all but the convs
        conv3d = at_peak / max(f["measured"] - rest, 1e-12)
    return {
        "kernel_s": float(coef[0]),
        "scan_stack_passes": float(coef[1]),
        "conv3d": conv3d,
        "conv3d_rows": [f["row"]["options"] for f in conv_rows],
        "rows": [f["row"]["options"] for f in plain],
        "in_sample_ratio": [
            (f["base"] + coef[0] * f["kernels_s"] + coef[1] * f["stack_s"]) / f["measured"]
            for f in plain
        ],
        "leave_one_out_ratio": loo,
    }


def predict_row(row: dict) -> dict:
    wl = row_workload(row)
    t0 = time.perf_counter()
    p = al.evaluate(wl, "h200-1", mesh={"data": 1}, rules={})
    pred = p.predicted
    xla_mem = float(row["xla_temp_bytes"]) + float(row["xla_argument_bytes"])
    return {
        "model": Path(row["model"]).stem,
        "options": row["options"],
        "measured_s": float(row["step_s_median"]),
        "predicted_s": pred["step_time_s"],
        "time_ratio": pred["step_time_s"] / float(row["step_s_median"]),
        "xla_memory_bytes": xla_mem,
        "predicted_memory_bytes": pred["memory_bytes_per_device"],
        "memory_ratio": pred["memory_bytes_per_device"] / xla_mem,
        "evaluate_s": time.perf_counter() - t0,
    }


def main() -> None:
    OUT.mkdir(exist_ok=True)
    att = fit_attention(read("h200-attention.csv"))
    overheads = fit_overheads(read("h200-single-chip.csv"))
    rows = [predict_row(r) for r in read("h200-single-chip.csv")]
    with open(OUT / "calibration_h200.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    t_err = [abs(r["time_ratio"] - 1) for r in rows]
    m_err = [abs(r["memory_ratio"] - 1) for r in rows]
    summary = {
        "command": " ".join(["python experiments/calibration_h200.py", *COMMAND]),
        "attention_fit": att,
        "overhead_fit": overheads,
        "time_median_abs_rel_error": float(np.median(t_err)),
        "time_worst_abs_rel_error": float(max(t_err)),
        "memory_median_abs_rel_error": float(np.median(m_err)),
        "memory_worst_abs_rel_error": float(max(m_err)),
        "rows": rows,
    }
    (OUT / "calibration_h200.json").write_text(json.dumps(summary, indent=1))
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
    labels = [f"{r['model']} {r['options'][:28]}" for r in rows]
    y = np.arange(len(rows))
    ax[0].barh(y, [r["time_ratio"] for r in rows])
    ax[0].axvline(1, color="k", lw=0.8)
    ax[0].set_yticks(y, labels, fontsize=7)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("predicted / measured step time (one H200)")
    ax[1].barh(y, [r["memory_ratio"] for r in rows])
    ax[1].axvline(1, color="k", lw=0.8)
    ax[1].set_yticks(y, [""] * len(rows))
    ax[1].set_xlabel("predicted / XLA memory (temp + arguments)")
    fig.tight_layout()
    fig.savefig(OUT / "calibration_h200.png", dpi=120)
    for r in rows:
        print(
            f"{r['model']:8s} {r['options']:60s} time {r['time_ratio']:.3f} memory {r['memory_ratio']:.3f}"
        )
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    COMMAND = sys.argv[1:]
    OUT = take_out()
    sys.exit(main())
