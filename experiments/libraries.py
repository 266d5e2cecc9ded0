"""Models from other libraries at their published sizes (issue 21): each planned on
``tpu-v4-256`` and ``h100-64`` and compared with the hand layouts, in the names the planner
found (no dim is named by these models).

python experiments/libraries.py 10 --out experiments/results   (libraries.csv and .png there;
--figure redraws the PNG from the committed CSV)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.core._report import rule_lines  # noqa: E402

ROOT = Path(__file__).resolve().parent
LIB = ROOT / "models" / "libraries"
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
MODELS = {"hf_llama": "llama2-7b", "hf_bert": "bert-large", "eqx_vit": "vit-l16",
          "keras_gpt2": "gpt2-xl", "nnx_lm": "base"}  # fmt: skip
PROFILES = ("tpu-v4-256", "h100-64")


def main(limit: float) -> pd.DataFrame:
    rows = []
    for name, size in MODELS.items():
        t = time.perf_counter()
        wl = al.load_workload(LIB / f"{name}.py", size=size)
        g = al.trace(wl)
        traced = time.perf_counter() - t
        for hw in PROFILES:
            t = time.perf_counter()
            auto = al.plan(wl, hw, time_limit_s=limit, graph=g)
            table = al.compare(wl, hw, graph=g, auto=auto)
            for r in table.to_dict("records"):
                rows.append({"model": f"{name}:{size}", "hardware": hw, **r,
                             "rule_lines": len(rule_lines(auto)) if r["layout"] == "auto" else None,
                             "trace_s": round(traced, 1),
                             "plan_s": round(time.perf_counter() - t, 1)})  # fmt: skip
            print(
                name, hw, auto.status, auto.mesh, "\n  " + "\n  ".join(rule_lines(auto)), flush=True
            )
    # Megatron-LM runs Llama-2-7B with micro-batch 1 per data-parallel rank: on 64 GPUs with
    # tensor parallelism 8, one step holds 8 sequences of 4096 tokens
    wl = al.load_workload(LIB / "hf_llama.py", size="llama2-7b", batch=8)
    g = al.trace(wl)
    table = al.compare(wl, "h100-64", graph=g, time_limit_s=limit)
    for r in table.to_dict("records"):
        rows.append({"model": "hf_llama:llama2-7b batch=8", "hardware": "h100-64", **r})
    print(table.to_string(), flush=True)
    df = pd.DataFrame(rows)
    OUT.mkdir(exist_ok=True)
    df.to_csv(OUT / "libraries.csv", index=False)
    figure(df)
    return df


def figure(df: pd.DataFrame) -> None:
    """Predicted MFU of every layout that fits, per model and chip (horizontal bars)."""
    fit = df[df.fits.astype(bool)]
    piv = fit.pivot_table(index=["model", "hardware"], columns="layout", values="mfu",
                          aggfunc="first")  # fmt: skip
    piv.index = [f"{m} on {h}" for m, h in piv.index]
    order = ["auto"] + [c for c in piv.columns if c != "auto"]
    fig, ax = plt.subplots(figsize=(9, 7))
    piv[order].plot.barh(ax=ax, width=0.85)
    ax.invert_yaxis()
    ax.set_xlabel("predicted MFU (layouts that fit in HBM; auto = the planner)")
    ax.set_title("Models from other libraries, no dim named: planner vs hand layouts")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "libraries.png", dpi=120)


if __name__ == "__main__":
    OUT = take_out()
    if sys.argv[1:] == ["--figure"]:  # redraw from the committed CSV
        figure(pd.read_csv(RESULTS / "libraries.csv"))
        sys.exit()
    df = main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0)
    print(df[["model", "hardware", "layout", "mesh", "status", "memory_gib", "fits", "mfu", "note"]]
          .to_string())  # fmt: skip
