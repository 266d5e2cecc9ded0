"""al.evaluate: hand-derived golden costs, the layout errors, the plan file."""

import json

import jax
import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.search.baselines import standard_layout, standard_layouts
from conftest import ROOT, load_model

BF16 = jnp.bfloat16


def mlp_workload():
    def f(x, w1, w2):
        y = jax.nn.relu(x @ w1) @ w2
        return jnp.sum(y.astype(jnp.float32))

    return al.Workload(
        f,
        (
            al.spec((64, 1024), ("batch", "d_in"), BF16),
            al.spec((1024, 4096), ("d_in", "hidden"), BF16),
            al.spec((4096, 1024), ("hidden", "d_out"), BF16),
        ),
        name="mlp2",
    )


def mlp_plan(hw: str) -> al.Plan:
    return al.evaluate(
        mlp_workload(), hw, mesh={"data": 2, "model": 4}, rules={"batch": "data", "hidden": "model"}
    )


def test_two_matmul_mlp_on_a_2x4_mesh_golden():
    # h100-8: one NVLink node, 4.5e11 B/s one way per GPU, collective efficiency 0.8, NCCL
    # step latency 1.9 us. Mesh data=2 x model=4; batch -> data, hidden -> model (Megatron MLP).
    #  h = x @ w1: x [64/2, 1024] replicated on model, w1 [1024, 4096/4]: local, no collective.
    #  y = relu(h) @ w2: hidden is contracted and split on model: y [32, 1024] bf16 is partial
    #    over model -> all-reduce of 32*1024*2 = 65536 B over 4 GPUs:
    #    2*(4-1) steps * 1.9e-6 + 2 * 65536 * 3/4 / (4.5e11 * 0.8) = 1.14e-5 + 2.7307e-7 s.
    #  sum(y): batch is split on data -> the f32 scalar (4 B) is partial over data -> all-reduce
    #    over 2 GPUs: 2*(2-1) * 1.9e-6 + 2 * 4 * 1/2 / 3.6e11 = 3.8e-6 s (+ 1.1e-11).
    p = mlp_plan("h100-8")
    c = p.collectives()
    assert list(zip(c["kind"], c["axes"], c["bytes"], strict=True)) == [
        ("all-reduce", ("model",), 65536),
        ("all-reduce", ("data",), 4),
    ]
    assert c["time_s"][0] == pytest.approx(6 * 1.9e-6 + 2 * 65536 * 0.75 / 3.6e11)
    assert c["time_s"][1] == pytest.approx(2 * 1.9e-6 + 2 * 4 * 0.5 / 3.6e11)
    s = p.summary()
    assert s["comm_s"] == pytest.approx(c["time_s"].sum())
    # FLOPs per device: both matmuls split 8 ways: 2*64*1024*4096 * 2 / 8 = 134217728, plus the
    # elementwise relu/convert/sum on local blocks: (32*1024 relu) + (32*1024)*2.
    assert s["flops_per_device"] == pytest.approx(134217728 + 32 * 1024 + 32 * 1024 * 2)
    # compute: matmul FLOPs at bf16 peak 9.89e14 * 0.8, or HBM bytes at 3.35e12 * 0.85, plus
    # 5.6 us for launching the kernel (the H200's fit, which the H100 takes)
    r = p.report().set_index("op")
    mm = r.loc["dot_general.0"]
    assert mm["compute_s"] == pytest.approx(
        max(mm["flops"] / (9.89e14 * 0.8), mm["bytes"] / (3.35e12 * 0.85)) + 5.6e-6
    )
    # step time: the overlap factor 0.5 interpolates between full and no overlap
    lo, hi = s["step_time_full_overlap_s"], s["step_time_no_overlap_s"]
    assert lo <= s["step_time_s"] <= hi
    assert s["step_time_s"] == pytest.approx(lo + 0.5 * (hi - lo))
    # memory: x 64*1024*2/2, w1 and w2 1024*4096*2/4 each, at their split sizes
    assert s["memory_by_category"]["w1"] == 1024 * 4096 * 2 // 4
    assert s["memory_by_category"]["x"] == 64 * 1024 * 2 // 2


def test_the_golden_mlp_matches_xla():
    # the same plan priced as XLA:CPU compiles it: a bf16 all-reduce is promoted to f32 there
    p = mlp_plan("cpu-8")
    v = al.validate(p).set_index("quantity")
    assert v.loc["all-reduce", "compiled"] == 2 * 65536 + 4
    assert v.loc["all-reduce", "predicted"] == 2 * 65536 + 4
    assert v["ok"].all(), v


