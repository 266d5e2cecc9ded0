"""The search: request == evaluator, ILP == brute force, memory rows, mesh shapes, al.plan."""

from __future__ import annotations

import itertools
import math
import random
import time

import jax
import jax.numpy as jnp
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import autolayout as al
from autolayout.cost_models import donated_inputs, price
from autolayout.search import ilp, liveness
from autolayout.search import planner as pl
from autolayout.search import refine as rf
from autolayout.search import request as rq
from autolayout.search import seeds as seeding
from autolayout.search import structure as st_mod
from autolayout.search.clock import WORK_SHARE
from autolayout.search.meshes import factorisations, mesh_shapes
from conftest import check_request_prices_like_price

MODELS = "experiments/models"


def priced(g, hw, req, choice, donated=()):
    """What ``al.evaluate``'s pricing says of a choice of the request."""
    layouts, assigns = req.layouts_of(choice), req.assigns_of(choice)
    return price(
        g, hw, req.machine.mesh, layouts, lambda op, groups: list(assigns[op.name]), donated=donated
    )["predicted"]


# --- random small graphs -------------------------------------------------------------------

B, D = 4, 6  # the batch divides 2 and 4, the features 2 only: few strategies, brute-forceable


@st.composite
def programs(draw):
    """A jax function of <= 6 ops over named inputs: matmuls, tanh, adds, sums, transposes."""
    n = draw(st.integers(1, 4))
    steps = [draw(st.sampled_from(["matmul", "tanh", "add", "sum", "transpose"])) for _ in range(n)]
    return steps


def build_fn(steps):
    specs = [al.spec((B, D), ("batch", "d_in"))]
    weights = 0
    for s in steps:
        if s == "matmul":
            weights += 1
    specs += [al.spec((D, D), (f"d_in{k}", f"d_out{k}")) for k in range(weights)]

    def fn(x, *ws):
        vals = [x]
        k = 0
        for s in steps:
            v = vals[-1]
            if s == "matmul" and v.ndim == 2 and v.shape[1] == D:
                v = v @ ws[k]
                k += 1
            elif s == "tanh":
                v = jnp.tanh(v)
            elif s == "add" and len(vals) > 1 and vals[-2].shape == v.shape:
                v = v + vals[-2]
            elif s == "sum" and v.ndim == 2:
                v = jnp.sum(v, axis=1, keepdims=True) * v
            elif s == "transpose" and v.ndim == 2:
                v = v.T
            vals.append(v)
        return jnp.sum(vals[-1])

    return al.Workload(fn, tuple(specs), name="random")


@pytest.mark.parametrize("merge", [True, False])
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(steps=programs(), shape=st.sampled_from([(2, 2), (2, 4)]))
def test_ilp_equals_brute_force(steps, shape, merge):
    """The ILP's optimum is the cheapest of every strategy combination, each priced by
    ``al.evaluate``'s pricing (the followers merged or not)."""
    wl = build_fn(steps)
    g = al.trace(wl)
    assume(len(g.ops) <= 6)
    hw = al.hardware("tpu-v4-8" if shape == (2, 2) else "tpu-v4-16")
    mesh = {"a": shape[0], "b": shape[1]}
    structure = st_mod.analyse(g, share=False, merge=merge)
    req = rq.build(structure, hw, mesh)
    options = [req.allowed(n) for n in range(len(req.nodes))]
    total = math.prod(len(o) for o in options)
    assume(total <= 20000)
    # every combination, by the request's pricing (held equal to the evaluator's below and in
    # test_request_prices_like_evaluate); the cheapest one re-priced by the evaluator itself
    arg = min(itertools.product(*options), key=lambda c: req.objective(list(c)))
    best = priced(g, hw, req, list(arg))["step_time_s"]
    assert best == pytest.approx(req.objective(list(arg)), rel=1e-9)
    sol = ilp.solve(req, time_limit_s=20)
    assert sol.status == "OPTIMAL"
    got = priced(g, hw, req, sol.choice)["step_time_s"]
    assert got == pytest.approx(best, rel=1e-6, abs=1e-15)
    assert sol.objective_s == pytest.approx(got, rel=1e-5)


