"""``autolayout calibrate``: measure the devices at hand into a hardware profile file.

Microbenchmarks on the devices JAX finds: square matmuls per dtype (the best FLOP/s), the
HBM bandwidth of fused elementwise work, cuDNN flash attention (on NVIDIA GPUs: its rate and
per-call time, fitted as ``experiments/calibration_h200.py`` fits the H200 table), 3-D
convolutions by channel count, and — on more than one device — all-gather, all-reduce,
all-to-all and a neighbour permute on every axis of a 1-D and a 2-D mesh, fitted to
``latency + bytes / bandwidth``; on accelerators, copies to pinned host memory and back
(``chip.host_bandwidth``: what an offloading remat policy moves). The base profile of these
devices (``cpu``, ``h100``...) is copied and the figures measured here replace its
efficiencies (or, where a measurement beats the base's nominal figure, the figure itself),
so the file plans like any profile:
``al.hardware("measured.toml")``. Its ``[calibration]`` section records what was measured,
where and when — Alpa profiles a cluster before planning it; this makes the profile a file
a team shares.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform as _platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from autolayout.core import (
    ATTENTION_BWD_FLOPS,
    HardwareError,
    atomic_write,
    attention_keys,
    load_profile,
    profile_path,
)

__all__ = ["calibrate", "fit_rate_and_call", "host_link", "write_profile"]


def fit_rate_and_call(work: Sequence[float], seconds: Sequence[float]) -> dict[str, Any]:
    """Least squares of ``seconds = work / rate + call`` with the leave-one-out ratio of each
    point (its prediction by the fit of the others over its measurement)."""
    w, t = np.asarray(work, float), np.asarray(seconds, float)
    a = np.c_[w, np.ones_like(w)]

    def solve(keep):
        (inv, call), *_ = np.linalg.lstsq(a[keep], t[keep], rcond=None)
        return float(inv), float(call)

    inv, call = solve(np.ones(len(t), bool))
    loo = []
    for i in range(len(t)):
        if len(t) > 2:
            ii, cc = solve(np.arange(len(t)) != i)
            loo.append(float((w[i] * ii + cc) / t[i]))
    return {"rate": 1.0 / inv if inv > 0 else math.inf, "call_s": call, "leave_one_out_ratio": loo}


def _seconds(fn: Callable, *args, reps: int) -> float:
    """Median wall time of a compiled call (after one warm-up), synchronised."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _matmuls(dev, sizes: Sequence[int], dtypes: Sequence[str], reps: int) -> list[dict]:
    out = []
    for dt in dtypes:
        for n in sizes:
            x = jax.device_put(jnp.ones((n, n), dt), dev)
            f = jax.jit(lambda a: a @ a)
            s = _seconds(f, x, reps=reps)
            out.append({"dtype": dt, "n": n, "seconds": s, "flops_per_s": 2.0 * n**3 / s})
    return out


