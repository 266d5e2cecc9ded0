"""The conformance catalogue at its published sizes (issue 35 item 5): every entry of
``experiments/models/catalogue/`` (Hugging Face Flax heads, ``keras.applications``
families, Equinox and NNX examples) traced and planned on ``tpu-v5p-128`` and ``h100-64``
with a time limit each, into ``catalogue.csv`` (a row per entry and hardware: mesh, rules,
status, MFU, memory, opaque ops, dims badly named, the planning's wall time, and ``silly``:
why an engineer would reject the plan) and ``catalogue.png``.

python experiments/catalogue.py --time-limit 30 --out experiments/results

``--names``: trace only, each entry's dims and the names ``tests/test_names.py`` flags into
``catalogue_names.csv`` (minutes, no planning):

python experiments/catalogue.py --names --out experiments/results

``--only a,b``: those entries; ``--hw``: other profiles (comma-separated); ``--resume``: keep
the rows already in the folder's CSV and plan the rest; ``--figure``: redraw the PNG from the
folder's CSV (``experiments/results`` without ``--out``). Rows are written as they come, so a
run cut short leaves the rows it did. A plan is silly when it is not found or does not fit,
when the step's batch is left whole on a many-device slice (every entry trains on a batch
that data parallelism splits), or when its MFU is under a third of the best MFU of its kind
(transformer, convnet, depthwise convnet, MNIST example: the entry's ``kind``) on that
hardware. ``--resume`` with every row done recomputes the flags.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from _out import RESULTS, take_out  # noqa: E402

import autolayout as al  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "models"))
sys.path.insert(0, str(HERE.parent / "tests"))
import catalogue  # noqa: E402
from test_names import bad_names  # noqa: E402

PROFILES = ("tpu-v5p-128", "h100-64")
COLUMNS = ["model", "family", "kind", "library", "published", "hardware", "devices", "status", "mesh",
           "rules", "mfu", "memory_gib", "fits", "step_time_s", "remat", "opaque_ops",
           "bad_names", "params_b", "batch", "trace_s", "wall_s", "time_limit_s", "silly",
           "why"]  # fmt: skip
SILLY_MFU = 1 / 3  # a plan under a third of its kind's best MFU on that hardware


def order(names: list[str]) -> list[str]:
    """Round-robin over (library, family): a run cut short has covered every group."""
    groups: dict[tuple[str, str], list[str]] = {}
    for n in names:
        e = catalogue.ENTRIES[n]
        groups.setdefault((e.library, e.family), []).append(n)
    out, queues = [], list(groups.values())
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def _batch(g: al.Graph) -> int | None:
    return g.dims.get("batch")


def traced(name: str) -> tuple:
    """``name`` at its published size traced: ``(workload, graph, row)``, the row its
    entry's facts and names (``dims``, ``bad_names``, ``opaque_ops``); on an error
    ``(None, None, row)`` with ``why``."""
    e = catalogue.ENTRIES[name]
    base = {"model": name, "family": e.family, "kind": e.kind, "library": e.library,
            "published": e.published}  # fmt: skip
    t = time.perf_counter()
    try:
        wl = e.build("published")
        g = al.trace(wl)
    except Exception as err:  # a row that says why, not a run that stops
        traceback.print_exc()
        return None, None, {**base, "status": "ERROR", "why": f"trace: {err!s:.300}"}
    params = sum(math.prod(s.shape) for s in jax.tree.leaves(wl.args[0]))
    base |= {"params_b": round(params / 1e9, 4), "batch": _batch(g),
             "trace_s": round(time.perf_counter() - t, 1), "dims": len(g.dims),
             "bad_names": " ".join(bad_names(g)), "opaque_ops": len(g.opaque)}  # fmt: skip
    return wl, g, base


def plan_entry(name: str, profiles: list[str], limit: float) -> list[dict]:
    """``name`` at its published size traced once and planned on each profile."""
    wl, g, base = traced(name)
    base = {**base, "time_limit_s": limit}
    if g is None:
        return [{**base, "hardware": hw} for hw in profiles]
    rows = []  # (``dims`` is not a column of the plans' table: reindexed away)
    for hw in profiles:
        t = time.perf_counter()
        try:
            p = al.plan(wl, hw, time_limit_s=limit, graph=g)
        except Exception as err:
            traceback.print_exc()
            rows.append({**base, "hardware": hw, "status": "ERROR", "why": f"plan: {err!s:.300}",
                         "wall_s": round(time.perf_counter() - t, 1)})  # fmt: skip
            continue
        s = p.predicted
        rows.append({
            **base, "hardware": hw, "devices": p.devices, "status": p.status,
            "mesh": " ".join(f"{a}={n}" for a, n in p.mesh.items()),
            "rules": "; ".join(f"{d}->{'+'.join(a)}" for d, a in p.rules()),
            "mfu": round(s.get("mfu", float("nan")), 4),
            "memory_gib": round(s.get("memory_bytes_per_device", float("nan")) / 2**30, 2),
            "fits": s.get("fits"), "step_time_s": round(s.get("step_time_s", float("nan")), 5),
            "remat": (p.solver.get("remat") or {}).get("policy", ""),
            "opaque_ops": max(len(g.opaque), len(p.solver.get("opaque", []))),
            "wall_s": round(time.perf_counter() - t, 1),
        })  # fmt: skip
        print(f"{name} on {hw}: {p.status} mesh {rows[-1]['mesh']} MFU {rows[-1]['mfu']} "
              f"{rows[-1]['memory_gib']} GiB, {rows[-1]['wall_s']} s\n  {rows[-1]['rules']}",
              flush=True)  # fmt: skip
    return rows


def silly(df: pd.DataFrame) -> pd.DataFrame:
    """``silly`` and ``why`` of every row (a row's own error kept as its why)."""
    df = df.copy()
    df["kind"] = [catalogue.ENTRIES[m].kind for m in df["model"]]
    best = df[df["status"] != "ERROR"].groupby(["kind", "hardware"])["mfu"].max()
    flags, whys = [], []
    for r in df.itertuples():
        why = []
        if r.status == "ERROR":
            why.append(str(r.why))
        elif r.status == "INFEASIBLE" or not _true(r.fits):
            why.append(f"{r.status}: no plan that fits ({r.memory_gib} GiB per device)")
        else:
            rules = str(r.rules) if isinstance(r.rules, str) else ""
            split = [x.split("->")[0].split("(")[0] for x in rules.split("; ") if x]
            if r.batch and r.batch >= 2 and "batch" not in split:
                why.append("the batch is left whole")
            ref = best.get((r.kind, r.hardware))
            if ref and r.mfu < SILLY_MFU * ref:
                why.append(f"MFU {r.mfu:.3f} under a third of the best {r.kind}'s {ref:.3f}")
        flags.append(bool(why))
        whys.append("; ".join(why))
    df["silly"], df["why"] = flags, whys
    return df


def _true(v) -> bool:
    return str(v).lower() == "true"


def figure(df: pd.DataFrame, out: Path) -> None:
    """Predicted MFU per entry and hardware; silly rows hatched, errors and misfits at 0."""
    hws = list(dict.fromkeys(df["hardware"]))
    models = list(dict.fromkeys(df["model"]))
    fig, ax = plt.subplots(figsize=(9, max(4, 0.22 * len(models) * len(hws) + 1.5)))
    h = 0.8 / max(1, len(hws))
    for i, hw in enumerate(hws):
        sub = df[df["hardware"] == hw].set_index("model")
        for j, m in enumerate(models):
            if m not in sub.index:
                continue
            r = sub.loc[m]
            mfu = float(r["mfu"]) if pd.notna(r["mfu"]) and _true(r["fits"]) else 0.0
            ax.barh(j + i * h, mfu, height=h, color=f"C{i}", hatch="//" if _true(r["silly"]) else "",
                    edgecolor="black" if _true(r["silly"]) else f"C{i}",
                    label=hw if j == 0 else None)  # fmt: skip
    ax.set_yticks([j + h * (len(hws) - 1) / 2 for j in range(len(models))], models, fontsize=7)
    ax.set(xlabel="predicted MFU at the published size (hatched: silly, see catalogue.csv)",
           title="The catalogue planned at its published sizes", ylim=(len(models), -1))  # fmt: skip
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "catalogue.png", dpi=110)