# --- the request prices what the evaluator prices -------------------------------------------


# every example model (and the scanned GPT with remat) on a TPU, a GPU (whose profile prices
# the copies of a scan's residuals into and out of their stacks: ops alike but for that had
# shared one cost) and XLA:CPU (scan stacks allocated at the start, promoted collectives)
_EXAMPLES = [(m, {}) for m in ("mlp", "gpt", "moe", "t5", "my_transformer", "unet3d",
                               "stranger_lm", "tagged_mlp", "pos_table")]  # fmt: skip
_EXAMPLES += [("gpt", {"scan": True}), ("gpt", {"scan": True, "remat": "full"})]
# weights and activations of one shape: only a state tensor's collectives combine (a weight's
# copy had been priced as an activation's of its shape, or the other way, up to 13% of a step)
_EXAMPLES += [("mlp", {"batch": 64, "d_in": 64, "hidden": 64, "d_out": 64, "layers": 3})]


@pytest.mark.parametrize("hw_name", ["tpu-v4-16", "h100-8", "cpu-8"])
@pytest.mark.parametrize("model,opts", _EXAMPLES)
def test_request_prices_like_evaluate(model, opts, hw_name):
    """For random choices, the request's step time and memory equal ``price``'s, and
    ``price``'s reuse of the costs of ops alike equals pricing each op alone."""
    hw = al.hardware(hw_name)
    wl = al.load_workload(f"{MODELS}/{model}.py", target=hw, **opts)
    check_request_prices_like_price(wl, al.trace(wl), hw, choices=3, seed=1)


@pytest.mark.parametrize(
    "model,opts,hw_name",
    [("gpt", {"layers": 4, "remat": "full"}, "tpu-v4-16"), ("moe", {}, "tpu-v4-16"),
     ("gpt", {"scan": True}, "h100-8")],
)  # fmt: skip
def test_price_reuses_alike_ops_exactly(model, opts, hw_name):
    """Reusing the cost of an op alike (the layers of a stack priced once each kind) changes
    no op's cost, copies included: per op and in total, the same as pricing each op alone.
    On a GPU, an op whose result the backward scan reads from its stack is not alike to one
    whose result it does not (LLaMA-3-8B on h100-64 had been priced 3% slow)."""
    wl = al.load_workload(f"{MODELS}/{model}.py", **opts)
    g = al.trace(wl)
    hw = al.hardware(hw_name)
    req = rq.build(st_mod.analyse(g, share=True), hw, {"a": 2, "b": 4})
    rnd = random.Random(2)
    copies = 0
    for _ in range(3):
        choice = [rnd.choice(req.allowed(n)) for n in range(len(req.nodes))]
        layouts, assigns = req.layouts_of(choice), req.assigns_of(choice)
        args = (g, hw, req.machine.mesh, layouts, lambda op, groups, a=assigns: list(a[op.name]))
        fast, alone = price(*args), price(*args, reuse=False)
        assert fast["predicted"] == alone["predicted"]
        for a, b in zip(fast["costs"], alone["costs"], strict=True):
            assert a.op == b.op  # a loop boundary's cost: a copy of the loop op
            assert (a.wanted, a.produced, a.strategy, a.partial) == (
                b.wanted,
                b.produced,
                b.strategy,
                b.partial,
            )
            assert (a.flops, a.bytes, a.compute_s, a.comms) == (
                b.flops,
                b.bytes,
                b.compute_s,
                b.comms,
            )
            copies += sum(x.why == "reshard" for x in a.comms)
    assert copies > 0  # the choices made copies, so their sharing was exercised


def test_sharing_merges_repeated_layers():
    g = al.trace(al.load_workload(f"{MODELS}/gpt.py", layers=6))
    shared = st_mod.analyse(g, share=True)
    alone = st_mod.analyse(g, share=False)
    assert len(shared.leaders) < 0.5 * len(alone.leaders)
    # a shared node's members are the same op in different layers
    big = max(shared.leaders, key=len)
    prims = {shared.ops[m].primitive for m in big if m in shared.ops}
    assert len(big) >= 4 and len(prims) <= 1


