"""cuDNN flash attention (``jax.nn.dot_product_attention(implementation="cudnn")``) as the
planner sees it: traced on a machine without cuDNN, one fused kernel forward and one
backward, split over batch and heads only, priced at the profile's attention efficiency,
and refused in one line where it cannot run."""

import math

import jax
import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.core import ATTENTION_BWD, ATTENTION_FWD
from autolayout.cost_models import kernel_notes, op_time

B, T, N, K, H, D = 4, 128, 8, 2, 32, 256


def _step(impl):
    def step(wq, wk, wv, x):
        def loss(wq, wk, wv):
            q = jnp.einsum("btd,dnh->btnh", x, wq)
            k = jnp.einsum("btd,dnh->btnh", x, wk)
            v = jnp.einsum("btd,dnh->btnh", x, wv)
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
            return jnp.sum(o.astype(jnp.float32) ** 2)

        return jax.grad(loss, argnums=(0, 1, 2))(wq, wk, wv)

    bf = jnp.bfloat16
    args = (al.spec((D, N, H), ("d_model", "heads", "head_dim"), bf),
            al.spec((D, K, H), ("d_model", "kv_heads", "head_dim"), bf),
            al.spec((D, K, H), ("d_model", "kv_heads", "head_dim"), bf),
            al.spec((B, T, D), ("batch", "seq", "d_model"), bf))  # fmt: skip
    return al.Workload(step, args, name=f"attention-{impl}")


def _kernels(g):
    return [op for op in g.ops if op.primitive in ATTENTION_FWD + ATTENTION_BWD]


def _splits(plan, op):
    row = next(r for r in plan.ops if r["op"] == op.name)
    return dict(kv.split(":") for kv in row["strategy"].split(",") if kv)


def test_cudnn_attention_traces_here_as_two_fused_kernels():
    g = al.trace(_step("cudnn"))
    fwd, bwd = _kernels(g)
    assert (fwd.param("phase"), bwd.param("phase")) == ("fwd", "bwd")
    assert fwd.param("causal") and not g.opaque
    # a causal kernel skips the masked half: 4 B N T (T+1)/2 H forward, 2.5x that backward
    assert fwd.flops == pytest.approx(4 * B * N * T * (T + 1) / 2 * H)
    assert bwd.flops == pytest.approx(2.5 * fwd.flops)
    # no [B, N, T, T] scores anywhere in the step
    assert not any(math.prod(t.shape) >= B * N * T * T for t in g.tensors.values())


def test_xla_attention_stays_its_ops():
    g = al.trace(_step(None))
    assert not _kernels(g)
    assert any(math.prod(t.shape) >= B * N * T * T for t in g.tensors.values())


def test_only_batch_and_heads_split_and_kv_heads_follow_the_query_heads():
    g = al.trace(_step("cudnn"))
    p = al.evaluate(_step("cudnn"), "h200-4", mesh={"data": 2, "model": 2},
                    rules={"batch": "data", "heads": "model", "kv_heads": "model"},
                    graph=g)  # fmt: skip
    for op in _kernels(g):
        assert _splits(p, op) == {"batch": "data", "heads": "model"}
    # splitting the sequence is not what cuDNN's partitioning allows: the kernel reads it whole
    p2 = al.evaluate(_step("cudnn"), "h200-4", mesh={"seq": 4}, rules={"seq": "seq"}, graph=g)
    for op in _kernels(g):
        assert _splits(p2, op) == {}


def test_fused_kernel_time_is_the_profiles_attention_rate():
    hw = al.hardware("h200-1")
    e = hw.efficiency
    f = 1e12
    got = op_time(hw, ATTENTION_FWD[0], f, 0.0, "bfloat16") + op_time(
        hw, ATTENTION_BWD[0], 2.5 * f, 0.0, "bfloat16"
    )
    assert got == pytest.approx(3.5 * f / (9.89e14 * e.attention) + e.attention_call_s)


def test_notes_say_what_a_tpu_plan_assumes():
    g = al.trace(_step("cudnn"))
    assert kernel_notes(g, al.hardware("h200-8")) == []
    (note,) = kernel_notes(g, al.hardware("tpu-v5p-16"))
    assert "only on NVIDIA GPUs" in note and "Pallas" in note


def test_cudnn_attention_runs_on_cpu_devices_as_jaxs_own_composition():
    """A step built for GPUs is laid out and run on CPU devices: its cuDNN attention runs as
    jax.nn.dot_product_attention(implementation="xla") in its place, so the laid-out step's
    gradients are the XLA-attention step's, computed unsharded; apply says so."""
    wl = _step("cudnn")
    p = al.evaluate(wl, "cpu-4", mesh={"data": 2, "model": 2},
                    rules={"batch": "data", "kv_heads": "model"})  # fmt: skip
    keys = jax.random.split(jax.random.key(0), 4)
    args = [jax.random.normal(k, a.shape, jnp.float32).astype(a.dtype) / 4
            for k, a in zip(keys, wl.args, strict=True)]  # fmt: skip
    f = al.apply(p, wl.fn, jax.devices()[:4])
    assert len(f.notes) == 1 and "JAX's own composition" in f.notes[0]
    got = f(*args)
    want = jax.jit(_step("xla").fn)(*args)
    for g, w in zip(got, want, strict=True):
        g, w = g.astype(jnp.float32), w.astype(jnp.float32)
        assert float(jnp.max(jnp.abs(g - w))) <= 0.02 * float(jnp.max(jnp.abs(w))) + 1e-3

    def forward(impl):  # inference: cuDNN's forward alone (no log-sum-exp kept)
        def f(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)

        return f

    q = jax.random.normal(keys[0], (B, T, N, H), jnp.bfloat16)
    kv = jax.random.normal(keys[1], (B, T, K, H), jnp.bfloat16)
    dims = ("batch", "seq", "heads", "head_dim"), ("batch", "seq", "kv_heads", "head_dim")
    specs = [
        al.spec(x.shape, d, x.dtype) for x, d in zip((q, kv, kv), (*dims, dims[1]), strict=True)
    ]
    fwd = al.Workload(forward("cudnn"), specs)
    p = al.evaluate(fwd, "cpu-4", mesh={"data": 4}, rules={"batch": "data"})
    got = al.apply(p, fwd.fn, jax.devices()[:4])(q, kv, kv).astype(jnp.float32)
    want = jax.jit(forward("xla"))(q, kv, kv).astype(jnp.float32)
    assert float(jnp.max(jnp.abs(got - want))) <= 0.02 * float(jnp.max(jnp.abs(want)))