def test_fsdp_gathers_weights_once_and_reduce_scatters_gradients_on_tpu():
    g = al.trace(load_model("gpt"))
    mesh, rules = standard_layout(g, "fsdp", 8)
    p = al.evaluate(load_model("gpt"), "tpu-v5e-8", mesh=mesh, rules=rules, graph=g)
    c = p.collectives()
    kinds = set(c["kind"])
    assert {"all-gather", "reduce-scatter"} <= kinds
    gathered = c[c["kind"] == "all-gather"]
    assert not gathered["tensor"].duplicated().any()  # one gather per weight
    # the gathered weights are a memory category of their own, and the categories add up
    by = p.predicted["memory_by_category"]
    assert by["copies"] > 0
    assert sum(by.values()) == p.predicted["memory_bytes_per_device"]
    dp = al.evaluate(load_model("gpt"), "tpu-v5e-8", mesh={"data": 8}, rules={"batch": "data"},
                     graph=g)  # fmt: skip
    assert "copies" not in dp.predicted["memory_by_category"]  # DP gathers nothing
    # on XLA:CPU a reduce-scatter is an all-reduce and a slice, and is priced so
    cpu = al.evaluate(load_model("gpt"), "cpu-8", mesh=mesh, rules=rules, graph=g)
    assert "reduce-scatter" not in set(cpu.collectives()["kind"])


def test_layouts_split_memory_and_cost_communication(gpt_graph):
    wl = load_model("gpt")
    dp = al.evaluate(wl, "tpu-v5e-8", mesh={"data": 8}, rules={"batch": "data"}, graph=gpt_graph)
    mesh, rules = standard_layout(gpt_graph, "fsdp", 8)
    fsdp = al.evaluate(wl, "tpu-v5e-8", mesh=mesh, rules=rules, graph=gpt_graph)
    a, b = dp.summary(), fsdp.summary()
    assert b["memory_by_category"]["params"] * 8 == a["memory_by_category"]["params"]
    assert b["comm_s"] > 0 and a["comm_s"] > 0
    # DP splits every matmul 8 ways; the optimizer's elementwise work stays replicated
    r = dp.report()
    mm = r[r["kind"] == "dot_general"]
    dots = sum(op.flops for op in gpt_graph.ops if op.primitive == "dot_general")
    assert (mm["flops"] * mm["trips"]).sum() == pytest.approx(dots / 8)
    assert a["flops_per_device"] > gpt_graph.total_flops / 8


def test_standard_layouts_are_named_from_dims(gpt_graph):
    lays = standard_layouts(gpt_graph, 8)
    assert lays["dp"] == ({"data": 8}, [("batch", ("data",))])
    assert lays["fsdp"][1] == [("batch", ("fsdp",)), ("d_model", ("fsdp",))]
    assert "megatron" not in lays  # tiny GPT has 4 heads: pure TP on 8 does not divide
    assert lays["megatron_fsdp"][0] == {"fsdp": 2, "tensor": 4}  # Megatron's axis: tensor
    mesh, rules = lays["megatron_sp"]  # Megatron+FSDP, the tokens' sequence on the tensor axis
    assert (mesh, rules[:-1]) == lays["megatron_fsdp"] and rules[-1] == ("seq", ("tensor",))


def test_sequence_parallel_needs_tokens_and_splits_the_saved_activations():
    """Megatron+FSDP+SP where the batch holds token ids (T5: both sequences), not on the
    MLP (no tokens); GPT-3 shapes on 512 chips: with the sequence split on the model axis
    the activations outside attention and the MLP are split 16 ways more, so the step needs
    less than half the activation memory of Megatron+FSDP alone, and less memory."""
    from autolayout.search.baselines import seq_dims

    assert seq_dims(al.trace(load_model("t5"))) == ["enc_seq", "dec_seq"]
    mlp = al.trace(load_model("mlp"))
    assert seq_dims(mlp) == [] and "megatron_sp" not in standard_layouts(mlp, 8)
    with pytest.raises(al.RuleError, match="sequence"):
        standard_layout(mlp, "megatron_sp", 8)
    wl = load_model("gpt", size="gpt3-175b", layers=2, remat="full", attention="naive")
    g = al.trace(wl)
    mesh = {"fsdp": 32, "tensor": 16}
    mem = {}
    for name in ("megatron_fsdp", "megatron_sp"):
        rules = standard_layout(g, name, 512)[1]
        p = al.evaluate(wl, "tpu-v4-1024", mesh=mesh, rules=rules, graph=g)
        mem[name] = p.predicted
    sp, mf = (mem[k]["memory_by_category"]["activations"] for k in ("megatron_sp", "megatron_fsdp"))
    assert sp < mf / 2, mem
    sp, mf = (mem[k]["memory_bytes_per_device"] for k in ("megatron_sp", "megatron_fsdp"))
    assert sp < mf, mem