# --- memory rows ----------------------------------------------------------------------------


def test_memory_limit_respected_and_optimal():
    """Under a limit between the least and the unconstrained optimum's memory, the ILP with
    lazy rows returns the cheapest combination that fits (brute force over 10,752)."""
    wl = build_fn(["matmul", "tanh"])
    g = al.trace(wl)
    hw = al.hardware("tpu-v4-8")
    req = rq.build(st_mod.analyse(g, share=False), hw, {"a": 2, "b": 2})
    options = [req.allowed(n) for n in range(len(req.nodes))]
    combos = [list(c) for c in itertools.product(*options)]
    mems = [liveness.memory_peak(req, c)[0] for c in combos]
    free = ilp.solve(req)
    limit = (min(mems) + liveness.memory_peak(req, free.choice)[0]) // 2
    assert limit < liveness.memory_peak(req, free.choice)[0]
    best = min(req.objective(c) for c, m in zip(combos, mems, strict=True) if m <= limit)
    sol, cand = rf._solve_fitting(req, limit, None, free.choice, 20, [])
    assert cand is not None and cand.memory_bytes <= limit
    assert cand.step_time_s == pytest.approx(best, rel=1e-6)


def test_ilp_time_limit_covers_building_the_model():
    """The wall-clock limit bounds the model's Python build too (seconds on 25k nodes): past
    it the solve gives up, UNKNOWN with no choice, instead of running over."""
    g = al.trace(al.load_workload(f"{MODELS}/gpt.py", layers=6, remat="full"))
    hw = al.hardware("tpu-v4-16")
    structure = st_mod.analyse(g, share=False)
    fresh = rq.build(structure, hw, {"a": 2, "b": 4})
    # CPU seconds on both sides: the wall-clock limit stops the build after at most its CPU
    # (less on a loaded machine), and a loaded machine stretches the wall time of either
    t0 = time.process_time()  # the node costs alone, part of what a build does
    for n in range(len(fresh.nodes)):
        for s in fresh.allowed(n):
            fresh.node_cost(n, s)
    costs_s = time.process_time() - t0
    req = rq.build(structure, hw, {"a": 2, "b": 4})
    t0 = time.process_time()
    sol = ilp.solve(req, time_limit_s=0.05)
    spent = time.process_time() - t0
    assert costs_s > 0.2  # the build is longer than the limit, so the limit must cut it
    assert sol.status == "UNKNOWN" and sol.choice is None
    assert spent < 0.5 * costs_s  # measured: 0.12 s against 1.4 s of node costs


