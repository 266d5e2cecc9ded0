"""Gradient accumulation (issue 37.3): a step's gradients summed over microbatches by a scan,
planned, run by ``al.apply`` and ``autolayout run`` with the unaccumulated losses, and its
collectives as XLA compiles them."""

from __future__ import annotations

import json

import jax
import pytest
from click.testing import CliRunner

import autolayout as al
from autolayout._cli import main
from autolayout.core import WorkloadError, accumulate, accumulation_for_plan
from autolayout.runtime.run import reference_losses, run
from conftest import MODELS, load_model

GPT = {"scan": True, "layers": 1, "batch": 32}  # 16 and 8 rows a microbatch: data=8 divides
STEPS = 2


@pytest.fixture(scope="module")
def gpt():
    wl = load_model("gpt", **GPT)
    return wl, reference_losses(wl, steps=STEPS)


def _apply_losses(plan, wl) -> list[float]:
    """Two steps of ``al.apply(plan, wl.fn)`` (the written step: apply accumulates it)."""
    step = al.apply(plan, wl.fn, workload=wl)
    params, opt = jax.jit(wl.init_state)(jax.random.key(0))
    losses = []
    for i in range(STEPS):
        params, opt, loss = step(params, opt, *wl.batches(i, 0))
        losses.append(float(loss))
    return losses


@pytest.mark.parametrize("k", [2, 4])
def test_accumulated_plan_gives_the_unaccumulated_losses(gpt, k):
    wl, ref = gpt
    acc = accumulate(wl, k)
    assert acc.options["accumulation"] == k and acc.args == wl.args
    g = al.trace(acc)
    assert g.dims["microbatches"] == k and g.dims[f"batch({32 // k})"] == 32 // k
    p = al.evaluate(acc, "cpu-8", mesh={"data": 2, "fsdp": 4},
                    rules={"batch": ("data", "fsdp"), "d_model": "fsdp"}, graph=g)  # fmt: skip
    assert p.options["accumulation"] == k
    assert _apply_losses(p, wl) == pytest.approx(ref, rel=1e-5, abs=1e-5)
    assert run(p, wl, steps=STEPS).losses == pytest.approx(ref, rel=1e-5, abs=1e-5)