def test_remat_adds_recompute_flops_but_model_flops_stay():
    # priced on a GPU, whose compiler keeps remat barriers (XLA:CPU runs the recomputation in
    # the forward pass: cpu.toml remat_barriers = false)
    opts = dict(layers=8, vocab=64, batch=64, target="h100-8")  # activations set the peak
    none = al.evaluate(
        load_model("gpt", **opts), "h100-8", mesh={"data": 8}, rules={"batch": "data"}
    )
    full = al.evaluate(
        load_model("gpt", remat="full", **opts), "h100-8", mesh={"data": 8}, rules={"batch": "data"}
    )
    a, b = none.summary(), full.summary()
    assert b["flops_per_device"] > a["flops_per_device"] * 1.2
    assert b["model_flops"] == pytest.approx(a["model_flops"], rel=0.01)
    assert b["mfu"] < b["hfu"]
    assert b["memory_by_category"]["activations"] < a["memory_by_category"]["activations"] / 2


# --- errors -----------------------------------------------------------------------------------


def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_a_rule_for_an_unknown_dim_is_an_error(gpt_graph):
    with pytest.raises(al.RuleError) as e:
        al.evaluate(
            load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={"btach": "data"}, graph=gpt_graph
        )
    msg = _one_line(e)
    assert "'btach'" in msg and "'batch'" in msg  # names it, suggests the right one


def test_a_rule_for_an_unknown_mesh_axis_is_an_error(gpt_graph):
    with pytest.raises(al.RuleError) as e:
        al.evaluate(
            load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={"batch": "dta"}, graph=gpt_graph
        )
    assert "'dta'" in _one_line(e) and "data" in str(e.value)


def test_a_mesh_that_is_not_the_device_count_is_an_error(gpt_graph):
    with pytest.raises(al.MeshError) as e:
        al.evaluate(load_model("gpt"), "cpu-8", mesh={"data": 2, "model": 2}, graph=gpt_graph)
    msg = _one_line(e)
    assert "4 devices" in msg and "cpu-8 has 8" in msg


def test_a_layout_that_does_not_divide_is_an_error(gpt_graph):
    # tiny GPT has 4 heads; a model axis of 8 does not divide them
    with pytest.raises(al.RuleError) as e:
        al.evaluate(
            load_model("gpt"), "cpu-8", mesh={"model": 8}, rules={"heads": "model"}, graph=gpt_graph
        )
    msg = _one_line(e)
    assert "'heads'" in msg and "size 4" in msg and "model = 8" in msg


def test_a_rule_for_a_dim_no_input_carries_is_an_error(gpt_graph):
    inner = next(d for d in gpt_graph.dims if d.startswith("seq#"))
    with pytest.raises(al.RuleError, match="no input carries it"):
        al.evaluate(
            load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={inner: "data"}, graph=gpt_graph
        )


def test_conv_halos_golden():
    """Halo planes per side of one block (hand-counted, as XLA's compiled permutes show)."""
    from autolayout.cost_models.sharding import halo

    # 3-tap "SAME" conv, 16 planes over 4 devices: one plane from each neighbour
    h = halo(16, 16, 3, 1, 1, 1, 1, 4)
    assert (h.left, h.right) == (1, 1)
    assert (h.pairs, h.local_pairs) == (16 * 3 - 2, 4 * 3)  # edges' padding taps computed
    # stride 2 (16 -> 8, padding (0, 1)): output block j reads input [8j, 8j + 8]: the right
    h = halo(16, 8, 3, 2, 1, 0, 1, 4)
    assert (h.left, h.right) == (0, 1)
    # transposed (8 -> 16: input dilated by 2, padding (2, 1)): one plane from the left
    h = halo(8, 16, 3, 1, 1, 2, 2, 4)
    assert (h.left, h.right) == (1, 0)
    # a window wider than the block reaches past the neighbours: no halo exchange
    assert halo(16, 16, 11, 1, 1, 5, 1, 8) is None
    assert halo(16, 16, 3, 1, 1, 1, 1, 3) is None  # 3 does not divide 16


