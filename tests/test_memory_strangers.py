"""Memory of models the project did not write (issue 34, item 3): a remat plan's compiled
temporaries fall as predicted with XLA:CPU's default flags, and a resharding XLA's SPMD
partitioner can only do by replicating the tensor is known as such.

XLA:CPU expands a remat region's optimization barriers before it schedules, and schedules
breadth first: an unrolled step's recomputation runs in the forward pass as soon as the saved
values it reads exist, so it saves nothing there (``memory.schedule``; the scanned stacks'
recomputation, inside the backward loop, is tests/test_remat.py's)."""

from __future__ import annotations

import dataclasses
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
    gpu = al.hardware("h100-8").efficiency  # scan stacks from their loop, no lowering flags
    early = {t: a for t, a, _ in lifetimes(g, (), dataclasses.replace(gpu, remat_barriers=False))}
    late = {t: a for t, a, _ in lifetimes(g, (), gpu)}
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
        compiler=hw.efficiency,
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


def _stranger_cnn(pool: str, batch: int = 64, image: int = 16) -> al.Workload:
    """A stranger's Flax linen CNN (float32, no dim named): two convolutions, a max-pool,
    an average pool or none between them, a spatial mean and two dense layers, adam."""
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(32, (3, 3))(x))
            if pool == "max":
                x = nn.max_pool(x, (2, 2), (2, 2))
            elif pool == "avg":
                x = nn.avg_pool(x, (2, 2), (2, 2))
            x = nn.relu(nn.Conv(64, (3, 3))(x))
            return nn.Dense(10)(nn.relu(nn.Dense(128)(x.mean(axis=(1, 2)))))

    model, shape = CNN(), (batch, image, image, 3)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, *shape[1:]))))

    def loss_fn(p, b):
        logits = model.apply({"params": p}, b[0])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b[1]).mean()

    def make_batch(rng):
        return (rng.standard_normal(shape).astype("float32"),
                rng.integers(0, 10, batch).astype("int32"))  # fmt: skip

    spec = (jax.ShapeDtypeStruct(shape, jnp.float32), jax.ShapeDtypeStruct((batch,), jnp.int32))
    return al.train_workload(loss_fn, optax.adam(1e-3), params["params"], spec, make_batch)


@pytest.mark.parametrize("pool, batch", [("max", 64), ("max", 256), ("avg", 64), ("none", 64)])
def test_a_cnns_memory_is_what_xla_cpu_keeps_around_pools_and_convolutions(pool, batch):
    """The batch split 8 ways: validate's memory row within 10% of XLA:CPU's. XLA:CPU
    expands a max-pool's gradient into an argmax in the forward pass (an s32 iota per dim of
    the pooled map, s32 indices per dim of its result) and a scatter into zeros made at the
    step's start, and runs each weight gradient on transposed copies of its operands, made
    where they are written (``select_and_scatter_expanded``, ``weight_gradient_copies``):
    without them predicted at 2.07x below XLA (max-pool, batch 64), 2.47x (batch 256), 1.31x
    (no pool); with them 1.08x, 1.07x, 1.03x; the average pool 0.93x (its pooled gradient kept
    beside the mask's select, which XLA frees first)."""
    wl = _stranger_cnn(pool, batch)
    p = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    v = al.validate(p, wl).set_index("quantity")
    assert v.loc["memory", "checked"], v
    assert v.loc["memory", "ratio"] == pytest.approx(1, abs=0.10), v


def test_the_searchs_walks_price_a_cnns_lowering_as_price_does():
    """The search's memory (the array walk, the walk by liveness_peak) equals price()'s on
    cpu-8 with the max-pool's argmax and the weight gradients' copies, and a profile without
    them prices less."""
    from conftest import check_request_prices_like_price

    wl = _stranger_cnn("max")
    g = al.trace(wl)
    hw = al.hardware("cpu-8")
    assert hw.efficiency.select_and_scatter_expanded and hw.efficiency.weight_gradient_copies
    check_request_prices_like_price(wl, g, hw, choices=4, seed=2)
    bare = dataclasses.replace(
        hw,
        efficiency=dataclasses.replace(
            hw.efficiency, select_and_scatter_expanded=False, weight_gradient_copies=False
        ),
    )
    check_request_prices_like_price(wl, g, bare, choices=2, seed=2)
    mesh, rules = {"data": 8}, {"batch": "data"}
    with_, without = (al.evaluate(wl, h, mesh=mesh, rules=rules, graph=g) for h in (hw, bare))
    assert (without.predicted["memory_bytes_per_device"]
            < 0.6 * with_.predicted["memory_bytes_per_device"])  # fmt: skip


