"""The planner against the hand layouts, both priced by the same cost model.

    python experiments/plan_vs_hand.py 20 --out experiments/results  # plan_vs_hand.{csv,png}

For each example model at a realistic width (depth reduced where the layers are unrolled, so
that the run stays short; GPT is the full 24-layer stack through ``lax.scan``, rematerialised as one trains it) and each of
five hardware profiles, one row: the plan's predicted step time, the best hand layout (DP,
FSDP, Megatron, 2-D, Megatron+FSDP, and spatial partitioning for the U-Net) that fits in
memory, and each hand layout's step time. ``unet3d-b1`` is the U-Net at batch 1 on 256^3.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402
from autolayout.search.baselines import NAMES  # noqa: E402
from autolayout.search.planner import compare  # noqa: E402

ROOT = Path(__file__).resolve().parent
OUT = RESULTS  # where main() writes: --out (experiments/_out.py)
MODELS = {
    # the transformers as the committed figures were planned: scores materialised (on an
    # accelerator --hw, `auto` now traces the fused kernel)
    "gpt": dict(size="gpt3-xl", scan=True, remat="full", attention="naive"),
    "mlp": dict(batch=4096, d_in=8192, hidden=32768, d_out=8192, layers=4, dtype="bfloat16"),
    "moe": dict(size="base", layers=2, attention="naive"),
    "t5": dict(size="large", layers=2, attention="naive"),
    "unet3d": dict(size="128", batch=8, dtype="bfloat16"),
    # batch 1 on 256^3 volumes: only spatial partitioning carries the mesh
    "unet3d-b1": dict(size="256", dtype="bfloat16"),
}
HARDWARE = ("tpu-v4-256", "tpu-v5p-128", "tpu-v5e-256", "h100-64", "a100-80gb-256")
HAND = NAMES  # dp, fsdp, megatron, 2d, megatron_fsdp, spatial (where the step has convs)


def main(time_limit_s: float = 20.0) -> pd.DataFrame:
    OUT.mkdir(exist_ok=True)
    rows = []
    for model, opts in MODELS.items():
        wl = al.load_workload(ROOT / "models" / f"{model.split('-')[0]}.py", **opts)
        g = al.trace(wl)
        for hw in HARDWARE:
            t0 = time.perf_counter()
            df = compare(wl, hw, time_limit_s=time_limit_s, graph=g)
            wall = time.perf_counter() - t0
            auto = df[df.layout == "auto"].iloc[0]
            hand = df[(df.layout != "auto") & df.fits]
            best = hand.loc[hand.step_time_s.idxmin()] if len(hand) else None
            row = {
                "model": model,
                "options": ";".join(f"{k}={v}" for k, v in opts.items()),
                "hardware": hw,
                "plan_mesh": auto.mesh,
                "plan_status": auto.status,
                "plan_step_s": auto.step_time_s,
                "plan_fits": auto.fits,
                "plan_mfu": auto.mfu,
                "best_hand": best.layout if best is not None else "",
                "best_hand_step_s": best.step_time_s if best is not None else np.nan,
                "speedup": best.step_time_s / auto.step_time_s if best is not None else np.nan,
                "plan_le_hand": bool(
                    best is None or auto.step_time_s <= best.step_time_s * 1.000001
                ),
                "wall_s": wall,
            }
            for name in HAND:
                r = df[df.layout == name]
                row[f"{name}_step_s"] = r.step_time_s.iloc[0] if len(r) else np.nan
                row[f"{name}_fits"] = bool(r.fits.iloc[0]) if len(r) else False
            rows.append(row)
            print(
                f"{model:<7} {hw:<14} plan {auto.step_time_s:.4g}s ({auto.mesh}) best hand "
                f"{row['best_hand']} {row['best_hand_step_s']:.4g}s  x{row['speedup']:.2f} "
                f"[{wall:.0f}s]",
                flush=True,
            )
    out = pd.DataFrame(rows)
    out.to_csv(OUT / "plan_vs_hand.csv", index=False)
    plot(out)
    return out


def plot(df: pd.DataFrame) -> None:
    fig, ax = plt.subplots(figsize=(11, 4.5))
    labels = [f"{m}\n{h}" for m, h in zip(df.model, df.hardware, strict=True)]
    x = np.arange(len(df))
    ax.bar(x, df.speedup.fillna(0), color="tab:blue")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(x, labels, rotation=90, fontsize=7)
    ax.set_ylabel("best fitting hand layout step time / plan step time")
    ax.set_title("Planner vs hand layouts (same cost model); bar > 1: the plan is faster")
    for i, v in enumerate(df.speedup):
        if np.isnan(v):
            ax.text(i, 0.05, "no hand\nlayout fits", ha="center", fontsize=6, rotation=90)
    fig.tight_layout()
    fig.savefig(OUT / "plan_vs_hand.png", dpi=120)


if __name__ == "__main__":
    OUT = take_out()
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0)