def test_gathering_two_split_axes_is_one_all_gather_per_axis_last_first():
    """XLA's partitioner gathers [16, 16, 16] split a=4 x b=2 as b (to 4096 B) then a (to
    16384 B) — measured on XLA:CPU; moving two mesh axes between the same tensor axes is one
    all-to-all."""
    from autolayout.core import Tensor
    from autolayout.cost_models.sharding import Machine, reshard

    m = Machine(al.hardware("cpu-8"), {"a": 4, "b": 2})
    t = Tensor("x", (16, 16, 16), "float32", (None, None, None))
    got = [(c.kind, c.axes, c.bytes) for c in reshard(m, t, (("a",), ("b",), ()), ((), (), ()))]
    assert got == [("all-gather", ("b",), 4096), ("all-gather", ("a",), 16384)]
    got = [
        (c.kind, c.axes, c.bytes) for c in reshard(m, t, (("a", "b"), (), ()), ((), ("a", "b"), ()))
    ]
    assert got == [("all-to-all", ("a", "b"), 2048)]


# --- the plan file ----------------------------------------------------------------------------


def test_plan_round_trips_through_json(tmp_path, gpt_graph):
    p = al.evaluate(
        load_model("gpt"),
        "cpu-8",
        mesh={"data": 2, "model": 4},
        rules={"batch": "data", "heads": "model", "d_ff": "model"},
        graph=gpt_graph,
    )
    f = tmp_path / "plan.json"
    p.to_json(f)
    d = json.loads(f.read_text())
    assert d["version"] == 1 and d["mesh"] == {"axes": {"data": 2, "model": 4}, "devices": 8}
    assert d["rules"] == [["batch", ["data"]], ["heads", ["model"]], ["d_ff", ["model"]]]
    q = al.Plan.load(f)
    assert q.summary() == p.summary()
    assert q.rules() == p.rules()
    assert q.layouts == p.layouts
    assert q.collectives().equals(p.collectives())
    spec = p.partition_specs()[0]["layers"][0]["wq"]
    assert spec == jax.sharding.PartitionSpec(None, "model", None)


def test_bad_plan_files_are_refused(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text("{not json")
    with pytest.raises(al.PlanError, match="not JSON"):
        al.Plan.load(f)
    f.write_text(json.dumps({"version": 99}))
    with pytest.raises(al.PlanError, match="version 99"):
        al.Plan.load(f)
    f.write_text(json.dumps({"version": 1, "status": "EVALUATED"}))
    with pytest.raises(al.PlanError, match="corrupted"):
        al.Plan.load(f)


def test_a_step_that_splits_and_merges_axes_by_reshape_is_priced_as_xla_compiles():
    """[batch, 64] -> [batch, 4, 16] and back: a reshape's merged or split axes are one group
    on the major axis (this raised a TypeError before: no example model reshapes so)."""

    def step(w, x):
        def loss(w):
            y = (x @ w).reshape(x.shape[0], 4, 16)
            z = jnp.tanh(y).reshape(x.shape[0], 64)
            return jnp.sum(z * z)

        return jax.grad(loss)(w)

    wl = al.Workload(
        step, (al.spec((32, 64), ("d_in", "d_out")), al.spec((8, 32), ("batch", "d_in")))
    )
    g = al.trace(wl)
    assert any(op.primitive == "reshape" and len(op.param("groups")[1][1]) == 2 for op in g.ops)
    for mesh, rules in (({"data": 8}, {"batch": "data"}),
                        ({"data": 2, "model": 4}, {"batch": "data", "d_out": "model"})):  # fmt: skip
        v = al.validate(al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g))
        assert v.loc[v["checked"], "ok"].all(), v


def test_a_position_table_gets_one_rule_under_sequence_parallelism():
    """FSDP of an unnamed model picks weight dims by size, a position table's ``seq`` among
    them; sequence parallelism puts ``seq`` on the model axis: one rule per dim (SP's), and
    every standard layout prices (it used to fail with 'two rules for dim')."""
    wl = al.load_workload(ROOT / "experiments/models/pos_table.py")
    g = al.trace(wl)
    layouts = standard_layouts(g, 8)
    assert "megatron_sp" in layouts
    for name, (mesh, rules) in layouts.items():
        dims = [d for d, _ in rules]
        assert len(dims) == len(set(dims)), (name, rules)
        al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g)
    mesh, rules = layouts["megatron_sp"]
    seq = next(d for d, _ in rules[::-1])  # SP's rule comes last
    assert dict(rules)[seq] == ("tensor",)