def _grouped_conv_step(groups: int) -> al.Workload:
    """A 3x3 "SAME" convolution of 16 channels in ``groups`` groups (16: depthwise) over
    8 images of 8x8, trained with plain SGD."""
    dn = ("NHWC", "HWIO", "NHWC")
    x = al.spec((8, 8, 8, 16), ("batch", "h", "w", "channels"))
    w = jax.ShapeDtypeStruct((3, 3, 16 // groups, 16), jnp.float32)

    def step(w, x):
        def loss(w, x):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn,
                                             feature_group_count=groups)  # fmt: skip
            return jnp.sum(jnp.tanh(y) ** 2)

        gw, gx = jax.grad(loss, argnums=(0, 1))(w, x)
        return w - 0.1 * gw, gx

    return al.Workload(step, (w, x))


def test_a_depthwise_weight_gradient_is_priced_dense_on_xla_cpu_grouped_elsewhere():
    """XLA:CPU runs a depthwise conv's weight gradient (batch_group_count = channels) as a
    dense convolution over every pair of channels, then masks it to the diagonal and sums
    (``depthwise_gradient_dense``); a GPU runs it grouped. The batch split 8 ways, one image
    a device: grouped, 2 x 16 channels x 22^2 valid (position, tap) pairs (8 x 3 - 2 a dim)
    = 15,488 FLOPs; dense, 16 x that = 247,808, and the mask's compare and select and the sum
    over the 3x3x16 x 16 dense filter, 2,304 + 2,304 + 2,160 = 6,768: 254,576 (XLA:CPU's
    cost_analysis of the same gradient: 16 x the grouped + 6,768). The forward conv and the
    input gradient, and every conv of a 4-group conv (XLA:CPU runs its weight gradient
    grouped, one more spatial dim: as many FLOPs), are priced alike on both."""
    from conftest import check_request_prices_like_price

    wl = _grouped_conv_step(16)
    g = al.trace(wl)
    mesh, rules = {"data": 8}, {"batch": "data"}
    cpu, gpu = (al.evaluate(wl, h, mesh=mesh, rules=rules, graph=g) for h in ("cpu-8", "h100-8"))

    def flops(p):
        return {r["op"]: r["flops"] for r in p.ops if r["kind"] == "conv_general_dilated"}

    (dense,) = [op.name for op in g.ops if op.param("depthwise_gradient") is not None]
    assert flops(gpu)[dense] == 15_488 and flops(cpu)[dense] == 254_576
    assert {k: v for k, v in flops(cpu).items() if k != dense} == {
        k: v for k, v in flops(gpu).items() if k != dense
    }
    assert cpu.predicted["model_flops"] == gpu.predicted["model_flops"]  # the grouped work
    v = al.validate(cpu, wl).set_index("quantity")
    for row in ("flops", "memory"):
        assert v.loc[row, "checked"] and v.loc[row, "ok"], v
    assert v.loc["flops", "ratio"] == pytest.approx(1, abs=0.02), v
    check_request_prices_like_price(wl, g, al.hardware("cpu-8"), choices=2, seed=1)

    wl4 = _grouped_conv_step(4)
    g4 = al.trace(wl4)
    assert not any(op.param("depthwise_gradient") is not None for op in g4.ops)
    cpu4, gpu4 = (al.evaluate(wl4, h, mesh=mesh, rules=rules, graph=g4)
                  for h in ("cpu-8", "h100-8"))  # fmt: skip
    assert flops(cpu4) == flops(gpu4)


@pytest.mark.parametrize("groups", [2, 4])
def test_a_grouped_conv_runs_on_each_devices_images(groups):
    """A grouped convolution (2 or 4 groups of 8 or 4 channels): XLA's partitioner gathers
    its input and runs it whole on every device (openxla/xla#47945: FLOPs 5.5x the plan's
    under a batch split), so ``al.apply`` runs it under ``shard_map`` on its batch. Every
    layout validates (collectives, FLOPs within 10%, memory 2x): the batch split, with the
    channels or a spatial dim split too (read whole by the conv: gathered), the channels
    alone; the batch split's steps equal the unsharded step's."""
    import numpy as np

    from conftest import check_request_prices_like_price

    wl = _grouped_conv_step(groups)
    g = al.trace(wl)
    assert sum(bool(op.param("grouped")) for op in g.ops) == 3  # forward, both gradients
    from autolayout.cost_models import kernel_notes

    (note,) = kernel_notes(g, al.hardware("h100-8"))
    assert note.startswith("3 grouped convolution ops") and "xla#47945" in note
    assert kernel_notes(al.trace(_grouped_conv_step(16)), al.hardware("h100-8")) == []
    two = {"a": 2, "b": 4}
    layouts = [({"data": 8}, {"batch": "data"}), (two, {"batch": ("a", "b")}),
               (two, {"batch": "a", "channels": "b"}), (two, {"batch": "b", "h": "a"}),
               ({"data": 8}, {"channels": "data"})]  # fmt: skip
    for mesh, rules in layouts:
        p = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
        v = al.validate(p, wl)
        assert v["ok"][v["checked"]].all(), (mesh, rules, v)
        assert v.set_index("quantity").loc["flops", "checked"], v
        if rules == {"batch": "data"}:
            assert v.set_index("quantity").loc["flops", "ratio"] == pytest.approx(1, abs=0.02)
            assert "all-gather" not in set(v["quantity"]), v
            keys = jax.random.split(jax.random.key(0), 2)
            args = [
                jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, wl.args, strict=True)
            ]
            want = jax.jit(wl.fn)(*args)
            got = al.apply(p, wl.fn)(*args)
            for x, y in zip(got, want, strict=True):
                np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)
    check_request_prices_like_price(wl, g, al.hardware("cpu-8"), choices=2, seed=3)


