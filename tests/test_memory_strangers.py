"""Memory of models the project did not write (issue 34, item 3): a remat plan's compiled
temporaries fall as predicted with XLA:CPU's default flags, and a resharding XLA's SPMD
partitioner can only do by replicating the tensor is known as such.

XLA:CPU expands a remat region's optimization barriers before it schedules, and schedules
breadth first: an unrolled step's recomputation runs in the forward pass as soon as the saved
values it reads exist, so it saves nothing there (``memory.schedule``; the scanned stacks'
recomputation, inside the backward loop, is tests/test_remat.py's)."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.core._remat import parse_remat
from autolayout.cost_models import donated_inputs, price
from autolayout.cost_models.memory import lifetimes, schedule
from autolayout.search import liveness
from autolayout.search import request as rq
from autolayout.search import structure as st_mod
from conftest import MODELS, load_model

# the plan: FSDP over both axes of fsdp x fsdp2, the step rewritten by each policy
# remat="auto" ranks on cpu-8 (2 layers, short sequences: compiled in seconds)
STRANGER = dict(layers=2, seq=128)
BOTH = ("fsdp", "fsdp2")
CASES = {
    "stranger_lm": (
        STRANGER,
        {"fsdp": 2, "fsdp2": 4},
        [("batch", BOTH), ("d_model", BOTH)],
        ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
         "nothing_saveable+regather"),
    ),
    "gpt": (dict(layers=2), {"fsdp": 8}, [("batch", ("fsdp",)), ("d_model", ("fsdp",))],
            ("nothing_saveable", "dots_saveable", "as_written+regather")),
}  # fmt: skip


def _stranger(**options) -> al.Workload:
    return al.load_workload(MODELS / "stranger_lm.py", **options)


def _temporaries(plan: al.Plan, w: al.Workload) -> int:
    compiled = al.apply(plan, w.fn, workload=w).lower(*w.args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def _held(plan: al.Plan) -> int:
    by = plan.predicted["memory_by_category"]
    return by["activations"] + by.get("copies", 0)


@pytest.mark.parametrize("model", list(CASES))
def test_remat_falls_as_xla_cpu_compiles_it(model):
    """Each policy's predicted fall (activations and resharded copies at the peak, against
    the step as written) is the compiled one within 15%, XLA:CPU's default flags: 1.000
    compiled for every policy of the stranger (the recomputation scheduled back into the
    forward pass), 1.02-1.07 predicted; the tiny GPT's regather 1.12 compiled, 1.06
    predicted (its second gathers made at the step's start). The walk in program order
    predicted 0.34-0.70x on the stranger's 8 layers (what the issue's plan at 0.50x of FSDP's
    memory rested on) and 0.66x for the GPT's regather."""
    options, mesh, rules, policies = CASES[model]
    wl = _stranger(**options) if model == "stranger_lm" else load_model(model, **options)
    base = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules)
    base_temp = _temporaries(base, wl)
    for tag in policies:
        w = al.remat(wl, *parse_remat(tag))
        p = al.evaluate(w, "cpu-8", mesh=mesh, rules=rules)
        predicted = _held(p) / _held(base)
        compiled = _temporaries(p, w) / base_temp
        assert compiled / predicted == pytest.approx(1, abs=0.15), (tag, compiled, predicted)
        assert predicted > 0.95, (tag, predicted)  # XLA:CPU recomputes in the forward pass


def test_a_recomputation_runs_right_after_what_it_reads_on_xla_cpu():
    """Where barriers do not reach the scheduler, a remat region's ops move to right after
    the last value they read is written (the forward pass) and nothing else moves; the
    recomputed values then live from there to their backward reader."""
    wl = al.remat(_stranger(layers=2, seq=32, d_model=64, d_ff=128, vocab=64), "dots_saveable")
    g = al.trace(wl)
    assert schedule(g, True) is None
    order = schedule(g, False)
    assert sorted(order) == list(range(len(g.ops)))
    position = {i: k for k, i in enumerate(order)}
    index = {op.name: i for i, op in enumerate(g.ops)}
    written = {t: index[op.name] for op in g.ops for t in op.outputs}
    moved = [i for i, op in enumerate(g.ops) if op.remat]
    assert moved
    for i in moved:  # right after its inputs: nothing but other moved ops in between
        op = g.ops[i]
        after = max((position[written[t]] for t in op.inputs if t in written), default=-1)
        between = order[after + 1 : position[i]]
        assert all(g.ops[j].remat for j in between), op.name
    kept = [i for i in range(len(g.ops)) if i not in set(moved)]
    assert [i for i in order if i in set(kept)] == kept  # the rest in program order
    # so most recomputed values are born earlier than where the backward pass reaches them
    early = {t: a for t, a, _ in lifetimes(g, (), True)}
    late = {t: a for t, a, _ in lifetimes(g, (), False)}
    rec = [t for i in moved for t in g.ops[i].outputs if t in early and t in late]
    assert rec and sum(early[t] < late[t] for t in rec) > len(rec) / 2


