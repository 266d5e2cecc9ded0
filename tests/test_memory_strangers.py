"""Memory of models the project did not write (issue 34, item 3): a remat plan's compiled
temporaries fall as predicted with XLA:CPU's default flags, and a resharding XLA's SPMD
partitioner can only do by replicating the tensor is known as such.

XLA:CPU expands a remat region's optimization barriers before it schedules, and schedules
breadth first: an unrolled step's recomputation runs in the forward pass as soon as the saved
values it reads exist, so it saves nothing there (``memory.schedule``; the scanned stacks'
recomputation, inside the backward loop, is tests/test_remat.py's)."""

from __future__ import annotations

import itertools
import math
import random
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

import autolayout as al
from autolayout.core import partition_spec
from autolayout.core._remat import parse_remat
from autolayout.cost_models import donated_inputs, price
from autolayout.cost_models.memory import lifetimes, schedule
from autolayout.cost_models.replicating import replicates
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
    early = {t: a for t, a, _ in lifetimes(g, (), False, False)}  # barriers dropped
    late = {t: a for t, a, _ in lifetimes(g, (), False, True)}
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
        g,
        share=True,
        donated=donated,
        stacks_at_start=hw.efficiency.scan_stacks_at_start,
        barriers=hw.efficiency.remat_barriers,
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


# --- reshardings XLA can only do by replicating ------------------------------------------------


def _layouts(axes: tuple[str, ...], rank: int) -> list[tuple[tuple[str, ...], ...]]:
    """Every layout of a rank-``rank`` tensor: each mesh axis on one tensor axis or none, in
    every order within a tensor axis."""
    out = set()
    for where in itertools.product(range(rank + 1), repeat=len(axes)):
        groups = [[a for a, d in zip(axes, where, strict=True) if d == r] for r in range(rank)]
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            out.add(tuple(tuple(o) for o in orders))
    return sorted(out)


def _gathers_whole(mesh: dict[str, int], shape: tuple[int, ...], src, dst) -> bool:
    """Whether XLA:CPU, on these devices, compiles ``src -> dst`` with an all-gather whose
    result is the whole tensor (its "involuntary full rematerialization")."""
    devices = np.array(jax.devices()[: math.prod(mesh.values())]).reshape(tuple(mesh.values()))
    m = Mesh(devices, tuple(mesh))
    a, b = (NamedSharding(m, partition_spec(x)) for x in (src, dst))
    f = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, b), in_shardings=a)
    hlo = f.lower(jax.ShapeDtypeStruct(shape, jnp.float32)).compile().as_text()
    whole = ",".join(map(str, shape))
    return re.search(rf"= f32\[{whole}\]\S* all-gather\(", hlo) is not None


def test_the_reshardings_xla_replicates_are_known():
    """``replicates`` against XLA:CPU on 8 devices: every pair of 2-D layouts on 2x4, and
    every 3-D layout reached from an FSDP-like one on 2x2x2 (measured once over ~4,500
    pairs, 2-D on 2x4, 4x2, 2x2x2, 8 and 3-D on 2x4, 4x2 and 1,200 of 2x2x2: equal on all;
    there XLA also logs the warning for 35 pairs it gathers in groups of four, half the
    tensor, which xla_reshard prices as such)."""
    cases = [({"a": 2, "b": 4}, (32, 64), _layouts(("a", "b"), 2), None)]
    sources = [((), (), ("a", "b", "c"))]
    cases.append(({"a": 2, "b": 2, "c": 2}, (16, 16, 32), _layouts(("a", "b", "c"), 3), sources))
    seen = {True: 0, False: 0}
    for mesh, shape, layouts, froms in cases:
        for src in froms or layouts:
            for dst in layouts:
                if src == dst:
                    continue
                got = replicates(mesh, shape, src, dst)
                assert got == (_gathers_whole(mesh, shape, src, dst) and any(dst)), (src, dst)
                seen[got] += 1
    assert seen[True] > 20 and seen[False] > 100, seen
    # the weight: FSDP's {devices=[1,8]} read with d_ff on one axis of fsdp x fsdp2
    fsdp = {"fsdp": 4, "fsdp2": 2}
    assert replicates(fsdp, (1024, 256), ((), ("fsdp", "fsdp2")), (("fsdp",), ()))
    assert not replicates(fsdp, (1024, 256), ((), ("fsdp", "fsdp2")), (("fsdp", "fsdp2"), ()))


def _two_axes_rule(src: tuple[int, int], dst: tuple[int, int], devices: int = 8) -> bool:
    """When XLA replicates a 2-D tensor on 8 devices, by tile counts: a split moving wholly to
    the other axis with another count, the target partly replicated; or 8-way on one axis to
    2 x 2, or back."""
    crossed = (src[0] == 1 and dst[1] == 1 and src[1] > 1 and dst[0] > 1) or (
        src[1] == 1 and dst[0] == 1 and src[0] > 1 and dst[1] > 1
    )
    if crossed:
        return max(src) != max(dst) and math.prod(dst) < devices
    return (sorted(src) == [1, 8] and dst == (2, 2)) or (src == (2, 2) and sorted(dst) == [1, 8])


@pytest.mark.parametrize(
    "mesh", [{"a": 2, "b": 4}, {"a": 4, "b": 2}, {"a": 2, "b": 2, "c": 2}, {"a": 8}]
)
def test_which_2d_reshardings_replicate_depends_on_tile_counts_alone(mesh):
    """On 8 devices a 2-D resharding replicates exactly in the cases ``_two_axes_rule`` names
    (by each axis's tile count; which mesh axes, in which order, does not matter)."""
    layouts = _layouts(tuple(mesh), 2)

    def counts(layout):
        return tuple(math.prod(mesh[a] for a in axes) for axes in layout)

    for src, dst in itertools.product(layouts, layouts):
        if src != dst:
            got = replicates(mesh, (32, 64), src, dst)
            assert got == _two_axes_rule(counts(src), counts(dst)), (src, dst)