def _ragged_moe_step(rows: int = 64) -> al.Workload:
    """Two grouped matmuls (``lax.ragged_dot``) of an MoE's sorted tokens through 4 experts
    (16 -> 32 -> 16), trained with plain SGD; the group sizes are the step's input."""
    x = al.spec((rows, 16), ("batch", "d_model"))
    w1 = al.spec((4, 16, 32), ("experts", "d_model", "d_ff"))
    w2 = al.spec((4, 32, 16), ("experts", "d_ff", "d_model"))

    def step(w1, w2, x, sizes):
        def loss(w1, w2, x):
            h = jax.nn.silu(jax.lax.ragged_dot(x, w1, sizes))
            return jnp.sum(jnp.tanh(jax.lax.ragged_dot(h, w2, sizes)) ** 2)

        g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2, x)
        return w1 - 0.1 * g1, w2 - 0.1 * g2

    return al.Workload(step, (w1, w2, x, jax.ShapeDtypeStruct((4,), jnp.int32)))


def test_a_ragged_dot_is_priced_dense_on_xla_cpu_grouped_elsewhere():
    """jax lowers ``lax.ragged_dot`` for XLA:CPU densely (``ragged_dot_dense``): each ragged
    operand broadcast over the 4 groups and masked, one matmul over every group. d_ff split 8
    ways: the forward's first matmul, 64 x 16 x 4 of 32, grouped 2 x 64 x 16 x 4 = 8,192
    FLOPs; dense 4 x that and the mask (2 compares, an and, a select) over the masked
    4 x 64 x 16 rows: 32,768 + 16,384 = 49,152. A GPU keeps the grouped price; the model
    FLOPs are the grouped work on both."""
    from conftest import check_request_prices_like_price

    wl = _ragged_moe_step()
    g = al.trace(wl)
    mesh, rules = {"data": 8}, {"d_ff": "data"}
    cpu, gpu = (al.evaluate(wl, h, mesh=mesh, rules=rules, graph=g) for h in ("cpu-8", "h100-8"))

    def flops(p):
        return {r["op"]: r["flops"] for r in p.ops if r["kind"] == "ragged_dot_general"}

    first = next(op.name for op in g.ops if op.primitive == "ragged_dot_general")
    assert flops(gpu)[first] == 8_192 and flops(cpu)[first] == 49_152
    assert all(flops(cpu)[k] > 4 * v for k, v in flops(gpu).items())
    assert cpu.predicted["model_flops"] == gpu.predicted["model_flops"]
    v = al.validate(cpu, wl).set_index("quantity")
    assert v["checked"].all() and v["ok"].all(), v  # collectives, FLOPs within 10%, memory 2x
    check_request_prices_like_price(wl, g, al.hardware("cpu-8"), choices=2, seed=1)