@pytest.mark.parametrize("tag", ["nothing_saveable", "dots_saveable+regather"])
def test_the_searchs_walks_price_xla_cpus_schedule_as_price_does(tag):
    """The search's memory (the array walk, the walk by liveness_peak) equals price()'s on
    cpu-8, where the recomputation is scheduled as XLA:CPU runs it, at the same point."""
    wl = al.remat(_stranger(layers=2, seq=64), *parse_remat(tag))
    g = al.trace(wl)
    hw = al.hardware("cpu-8")
    donated = donated_inputs(wl, g)
    structure = st_mod.analyse(
        g, share=True, donated=donated, stacks_at_start=hw.efficiency.scan_stacks_at_start
    )
    assert structure.lifetimes.order is not None  # XLA:CPU's schedule
    for mesh in ({"a": 2, "b": 4}, {"a": 8}):
        req = rq.build(structure, hw, mesh)
        rnd = random.Random(1)
        for _ in range(3):
            choice = [rnd.choice(req.allowed(n)) for n in range(len(req.nodes))]
            layouts, assigns = req.layouts_of(choice), req.assigns_of(choice)
            p = price(g, hw, req.machine.mesh, layouts,
                      lambda op, groups, a=assigns: list(a[op.name]), donated=donated)  # fmt: skip
            peak = liveness.memory_peak(req, choice)
            assert peak[0] == p["predicted"]["memory_bytes_per_device"]
            arrays = liveness._Liveness(req.structure).peak(req, choice)
            assert arrays == liveness.memory_peak_walk(req, choice) == peak
            liveness.memory_row(req, peak[1])  # a row at that point builds


def _blocks(checkpoint: bool) -> al.Workload:
    """Four unrolled two-matmul blocks, each under jax.checkpoint or not, and their gradient."""

    def block(y, w):
        return jnp.tanh(jnp.tanh(y @ w) @ w.T)

    def step(w, x):
        def loss(w):
            y = x
            for _ in range(4):
                y = jax.checkpoint(block)(y, w) if checkpoint else block(y, w)
            return jnp.sum(y)

        return jax.grad(loss)(w)

    return al.Workload(step, (jax.ShapeDtypeStruct((256, 256), jnp.float32),
                              jax.ShapeDtypeStruct((2048, 256), jnp.float32)))  # fmt: skip


def test_a_users_jax_checkpoint_is_priced_as_xla_cpu_compiles_it():
    """A user's own jax.checkpoint around unrolled blocks: XLA:CPU compiles more temporaries
    with it than without (1.33x: the recomputation runs in the forward pass beside the
    values it copies), and so does the walk on cpu-8 (1.31x); on a GPU profile, whose
    compiler keeps the barriers, it predicts the fall."""
    held = {}
    for ckpt in (True, False):
        w = _blocks(ckpt)
        for hw in ("cpu-1", "h100-1"):
            p = al.evaluate(w, hw, mesh={"data": 1}, rules={})
            held[ckpt, hw] = p.predicted["memory_by_category"]["activations"]
        held[ckpt, "xla"] = (
            jax.jit(w.fn).lower(*w.args).compile().memory_analysis().temp_size_in_bytes
        )
    compiled = held[True, "xla"] / held[False, "xla"]
    predicted = held[True, "cpu-1"] / held[False, "cpu-1"]
    assert compiled > 1 and predicted / compiled == pytest.approx(1, abs=0.15), held
    assert held[True, "h100-1"] < 0.8 * held[False, "h100-1"], held