def test_cli_microbatches_alone_accumulates_and_runs(gpt, tmp_path):
    _, ref = gpt
    out, res = tmp_path / "acc.json", tmp_path / "run.json"
    sets = [x for kv in GPT.items() for x in ("--set", f"{kv[0]}={kv[1]}".replace("True", "true"))]
    r = CliRunner().invoke(main, ["plan", str(MODELS / "gpt.py"), "--hw", "cpu-8", *sets,
                                  "--microbatches", "2", "--time-limit", "3", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "accumulation: 2 microbatches (--microbatches 2 fixes it" in r.output
    assert "pipeline:" not in r.output  # --microbatches alone is no longer a pipeline
    plan = json.loads(out.read_text())
    assert plan["options"]["accumulation"] == 2
    assert plan["solver"]["accumulation"]["microbatches"] == 2
    r = CliRunner().invoke(main, ["run", str(MODELS / "gpt.py"), "--plan", str(out),
                                  "--steps", str(STEPS), "--out", str(res)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(res.read_text())["losses"] == pytest.approx(ref, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    "mesh,rules",
    [
        ({"data": 8}, {"batch": "data"}),
        ({"data": 4, "model": 2}, {"batch": "data", "heads": "model", "d_ff": "model"}),
    ],
)
def test_validate_accumulated_collectives_within_10_percent(gpt, mesh, rules):
    """Gathers and reductions inside the microbatch loop count once a microbatch on both
    sides (XLA:CPU reduces each microbatch's gradients in the loop: measured, 2x the
    parameters' bytes at k=2)."""
    wl, _ = gpt
    p = al.evaluate(accumulate(wl, 2), "cpu-8", mesh=mesh, rules=rules)
    v = al.validate(p, wl)
    rows = v[v["quantity"].isin(["all-gather", "all-reduce", "reduce-scatter", "all-to-all"])]
    assert len(rows) >= 1
    assert ((rows["ratio"] - 1).abs() <= 0.10).all(), v.to_string()


@pytest.mark.parametrize("layers", [1, 2])
def test_validate_accumulated_fsdp_gathers(layers):
    """XLA hoists what a scan's iterations share out of it: FSDP's gathers of the weights the
    microbatch loop reads whole are made once a step (a one-layer stack's scan is one
    iteration, so its weights are shared too), not once a microbatch, and the gathered
    copies live through the loop (they were 2x the prediction at k=2, the memory 1.98x at
    k=4)."""
    wl = load_model("gpt", **{**GPT, "layers": layers})
    for k in (2, 4):
        p = al.evaluate(accumulate(wl, k), "cpu-8", mesh={"fsdp": 8},
                        rules={"batch": "fsdp", "d_model": "fsdp"})  # fmt: skip
        v = al.validate(p, wl).set_index("quantity")
        gathers = v.loc["all-gather"]
        assert abs(gathers["ratio"] - 1) <= 0.02, v.to_string()
        assert gathers["predicted_count"] == gathers["compiled_count"], v.to_string()
        assert v.loc["memory", "ratio"] < 1.4, v.to_string()


def test_refusals_in_one_line(gpt):
    wl, _ = gpt
    opaque = al.Workload(
        lambda w, x: (w * x).sum(), (al.spec((4,), ("d",)), al.spec((8, 4), ("batch", "d")))
    )
    with pytest.raises(WorkloadError, match="only a step built by al.train_workload"):
        accumulate(opaque, 2)
    with pytest.raises(WorkloadError, match="3 microbatches do not divide the batch"):
        accumulate(wl, 3)
    with pytest.raises(al.PlanError, match="cannot accumulate gradients over 3 microbatches"):
        al.plan(wl, "cpu-8", microbatches=3, time_limit_s=1)
    # a plan without accumulation leaves the step as it is
    p = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    assert accumulation_for_plan(p, wl) is wl


def test_an_accumulated_remat_step_counts_its_recomputation():
    """The backward passes of an accumulated step are in its microbatch loop, after each
    microbatch's loss: its recomputation is found there (it was none, so MFU counted the
    recomputed forward as model work), the same FLOPs as the unaccumulated step's."""
    from autolayout.cost_models import recomputed_ops

    wl = al.remat(load_model("gpt", **GPT), "nothing_saveable")
    one, acc = (al.evaluate(w, "cpu-8", mesh={"data": 8}, rules={"batch": "data"}).summary()
                for w in (wl, accumulate(wl, 2)))  # fmt: skip
    assert len(recomputed_ops(al.trace(accumulate(wl, 2)))) == len(recomputed_ops(al.trace(wl)))
    assert len(recomputed_ops(al.trace(wl))) > 0
    assert acc["model_flops"] == pytest.approx(one["model_flops"], rel=0.01)
    assert acc["mfu"] < acc["hfu"]


def test_hand_layouts_split_every_microbatchs_rows(gpt):
    """An accumulated step's batch has two sizes (the whole batch the step takes, ``batch(32)``,
    and each microbatch's rows, ``batch(16)``): the hand layouts' rule is for ``batch``, both
    sizes, so each microbatch runs split as the step without accumulation does (a rule for the
    whole batch alone left the microbatches whole: an 8B's FSDP seed priced 668 s, not 14.8)."""
    from autolayout.search.baselines import batch_dim, layouts_on

    wl, _ = gpt
    g = al.trace(accumulate(wl, 2))
    assert batch_dim(g) == "batch" and len(g.named("batch")) == 2
    one = al.evaluate(wl, "cpu-8", mesh={"a": 8}, rules={"batch": "a"}).predicted
    hand = layouts_on(g, {"a": 8})
    assert {"dp", "fsdp"} <= set(hand)
    for name in ("dp", "fsdp"):
        p = al.evaluate(accumulate(wl, 2), "cpu-8", mesh={"a": 8}, rules=hand[name], graph=g)
        assert p.predicted["flops_per_device"] == pytest.approx(one["flops_per_device"], rel=0.05)