def _memory(dev, mib: Sequence[int], reps: int) -> list[dict]:
    out = []
    for m in mib:
        x = jax.device_put(jnp.ones((m * 2**20 // 4,), jnp.float32), dev)
        f = jax.jit(lambda a: a * 1.0001 + 1.0)  # one fused loop: read once, write once
        s = _seconds(f, x, reps=reps)
        out.append({"mib": m, "seconds": s, "bytes_per_s": 2.0 * x.nbytes / s})
    return out


def host_link(dev, mib: Sequence[int], reps: int) -> dict:
    """Copies between the device's memory and pinned host memory (what an offloading remat
    policy moves), each way, fitted to ``call + bytes / rate``; the slower way's rate is the
    link's. On CPU devices (one memory) only when asked: the mechanism, not a figure."""
    here, host = (jax.sharding.SingleDeviceSharding(dev, memory_kind=k)
                  for k in ("device", "pinned_host"))  # fmt: skip
    rows = []
    for m in mib:
        x = jax.device_put(jnp.ones((m * 2**20 // 4,), jnp.float32), here)
        h = jax.device_put(x, host)
        out = _seconds(lambda a: jax.device_put(a, host), x, reps=reps)
        back = _seconds(lambda a: jax.device_put(a, here), h, reps=reps)
        rows.append({"mib": m, "to_host_s": out, "to_device_s": back})
    sizes = [r["mib"] * 2**20 for r in rows]
    fits = {way: fit_rate_and_call(sizes, [r[f"{way}_s"] for r in rows])
            for way in ("to_host", "to_device")}  # fmt: skip
    return {"rows": rows, "bandwidth": min(f["rate"] for f in fits.values()),
            **{f"{way}_call_s": f["call_s"] for way, f in fits.items()}}  # fmt: skip


def _attention(dev, shapes: Sequence[tuple[int, int, int, int]], reps: int) -> dict:
    """cuDNN flash attention forward+backward (causal, bf16), on an NVIDIA GPU only."""
    if dev.platform != "gpu":
        return {"skipped": f"cuDNN attention runs on NVIDIA GPUs; these devices are {dev.platform}"}
    rows = []
    for b, s, h, k in shapes:
        q = jax.device_put(jnp.ones((b, s, h, k), jnp.bfloat16), dev)

        def loss(q, kk, v):
            o = jax.nn.dot_product_attention(q, kk, v, is_causal=True, implementation="cudnn")
            return jnp.sum(o.astype(jnp.float32))

        f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        sec = _seconds(f, q, q, q, reps=reps)
        # as the cost model counts the two kernels (forward 1x, backward 2.5x)
        flops = (1 + ATTENTION_BWD_FLOPS) * 4.0 * b * h * s * attention_keys(s, s, True, None) * k
        rows.append({"B": b, "S": s, "H": h, "K": k, "seconds": sec, "flops": flops})
    fit = fit_rate_and_call([r["flops"] for r in rows], [r["seconds"] for r in rows])
    return {"rows": rows, **fit}


def _convs(dev, channels: Sequence[int], size: int, reps: int, dtype: str) -> list[dict]:
    out = []
    for c in channels:
        x = jax.device_put(jnp.ones((1, size, size, size, c), dtype), dev)
        w = jax.device_put(jnp.ones((3, 3, 3, c, c), dtype), dev)
        f = jax.jit(
            lambda a, k: jax.lax.conv_general_dilated(
                a, k, (1, 1, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC")
            )
        )
        s = _seconds(f, x, w, reps=reps)
        flops = 2.0 * size**3 * c * c * 27
        out.append({"channels": c, "size": size, "seconds": s, "flops_per_s": flops / s})
    return out


_COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute")


def _collective_fn(kind: str, mesh: Mesh, axis: str, n: int):
    """A jitted collective over mesh ``axis`` on an array sharded along it (shard_map)."""
    spec = P(axis)

    def body(x):
        if kind == "all-gather":
            return jax.lax.all_gather(x, axis, tiled=True)
        if kind == "all-reduce":
            return jax.lax.psum(x, axis)
        if kind == "all-to-all":
            return jax.lax.all_to_all(x, axis, 0, 0, tiled=True)
        return jax.lax.ppermute(x, axis, [(i, (i + 1) % n) for i in range(n)])

    out_spec = P(None) if kind == "all-gather" else spec
    f = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out_spec, check_vma=False)
    return jax.jit(f), NamedSharding(mesh, spec)


def _collectives(devices: Sequence[Any], sizes_kib: Sequence[int], reps: int) -> list[dict]:
    """Every collective on every axis of a 1-D mesh of all devices and, where the count has
    a factorisation, of a 2-D one; ``bytes`` is the whole (gathered) array of one group."""
    n = len(devices)
    meshes = [{"all": n}]
    f2 = next((a for a in range(2, int(math.isqrt(n)) + 1) if n % a == 0), None)
    if f2:
        meshes.append({"outer": f2, "inner": n // f2})
    rows = []
    for shape in meshes:
        mesh = Mesh(np.array(devices).reshape(tuple(shape.values())), tuple(shape))
        for axis, size in shape.items():
            for kind in _COLLECTIVES:
                f, sharding = _collective_fn(kind, mesh, axis, size)
                for kib in sizes_kib:
                    per = max(size * size, kib * 256 // size * size)  # float32 elements
                    x = jax.device_put(jnp.ones((per,), jnp.float32), sharding)
                    s = _seconds(f, x, reps=reps)
                    rows.append({"mesh": "x".join(f"{a}={v}" for a, v in shape.items()),
                                 "axis": axis, "group": size, "kind": kind,
                                 "bytes": per * 4 // (n // size), "seconds": s})  # fmt: skip
    return rows


def _collective_fit(rows: list[dict]) -> dict[str, Any]:
    """All-gathers over the largest group: ``latency * (N-1) + V (N-1)/N / bandwidth``.
    Where the timings do not separate the two (noise over small sizes: a slope <= 0), the
    best rate measured stands for the bandwidth and the least time for the latency."""
    big = max(r["group"] for r in rows)
    sel = [r for r in rows if r["kind"] == "all-gather" and r["group"] == big]
    work = [r["bytes"] * (big - 1) / big for r in sel]
    secs = [r["seconds"] for r in sel]
    fit = fit_rate_and_call(work, secs)
    steps = max(big - 1, 1)
    if math.isfinite(fit["rate"]) and fit["rate"] > 0 and fit["call_s"] > 0:
        return {
            "bandwidth": fit["rate"],
            "latency_s": fit["call_s"] / steps,
            "how": "least squares",
        }
    return {"bandwidth": max(w / t for w, t in zip(work, secs, strict=True)),
            "latency_s": min(secs) / steps,
            "how": "best rate and least time (the sizes did not separate latency from bandwidth)"}  # fmt: skip


def base_profile(devices: Sequence[Any]) -> Path:
    """The shipped profile file of these devices' kind."""
    d = devices[0]
    if d.platform == "cpu":
        return profile_path("cpu")
    kind = getattr(d, "device_kind", "").lower()
    for fam, file in (("h200", "h200"), ("h100", "h100"), ("b200", "b200"), ("a100", "a100-80gb"),
                      ("v5p", "tpu-v5p"), ("v5 lite", "tpu-v5e"), ("v6", "tpu-v6e"), ("v4", "tpu-v4")):  # fmt: skip
        if fam in kind:
            return profile_path(file)
    raise HardwareError(
        f"no shipped profile for device kind {kind!r}; pass --base PROFILE.toml to start from"
    )


def calibrate(
    devices: Sequence[Any] | None = None,
    *,
    base: str | Path | None = None,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measures ``devices`` (default: all of ``jax.devices()``) and returns a profile as
    ``{section: {key: value}}``, the base profile's figures with the measured ones in place
    and a ``calibration`` section of what was measured. ``quick`` runs small shapes (seconds
    on a laptop: the mechanism, not figures to plan with)."""
    devices = list(jax.devices() if devices is None else devices)
    say = progress or (lambda _s: None)
    base_path = Path(base) if base is not None else base_profile(devices)
    prof = load_profile(base_path)
    dev = devices[0]
    reps = 3 if quick else 10
    dtypes = ["float32", "bfloat16"]
    say("matmuls")
    mm = _matmuls(dev, [128, 256] if quick else [1024, 2048, 4096, 8192], dtypes, reps)
    say("memory bandwidth")
    mem = _memory(dev, [8, 32] if quick else [256, 1024, 4096], reps)
    say("attention")
    att = _attention(dev, [(4, 2048, 16, 128), (2, 4096, 32, 128), (1, 8192, 32, 128)], reps)
    say("convolutions")
    conv = _convs(dev, [8, 32] if quick else [32, 64, 128], 16 if quick else 64, reps,
                  "float32" if dev.platform == "cpu" else "bfloat16")  # fmt: skip
    link: dict = {"skipped": "CPU devices have one memory"}
    if dev.platform != "cpu":
        say("host link")
        link = host_link(dev, [8, 32] if quick else [64, 256, 1024], reps)
    coll: list[dict] = []
    if len(devices) > 1:
        say("collectives")
        coll = _collectives(devices, [64, 256] if quick else [1024, 16384, 131072], reps)

    chip, eff = dict(prof["chip"]), dict(prof["efficiency"])
    peaks = dict(chip["peak_flops"])
    key = {"float32": "f32", "bfloat16": "bf16"}
    for dt in dtypes:
        best = max(r["flops_per_s"] for r in mm if r["dtype"] == dt)
        k = key[dt]
        if k not in peaks or best > peaks[k]:  # the base's figure is below what ran here
            peaks[k] = best
    main = "bf16" if "bf16" in peaks and dev.platform != "cpu" else "f32"
    best_main = max(r["flops_per_s"] for r in mm if key[r["dtype"]] == main)
    eff["matmul"] = min(1.0, best_main / peaks[main])
    chip["peak_flops"] = peaks
    bw = max(r["bytes_per_s"] for r in mem)
    if bw > chip["hbm_bandwidth"]:
        chip["hbm_bandwidth"] = bw
    eff["memory"] = min(1.0, bw / chip["hbm_bandwidth"])
    if conv:  # 3-D convolutions (what _convs runs): their median rate
        rate = statistics.median(r["flops_per_s"] for r in conv)
        eff["conv3d"] = min(1.0, rate / peaks[main])
    if "rows" in att and math.isfinite(att["rate"]) and att["rate"] > 0:
        eff["attention"] = min(1.0, att["rate"] / peaks.get("bf16", peaks[main]))
        eff["attention_call_s"] = max(att["call_s"], 0.0)
    if "bandwidth" in link and math.isfinite(link["bandwidth"]) and link["bandwidth"] > 0:
        chip["host_bandwidth"] = link["bandwidth"]
    prof["chip"], prof["efficiency"] = chip, eff
    fit = _collective_fit(coll) if coll else None
    if fit:
        if "host" in prof:
            prof["host"] = {"bandwidth": fit["bandwidth"], "latency_s": fit["latency_s"]}
            eff["collective"] = 1.0
        else:
            link = prof.get("nvlink", prof.get("ici", {}))
            nominal = link.get("bandwidth", link.get("link_bandwidth"))
            if nominal:
                eff["collective"] = min(1.0, fit["bandwidth"] / nominal)
    top = dict(prof[""])
    top["devices"] = len(devices)
    top["description"] = (
        f"{top.get('description') or top['family']}, measured by autolayout calibrate"
    )
    top["approximate"] = False
    prof[""] = top
    prof["calibration"] = {
        "measured_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "where": f"{_platform.node()}: {len(devices)} x {getattr(dev, 'device_kind', dev.platform)}",
        "jax": jax.__version__,
        "base": str(base_path),
        "quick": quick,
        "matmul": mm,
        "memory": mem,
        "attention": att.get("rows", []),
        "attention_note": att.get("skipped", ""),
        "conv": conv,
        "host_link": link.get("rows", []),
        "host_link_note": link.get("skipped", ""),
        "collectives": coll,
        "collective_fit": fit["how"] if fit else "",
    }
    return prof


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v)) if math.isfinite(v) else "0.0"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[\n  " + ",\n  ".join(_toml_value(x) for x in v) + ",\n]" if v else "[]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def write_profile(prof: dict[str, Any], path: str | Path) -> Path:
    """Writes a profile (as :func:`calibrate` returns it) as TOML; reads back with
    ``al.hardware(path)``."""
    lines = [
        "# A hardware profile measured by `autolayout calibrate` ([calibration] says what, where, when)."
    ]
    lines += [f"{k} = {_toml_value(v)}" for k, v in prof[""].items()]
    for sec, body in prof.items():
        if sec == "":
            continue
        lines += ["", f"[{sec}]"] + [f"{k} = {_toml_value(v)}" for k, v in body.items()]
    return atomic_write(path, "\n".join(lines) + "\n")