def _sorted_moe_step(tokens: int = 64, k: int = 2) -> al.Workload:
    """An MoE's sorted-token dispatch, as a stranger writes it: the tokens' ``k`` expert ids
    (the step's input) sorted, the tokens gathered in that order, two grouped matmuls
    (``lax.ragged_dot``) through 4 experts (16 -> 32 -> 16), a scatter-add back to the
    tokens; every weight and the tokens trained with plain SGD."""
    x = al.spec((tokens, 16), ("batch", "d_model"))
    w1 = al.spec((4, 16, 32), ("experts", "d_model", "d_ff"))
    w2 = al.spec((4, 32, 16), ("experts", "d_ff", "d_model"))

    def step(w1, w2, x, flat):
        def loss(w1, w2, x):
            order = jnp.argsort(flat)
            tok = jnp.repeat(jnp.arange(tokens), k)[order]
            sizes = jnp.bincount(flat, length=4).astype(jnp.int32)
            h = jax.nn.silu(jax.lax.ragged_dot(x[tok], w1, sizes))
            out = jnp.zeros_like(x).at[tok].add(jax.lax.ragged_dot(h, w2, sizes))
            return jnp.sum(jnp.tanh(out) ** 2)

        g1, g2, gx = jax.grad(loss, argnums=(0, 1, 2))(w1, w2, x)
        return w1 - 0.1 * g1, w2 - 0.1 * g2, x - 0.1 * gx

    return al.Workload(step, (w1, w2, x, jax.ShapeDtypeStruct((tokens * k,), jnp.int32)))


def test_a_sorted_dispatch_moe_validates_on_every_layout():
    """The sorted-dispatch MoE's layouts on 2x4 and 2x2x2 meshes (the experts, d_ff, the batch
    and d_model on an axis, and together) validate against XLA on 8 CPU devices: collectives
    and FLOPs within 10%, memory within 2x. The dispatch's gather with the tokens split and
    the gathered rows' d_model on the same axes: XLA partitions the gathered rows like their
    layout on the mesh axes the sum leaves free, all-reduces that piece and permutes it into
    place (an all-reduce of half the rows on a 2x4 mesh, not of all of them: 0.5x before)."""
    wl = _sorted_moe_step()
    g = al.trace(wl)
    two, three = {"a": 2, "b": 4}, {"a": 2, "b": 2, "c": 2}
    layouts = [
        (two, {"experts": "a"}),
        (two, {"d_ff": "b"}),
        (two, {"batch": "b"}),
        (two, {"experts": "a", "d_ff": "b"}),
        (two, {"experts": "a", "batch": "b"}),
        (two, [("batch", "b"), ("d_model", "b")]),  # the rows' gather: a sum over b
        (two, [("batch", "a"), ("d_model", "a"), ("experts", "b")]),
        (three, {"experts": "a", "d_ff": "b", "batch": "c"}),
        (three, {"experts": "a", "d_model": "b", "d_ff": "c"}),
        (three, {"d_ff": "a", "d_model": "b", "batch": "c"}),
        (three, [("batch", ("a", "b")), ("d_model", ("a", "b")), ("experts", "c")]),
    ]
    for mesh, rules in layouts:
        p = al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
        v = al.validate(p, wl)
        assert v["ok"][v["checked"]].all(), (mesh, rules, v)
        assert v.set_index("quantity").loc[["flops", "memory"], "checked"].all()