def main(argv: list[str]) -> pd.DataFrame:
    out = take_out(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--only", default="", help="comma-separated entries (default: all)")
    ap.add_argument("--hw", default=",".join(PROFILES))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--figure", action="store_true")
    ap.add_argument("--names", action="store_true",
                    help="trace only: each entry's dims and names into catalogue_names.csv")  # fmt: skip
    a = ap.parse_args(argv[1:])
    csv = out / "catalogue.csv"
    if a.names:
        names = a.only.split(",") if a.only else list(catalogue.ENTRIES)
        df = pd.DataFrame([traced(n)[2] for n in names])
        df.to_csv(out / "catalogue_names.csv", index=False)
        flagged = df["bad_names"].fillna("").astype(bool)
        print(f"{len(df)} entries traced at their published sizes: {int(df['opaque_ops'].sum())} "
              f"opaque ops, {int(flagged.sum())} entries with flagged names")  # fmt: skip
        return df
    if a.figure:  # redraw from the folder's CSV (the committed one without --out)
        src = csv if csv.exists() else RESULTS / "catalogue.csv"
        df = pd.read_csv(src)
        figure(df, out)
        return df
    profiles = a.hw.split(",")
    names = a.only.split(",") if a.only else order(list(catalogue.ENTRIES))
    unknown = set(names) - set(catalogue.ENTRIES)
    if unknown:
        raise SystemExit(
            f"unknown entries {sorted(unknown)}; known: {', '.join(catalogue.ENTRIES)}"
        )
    rows = pd.read_csv(csv).to_dict("records") if a.resume and csv.exists() else []
    done = {(r["model"], r["hardware"]) for r in rows}
    for name in names:
        todo = [hw for hw in profiles if (name, hw) not in done]
        if not todo:
            continue
        rows += plan_entry(name, todo, a.time_limit)
        df = silly(pd.DataFrame(rows).reindex(columns=COLUMNS))
        df.to_csv(csv, index=False)  # as the rows come: a run cut short keeps them
        figure(df, out)
    df = silly(pd.DataFrame(rows).reindex(columns=COLUMNS))
    df.to_csv(csv, index=False)
    figure(df, out)
    return df


if __name__ == "__main__":
    df = main(sys.argv)
    if "hardware" not in df:  # --names: said in one line above
        sys.exit(0)
    cols = ["model", "hardware", "status", "mesh", "mfu", "memory_gib", "wall_s", "silly", "why"]
    with pd.option_context("display.width", 250, "display.max_colwidth", 60):
        print(df[cols].to_string())