def test_lower_bounds_prune_shapes_and_prove_the_plan_optimal():
    """Dims that only 2 divides: on 8 devices a 1-D mesh splits nothing, 2 x 2 x 2 splits
    all three. A shape whose lower bound (every node at its cheapest strategy) is no better
    than the best found is PRUNED, a shape whose bound is better is refined even when its
    seeds are poor (here 2x the best: 2 x 2 x 2's rules split nothing either), and the plan
    is OPTIMAL only because every other shape is solved whole or pruned."""

    def step(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    wl = al.Workload(
        step, (al.spec((1022, 2046), ("d_in", "d_out")), al.spec((1998, 1022), ("batch", "d_in")))
    )
    p = al.plan(wl, "cpu-8", time_limit_s=20, deterministic=True)
    tried = p.solver["mesh_shapes_tried"]
    assert p.status == "OPTIMAL" and p.devices == 8
    assert all(r["status"] in ("OPTIMAL", "PRUNED") for r in tried), tried
    pruned = [r for r in tried if r["status"] == "PRUNED"]
    assert pruned and all(r["lower_bound_s"] >= p.predicted["step_time_s"] for r in pruned)
    assert len(p.mesh) == 3  # 2 x 2 x 2, whose best seed was 2x the best refined before
    chosen = next(r for r in tried if r["chosen"])
    assert chosen["step_time_s"] <= min(r["step_time_s"] for r in tried) * (1 + 1e-9)
    assert p.predicted["step_time_s"] < 0.5 * max(r["step_time_s"] for r in tried)


def test_deterministic_plan_stays_near_its_work_limit():
    """The work clock counts what the search does, CP-SAT's model building and presolve
    included (its deterministic time leaves them out): GPT-3 shapes at 2 layers with 1 GiB a
    device (nothing fits, so the least-memory ILPs run) at a 10 s limit took 48 s of wall
    time when only the solver's time was counted. Held on CPU time, which a busy machine
    leaves as it is (the wall time is a benchmark's): at most twice the work charged."""
    wl = al.load_workload(
        f"{MODELS}/gpt.py", size="gpt3-175b", layers=2, remat="full", attention="naive"
    )
    c0 = time.process_time()
    p = al.plan(wl, "tpu-v4-1024", time_limit_s=10, memory_limit=2**30, remat="as_written")
    cpu = time.process_time() - c0
    assert p.status == "INFEASIBLE" and p.solver["deterministic"]
    # the search stops at its budget (half the limit); the winner's exact pricing and its
    # bound (every strategy of every node priced) come after it, inside the limit
    assert 10 * WORK_SHARE <= p.solver["work_s"] <= 10, p.solver["work_s"]
    assert cpu < 2 * p.solver["work_s"], (cpu, p.solver["work_s"], p.solver["phases_s"])


def test_infeasible_memory_reports_least():
    wl = al.load_workload(f"{MODELS}/mlp.py")
    p = al.plan(wl, "cpu-8", memory_limit=1000, time_limit_s=20, remat="as_written")
    assert p.status == "INFEASIBLE"
    need = p.solver["least_memory_bytes"]
    assert need > 1000
    assert need <= p.predicted["memory_bytes_per_device"]


def test_infeasible_plan_needs_no_more_than_the_greedy_descent_on_any_shape():
    # GPT-3 shapes, 2 layers, 1 GiB per device: no layout fits. The hand seeds rank the
    # shapes badly here (the best hand seed's shape is not where the greedy descent gets
    # least); before the sweep the plan reported 24.7 GB where 23.8 GB was reachable
    wl = al.load_workload(
        f"{MODELS}/gpt.py", size="gpt3-175b", layers=2, remat="full", attention="naive"
    )
    limit = 2**30
    p = al.plan(wl, "tpu-v4-1024", memory_limit=limit, time_limit_s=10, remat="as_written")
    assert p.status == "INFEASIBLE"
    hw = al.hardware("tpu-v4-1024")
    st = st_mod.analyse(p.graph, share=True, donated=donated_inputs(wl, p.graph))
    reached = []
    for shape in mesh_shapes(hw):
        sd = seeding.seeds(rq.build(st, hw, shape), limit, time.perf_counter() + 30)
        reached.append(min(c.memory_bytes for c in sd.values()))
    assert p.solver["least_memory_bytes"] <= min(reached)
    assert p.predicted["memory_bytes_per_device"] == p.solver["least_memory_bytes"]


# --- mesh shapes ----------------------------------------------------------------------------


def test_mesh_shapes():
    assert (12, 256) in factorisations(3072)
    assert (3072,) in factorisations(3072)
    shapes = [tuple(m.values()) for m in mesh_shapes(al.hardware("h100-3072"))]
    assert (12, 256) in shapes and (3, 4, 256) in shapes
    # an axis that would split a GPU node unevenly does not tile the cluster
    assert (3, 1024) in factorisations(3072) and (3, 1024) in shapes
    v4 = [tuple(m.values()) for m in mesh_shapes(al.hardware("tpu-v4-16"))]
    assert v4 == sorted(v4, key=lambda s: (len(s), s)) and (8,) in v4 and (2, 2, 2) in v4


def test_seed_order_puts_balanced_2d_shapes_first():
    """A short limit seeds only the first shapes: 2-D before 1-D before 3-D, balanced first,
    the smaller model (last) axis first — 32 x 16 leads on 512 chips."""
    shapes = mesh_shapes(al.hardware("tpu-v4-1024"))
    order = [tuple(shapes[i].values()) for i in pl.seed_order(shapes)]
    assert order[:2] == [(32, 16), (16, 32)]
    assert [len(s) for s in order] == sorted((len(s) for s in order), key=lambda n: (n != 2, n))
    assert order.index((512,)) < order.index((8, 8, 8))


# --- al.plan --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpt_plan():
    wl = al.load_workload(f"{MODELS}/gpt.py", batch=32)
    return wl, al.plan(wl, "tpu-v4-16", time_limit_s=30)


def test_plan_beats_hand_layouts(gpt_plan):
    from autolayout.search.baselines import standard_layouts

    wl, p = gpt_plan
    assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT")
    g = p.graph
    for name, (mesh, rules) in standard_layouts(g, 8).items():
        hand = al.evaluate(wl, "tpu-v4-16", mesh=mesh, rules=rules, graph=g)
        if hand.predicted["fits"]:
            assert p.predicted["step_time_s"] <= hand.predicted["step_time_s"] * (1 + 1e-9), name


def test_plan_records_its_search(gpt_plan):
    wl, p = gpt_plan
    s = p.solver
    assert s["objective_s"] == pytest.approx(p.predicted["step_time_s"], rel=1e-9)
    tried = s["mesh_shapes_tried"]
    assert len(tried) == len(mesh_shapes(al.hardware("tpu-v4-16")))
    assert sum(r["chosen"] for r in tried) == 1
    chosen = next(r for r in tried if r["chosen"])
    assert chosen["step_time_s"] == pytest.approx(p.predicted["step_time_s"], rel=1e-9)
    assert all("step_time_s" in r for r in tried)
    assert math.prod(p.mesh.values()) == 8
    if p.status == "OPTIMAL":  # only proven: every other shape solved whole or bounded out
        assert all(r["status"] in ("OPTIMAL", "PRUNED") for r in tried), tried


def test_plan_rules_and_exceptions_reproduce_inputs(gpt_plan):
    """The rules plus the listed exceptions give every input's layout."""
    from autolayout.cost_models import RuleSet

    wl, p = gpt_plan
    g = p.graph
    rs = RuleSet(g, p.mesh, p.rules())
    exc = {path: tuple(tuple(a) for a in lay) for path, lay in p.solver["exceptions"]}
    for i in p.inputs:
        t = g.input_tensor(i["path"])
        want = exc.get(i["path"], rs.layout(t))
        assert tuple(i["layout"]) == want, i["path"]


def test_plan_json_round_trip(gpt_plan, tmp_path):
    wl, p = gpt_plan
    path = tmp_path / "plan.json"
    p.to_json(path)
    q = al.Plan.load(path)
    assert q.mesh == p.mesh and q.rules() == p.rules() and q.status == p.status
    assert q.solver["mesh_shapes_tried"] == p.solver["mesh_shapes_tried"]


def test_fixed_mesh_and_bad_mesh():
    wl = al.load_workload(f"{MODELS}/mlp.py")
    p = al.plan(wl, "cpu-8", mesh={"data": 2, "model": 4}, time_limit_s=20)
    assert list(p.mesh.values()) == [2, 4]
    assert len(p.solver["mesh_shapes_tried"]) == 1
    with pytest.raises(al.MeshError, match="has 6 devices but cpu-8 has 8"):
        al.plan(wl, "cpu-8", mesh={"data": 2, "model": 3})


def test_plan_compiles_as_predicted():
    """The planner's layout, run through XLA on 8 CPU devices, has the predicted collectives
    (deterministic: the same plan whatever the machine's load)."""
    wl = al.load_workload(f"{MODELS}/mlp.py", batch=64)
    p = al.plan(wl, "cpu-8", mesh={"a": 2, "b": 4}, time_limit_s=20, deterministic=True)
    q = al.plan(wl, "cpu-8", mesh={"a": 2, "b": 4}, time_limit_s=20, deterministic=True)
    assert p.layouts == q.layouts and p.predicted["step_time_s"] == q.predicted["step_time_s"]
    v = al.validate(p, wl, jax.devices()[:8])
    checked = v[v["checked"]]
    assert len(checked) and checked["ok"].all(), v


def test_memory_objective_needs_no_more_memory_than_any_layout_tried():
    from autolayout.search.baselines import standard_layouts

    wl = al.load_workload(f"{MODELS}/gpt.py", batch=32)
    g = al.trace(wl)
    mem = al.plan(wl, "cpu-8", time_limit_s=4, graph=g, objective="memory")
    fast = al.plan(wl, "cpu-8", time_limit_s=4, graph=g)
    assert mem.solver["objective"] == "memory"
    m = mem.predicted["memory_bytes_per_device"]
    assert m <= fast.predicted["memory_bytes_per_device"]
    assert mem.predicted["step_time_s"] >= fast.predicted["step_time_s"] * (1 - 1e-9)
    hand = [al.evaluate(wl, "cpu-8", mesh=ms, rules=r, graph=g)
            for ms, r in standard_layouts(g, 8).values()]  # fmt: skip
    assert m <= min(h.predicted["memory_bytes_per_device"] for h in hand) * 1.0001
    with pytest.raises(ValueError, match="objective"):
        al.plan(wl, "cpu-8", graph=g, objective="speed")


def test_moe_with_many_experts_and_a_big_ffn_uses_an_experts_axis():
    """64 experts with d_ff 16384 on tpu-v4-256: expert parallelism beats tensor-parallel
    d_ff (the planner's choice before it had expert seeds: 0.043 s against 0.029 s), and the
    tokens move to the experts and back by all-to-all."""
    wl = al.load_workload(f"{MODELS}/moe.py", size="base", layers=2, d_ff=16384, attention="naive")
    p = al.plan(wl, "tpu-v4-256", time_limit_s=15)  # the expert seeds are priced first
    w1 = next(i for i in p.inputs if i["path"] == "params/layers/0/w1")
    assert w1["dims"][0] == "experts" and w1["layout"][0], w1
    assert ("experts", w1["layout"][0]) in p.rules()
    assert "all-to-all" in set(p.collectives().kind)


def test_moe_with_few_experts_and_a_small_ffn_keeps_them_whole():
    """8 experts with d_ff 1024 on tpu-v4-256: the expert-parallel seeds are priced 4-16%
    slower than FSDP on every mesh shape (the all-to-alls cost more than gathering the small
    expert weights), so the plan keeps the experts whole and moves no tokens."""
    wl = al.load_workload(
        f"{MODELS}/moe.py", size="base", layers=2, experts=8, d_ff=1024, attention="naive"
    )
    # deterministic: under load the wall-clock search once found a layout 1e-7 s faster with
    # one small all-to-all (fresh-clone CI, 2026-12-04 evening); the claim is the cost model's
    p = al.plan(wl, "tpu-v4-256", time_limit_s=10, deterministic=True)
    w1 = next(i for i in p.inputs if i["path"] == "params/layers/0/w1")
    assert w1["dims"][0] == "experts" and not w1["layout"][0], w1
    assert "all-to-all" not in set(p.collectives().kind)


def test_unet_at_batch_1_on_256_cubed_splits_space():
    """Batch 1 cannot carry a mesh and channels (32 at the full volume) are a poor one: the
    planner splits the volume's spatial dims, exchanging halos, and is no slower than the
    hand spatial layout and faster than splitting channels (Megatron's layout)."""
    wl = al.load_workload(f"{MODELS}/unet3d.py", size="256")
    p = al.plan(wl, "tpu-v4-256", time_limit_s=5)
    assert p.status in ("FEASIBLE", "TIMEOUT", "OPTIMAL")
    image = next(i for i in p.inputs if i["path"] == "batch/image")
    space = [axes for d, axes in zip(image["dims"], image["layout"], strict=True)
             if d in ("depth", "height", "width") and axes]  # fmt: skip
    assert space, image
    split = math.prod(p.mesh[a] for axes in space for a in axes)
    assert split >= 32, (image, p.mesh)
    kinds = set(p.collectives().kind)
    assert "collective-permute" in kinds
    cmp = al.compare(wl, "tpu-v4-256", auto=p).set_index("layout")
    assert cmp.loc["auto", "step_time_s"] <= cmp.loc["spatial", "step_time_s"] * (1 + 1e-9)
    assert cmp.loc["auto", "step_time_s"] < cmp.loc["megatron", "step_time_s"]


def test_timeout_means_the_budget_was_spent():
    """TIMEOUT says the search's budget ran out (work, half the limit); a search that ended
    with budget left (its rounds done, or a shape's share spent) is FEASIBLE and says why.
    (The wall-clock stop: tests/test_clock.py.)"""
    wl = al.load_workload(f"{MODELS}/my_transformer.py")
    p = al.plan(wl, "cpu-8", time_limit_s=5)
    assert p.solver["deterministic"]
    stopped = p.solver["stopped"]  # why the search ended: always said
    if p.status == "TIMEOUT":
        assert p.solver["work_s"] >= 5 * WORK_SHARE * 0.9, p.solver["work_s"]
        assert stopped.startswith("the time limit ended the search"), stopped
    elif p.status == "OPTIMAL":
        assert stopped.startswith("proven"), stopped
    else:
        assert stopped.startswith(("the search's rounds ended", "the time limit")), stopped


def test_a_plan_states_a_lower_bound_no_layout_on_its_mesh_beats():
    """plan.solver carries a lower bound on the step time over its mesh and the plan's gap to
    it; every standard layout laid on that mesh that fits prices at or above the bound."""
    from autolayout.search.baselines import layouts_on
    from conftest import load_model

    wl = load_model("mlp")
    p = al.plan(wl, "cpu-8", time_limit_s=10, deterministic=True)
    bound, gap = p.solver["lower_bound_s"], p.solver["gap"]
    assert 0 < bound <= p.predicted["step_time_s"] * (1 + 1e-9)
    assert gap == pytest.approx(max(0.0, p.predicted["step_time_s"] / bound - 1))
    g = al.trace(wl)
    priced = 0
    for name, rules in layouts_on(g, p.mesh).items():
        e = al.evaluate(wl, "cpu-8", mesh=p.mesh, rules=rules, graph=g).predicted
        if e["fits"]:
            priced += 1
            assert e["step_time_s"] >= bound * (1 - 1e-6), name
    assert priced >= 2


def test_the_search_is_no_worse_than_a_fixed_mesh():
    """Issue 23's item 5: the plan is at most 1% slower (the margin a plain standard layout
    gets over a search result with exceptions) than the plan for any mesh shape given by
    hand. At this limit every near shape is refined: before, a 2x2x2 ILP took the time of
    the 2x4 shape after it (its model cost more to build than its share), and 2x4 given by
    hand was 1.3% faster than the plan. Shapes a tighter limit leaves seeded can still hide
    a better layout (the CLI counts them; decisions.md)."""
    from conftest import load_model

    wl = load_model("gpt")
    g = al.trace(wl)
    full = al.plan(wl, "cpu-8", time_limit_s=6, deterministic=True, graph=g)
    tried = full.solver["mesh_shapes_tried"]
    assert len(tried) >= 4 and not [r for r in tried if r["status"] in ("SEEDED", "SKIPPED")]
    for r in tried:
        shape = {f"m{i}": n for i, n in enumerate(r["mesh"].values())}
        fixed = al.plan(wl, "cpu-8", mesh=shape, time_limit_s=2, deterministic=True, graph=g)
        if fixed.predicted["fits"]:
            assert full.predicted["step_time_s"] <= fixed.predicted["step_time_s"] * 1.01, shape


def test_an_axis_that_splits_nothing_is_named_replica_and_the_cli_says_why():
    """A tiny MLP on 64 GPUs: every split costs more than it saves, so the devices repeat
    the step; the axis is named for that (``replica``, once ``unused``) and the CLI says so."""
    from click.testing import CliRunner

    from autolayout._cli import main

    r = CliRunner().invoke(main, ["plan", f"{MODELS}/mlp.py", "--hw", "h100-64",
                                  "--time-limit", "3"], env={"COLUMNS": "80"})  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "mesh replica=64" in r.output and "splits nothing" in r.output, r.output