def test_cudnn_attention_with_a_bias_is_refused_on_cpu_in_one_line():
    """The composition stands in for the masks JAX's own attention takes (none, causal);
    a bias is refused where the step runs, naming it."""

    def step(q, k, v, b):
        f = lambda q: jax.nn.dot_product_attention(q, k, v, bias=b, implementation="cudnn")  # noqa: E731
        return jax.grad(lambda q: f(q).astype(jnp.float32).sum())(q)

    x = al.spec((4, 128, 4, 64), ("batch", "seq", "heads", "head_dim"), jnp.bfloat16)
    b = al.spec((4, 4, 128, 128), ("batch", "heads", "seq", "keys"), jnp.bfloat16)
    wl = al.Workload(step, (x, x, x, b))
    p = al.evaluate(wl, "cpu-4", mesh={"data": 4}, rules={"batch": "data"})
    f = al.apply(p, wl.fn, jax.devices()[:4])
    with pytest.raises(al.PlanError, match="runs only on NVIDIA GPUs.*its bias"):
        f.lower(*wl.args)


def test_llama_with_cudnn_attention_needs_far_less_memory_than_naive_attention():
    """The gap the kernel makes: the same Llama block, scores materialised or not."""
    hw = al.hardware("h200-1")

    def memory(attention):
        wl = al.load_workload("experiments/models/gpt.py", size="llama-tiny", scan=True,
                              dtype="bfloat16", seq=512, batch=8, attention=attention)  # fmt: skip
        return al.evaluate(wl, hw, mesh={"data": 1}, rules={}).predicted["memory_bytes_per_device"]

    assert memory("cudnn") < 0.5 * memory("naive")


def test_a_pallas_kernel_is_priced_from_its_cost_estimate_and_kept_whole():
    """The TPU flash attention of jax.experimental.pallas: its forward kernel carries a cost
    estimate (priced from it), its backward kernels none (opaque, said why); XLA cannot
    partition a custom call, so none is split."""
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

    def step(q, k, v):
        def f(q, k, v):
            return pallas_flash.flash_attention(q, k, v, causal=True).astype(jnp.float32).sum()

        return jax.grad(f, argnums=(0, 1, 2))(q, k, v)

    x = jax.ShapeDtypeStruct((2, 8, 512, 64), jnp.bfloat16)
    wl = al.Workload(step, (x, x, x))
    g = al.trace(wl)
    kernels = [op for op in g.ops if op.primitive == "pallas_call"]
    priced = [op for op in kernels if not op.opaque]
    assert len(priced) == 1 and priced[0].flops > 4 * 2 * 8 * 512 * 256 * 64  # > the causal half
    assert all("cost_estimate" in op.param("reason") for op in kernels if op.opaque)
    p = al.evaluate(wl, "tpu-v5p-8", mesh={"data": 4}, rules={})
    rows = [r for r in p.ops if r["kind"] == "pallas_call"]
    assert all(r["strategy"] == "" for r in rows)
    fwd = next(r for r in rows if r["op"] == priced[0].name)
    assert fwd["bytes"] == priced[0].param("bytes_accessed") and fwd["compute_s"] > 0


def test_the_example_transformers_run_the_fused_kernel_on_the_hardware_they_are_built_for():
    """attention="auto" (the default): the fused kernel when the step is built for a GPU
    (cuDNN's) or TPU (splash) in 16 bits (`al.load_workload(..., target=)`, what `autolayout plan --hw` passes),
    the materialised scores on a CPU or in float32; the options record the resolved kind;
    a step built for one kind of chip and priced on another is said in one line."""
    from conftest import MODELS

    def built(model, target=None, **options):
        return al.load_workload(MODELS / f"{model}.py", target=target, dtype="bfloat16",
                                **options)  # fmt: skip

    for model in ("gpt", "moe", "t5"):
        wl = built(model, "h100-8")
        assert wl.options["attention"] == "cudnn" and wl.loaded_for == "gpu"
        assert _kernels(al.trace(wl)), model
        assert built(model, "tpu-v4-8").options["attention"] == "splash"
        assert built(model, "cpu").options["attention"] == "naive"
    assert al.target() == "cpu"  # this machine's devices, outside a load
    f32 = al.load_workload(MODELS / "gpt.py", target="h100-8", dtype="float32")
    assert f32.options["attention"] == "naive"  # cuDNN takes no float32
    wl = built("gpt", "cpu")
    with pytest.warns(UserWarning, match="built for cpu devices.*priced on gpu.*target="):
        al.evaluate(wl, "h100-8", mesh={"data": 8}, rules={"batch": "data"})
    with pytest.raises(al.WorkloadError, match="target must be"):
        al.load_workload(MODELS / "gpt.py", target=8)
