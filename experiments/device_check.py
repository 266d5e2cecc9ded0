"""What to measure when a GPU is lent (one H200 or H100, a 15-minute budget): one script.

1. ``autolayout calibrate`` on the chip (matmuls, HBM, cuDNN attention, 3-D convolutions,
   the host link) into ``OUT/measured.toml``.
2. Remat with and without ``+offload`` on a scanned and an unrolled MLP stack: XLA's
   temporaries and host temporaries (``memory_analysis()``) and the step time, beside what
   the plan predicts on the shipped profile (``h200-1``/``h100-1``) and on the measured one.
3. T5 scanned, as written: XLA's temporaries against the walk, to see whether XLA:GPU
   allocates every loop's stacks at the step's start as XLA:CPU does (``cpu.toml``'s
   ``scan_stacks_at_start``; the GPU profiles say it does not).

On the device tool (``python experiments/device_check.py --out $OUT``, ~6 minutes); ``--quick``
runs it on this machine's CPU (the mechanism only, seconds). Writes ``OUT/device_check.csv``.
Not yet run on a GPU (none lent so far): no figures from it are in the README.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from _out import take_out

import autolayout as al

ROOT = Path(__file__).resolve().parent.parent


def measure(w: al.Workload, profiles: list[str], steps: int = 5) -> dict:
    """XLA's memory for the step and its median time, beside each profile's prediction."""
    compiled = jax.jit(w.fn, donate_argnums=w.donate_argnums).lower(*w.args).compile()
    ma = compiled.memory_analysis()
    state = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), a) for a in w.args]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = compiled(*state)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
        state = [out[i] if i < len(out) and i in w.donate_argnums else a
                 for i, a in enumerate(state)]  # fmt: skip
    row = {"temp_bytes": ma.temp_size_in_bytes, "host_temp_bytes": ma.host_temp_size_in_bytes,
           "measured_s": float(np.median(times[1:]))}  # fmt: skip
    for hw in profiles:
        try:
            p = al.evaluate(w, hw, mesh={"data": 1}, rules={}).predicted
            row[f"{Path(hw).stem}_step_s"] = p["step_time_s"]
            row[f"{Path(hw).stem}_activations_bytes"] = p["memory_by_category"]["activations"]
        except al.AutolayoutError as e:
            row[f"{Path(hw).stem}_error"] = str(e)
    return row


def main(out: Path, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    shipped = "h200-1" if "H200" in getattr(dev, "device_kind", "") else "h100-1"
    measured = out / "measured.toml"
    cal = [sys.executable, "-m", "autolayout._cli", "calibrate", "--devices", "1",
           "--out", str(measured)] + (["--quick"] if quick else [])  # fmt: skip
    subprocess.run(cal, check=True, cwd=ROOT)
    profiles = [shipped, str(measured)]
    size = (
        dict(d=256, ff=1024, seq=64, batch=8, layers=4)
        if quick
        else dict(d=2048, ff=8192, seq=2048, batch=8, layers=12)
    )
    rows = []
    for scan in (True, False):
        wl = al.load_workload(ROOT / "experiments/models/tagged_mlp.py", scan=scan, **size)
        for tag in ("dots_saveable", "dots_saveable+offload", "nothing_saveable+offload"):
            rows.append({"model": f"mlp {'scan' if scan else 'unrolled'}", "policy": tag,
                         **measure(al.remat(wl, tag), profiles)})  # fmt: skip
    sys.path.insert(0, str(ROOT / "experiments" / "models"))
    t5 = dict(size="base", layers=2, d_model=128, heads=2, head_dim=64, d_ff=256, vocab=512,
              enc_seq=64, dec_seq=32, batch=4, scan=True, dtype="float32") if quick else dict(
        size="base", scan=True, batch=32, dtype="bfloat16"
    )  # fmt: skip
    wl = al.load_workload(ROOT / "experiments/models/t5.py", target=shipped, **t5)
    rows.append({"model": "t5 scan", "policy": "as_written", **measure(wl, profiles)})
    df = pd.DataFrame(rows)
    df.to_csv(out / "device_check.csv", index=False)
    print(df.to_string())


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--quick"]
    main(Path(args[0]) if args and not args[0].startswith("--") else take_out(), quick)
