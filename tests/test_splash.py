"""Splash attention (``al.splash_attention``), the TPU's Pallas kernel, as a step traces,
prices and runs it (issue 35.4): the same function as ``jax.nn.dot_product_attention``
(values and gradients; grouped-query heads; sequences not a multiple of the kernel's 128
lanes), two kernels a plan splits on batch and heads only, priced as fused attention with
no word of cuDNN, and run by ``al.apply`` under ``shard_map`` on 8 CPU devices (Pallas'
interpreter) with the losses of the unsharded step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.core import SPLASH_BWD, SPLASH_FWD
from autolayout.cost_models.compute import kernel_notes
from autolayout.runtime.run import reference_losses, run
from conftest import MODELS


@pytest.mark.parametrize(
    "b, t, s, n, k, causal",
    [(2, 128, 128, 4, 4, True), (1, 256, 256, 4, 2, False), (2, 40, 40, 2, 1, True),
     (1, 24, 200, 2, 2, False)],
)  # fmt: skip
def test_splash_attention_is_jaxs_attention_values_and_gradients(b, t, s, n, k, causal):
    if causal and t != s:
        pytest.skip("causal attention of two lengths")
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (b, t, n, 16), jnp.float32)
    kv = [jax.random.normal(keys[i], (b, s, k, 16), jnp.float32) for i in (1, 2)]
    do = jax.random.normal(keys[3], (b, t, n, 16), jnp.float32)

    def loss(f):
        return lambda q, k, v: (f(q, k, v, is_causal=causal) * do).sum()

    got, g_got = jax.value_and_grad(loss(al.splash_attention), argnums=(0, 1, 2))(q, *kv)
    want, g_want = jax.value_and_grad(loss(jax.nn.dot_product_attention), argnums=(0, 1, 2))(q, *kv)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    for x, y in zip(g_got, g_want, strict=True):
        assert float(jnp.abs(x - y).max()) < 1e-4 * float(jnp.abs(y).max())


def test_splash_attention_under_vmap_is_jaxs_attention():
    """A user's vmapped attention (an extra leading axis, k and v shared across it)."""
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q = jax.random.normal(keys[0], (3, 2, 32, 2, 16), jnp.float32)
    k, v = (jax.random.normal(keys[i], (2, 32, 1, 16), jnp.float32) for i in (1, 2))

    def loss(f):
        inner = jax.vmap(lambda q: f(q, k, v, is_causal=True))
        return lambda q: (inner(q) ** 2).sum()

    got, g_got = jax.value_and_grad(loss(al.splash_attention))(q)
    want, g_want = jax.value_and_grad(loss(jax.nn.dot_product_attention))(q)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert float(jnp.abs(g_got - g_want).max()) < 1e-4 * float(jnp.abs(g_want).max())


def test_splash_attention_refuses_unlike_heads_in_one_line():
    q = jnp.zeros((1, 128, 3, 16))
    kv = jnp.zeros((1, 128, 2, 16))
    with pytest.raises(ValueError, match="must divide q heads"):
        al.splash_attention(q, kv, kv)


def _gpt(target: str, **options) -> al.Workload:
    return al.load_workload(MODELS / "gpt.py", target=target, dtype="bfloat16", **options)


def test_the_example_transformers_built_for_a_tpu_call_splash_and_say_nothing_of_cudnn():
    """What the README's main job plans: the step built for a TPU calls the TPU's kernel
    (one forward, one backward per layer loop), split on batch and heads only, priced as
    fused attention (the cuDNN pair's FLOPs); no note speaks of cuDNN there."""
    for model in ("gpt", "moe", "t5"):
        wl = al.load_workload(MODELS / f"{model}.py", target="tpu-v4-8", dtype="bfloat16")
        assert wl.options["attention"] == "splash", model
    wl = _gpt("tpu-v4-8", scan=True)
    g = al.trace(wl)
    ops = [op for op in g.ops if op.primitive in SPLASH_FWD + SPLASH_BWD]
    assert {op.primitive for op in ops} == {*SPLASH_FWD, *SPLASH_BWD}
    assert {op.param("kernel") for op in ops} == {"splash"}
    assert not any("dot_product_attention" in op.primitive for op in g.ops)
    cudnn = al.trace(_gpt("tpu-v4-8", scan=True, attention="cudnn"))
    flops = sorted(op.flops for op in ops)
    assert flops == sorted(op.flops for op in cudnn.ops if "dot_product_attention" in op.primitive)
    hw = al.hardware("tpu-v4-256")
    notes = kernel_notes(g, hw)
    assert notes and not any("cuDNN" in n for n in notes), notes
    assert "cuDNN" in " ".join(kernel_notes(cudnn, hw))  # the stand-in a TPU runs not
    assert any("runs only on TPUs" in n for n in kernel_notes(g, al.hardware("h100-8")))
    p = al.evaluate(wl, "tpu-v4-8", mesh={"data": 2, "model": 2},
                    rules={"batch": "data", "heads": "model"}, graph=g)  # fmt: skip
    rows = [r for r in p.ops if r["kind"] in SPLASH_FWD + SPLASH_BWD]
    assert rows and all(r["compute_s"] > 0 for r in rows)


def test_a_plan_with_splash_attention_runs_on_cpu_devices_as_the_unsharded_step():
    """Planned for a TPU with batch and heads split (data=2 x model=4: every kernel call on a
    quarter of the heads of half the batch), run by al.apply on 8 CPU devices through
    Pallas' interpreter: two steps' losses equal the unsharded step's, the collectives
    XLA compiles are the plan's (the calls on their shards add none); the note says what
    ran in the kernel's place."""
    wl = _gpt("tpu-v4-16", attention="splash", heads=4, seq=32, layers=1)
    p = al.evaluate(wl, "tpu-v4-16", mesh={"data": 2, "model": 4},
                    rules={"batch": "data", "heads": "model"})  # fmt: skip
    fwd = next(r for r in p.ops if r["kind"] in SPLASH_FWD)
    assert "model" in fwd["strategy"] and "data" in fwd["strategy"], fwd["strategy"]
    step = al.apply(p, wl.fn, workload=wl)
    assert any("Pallas' interpreter" in n for n in step.notes)
    got = run(p, wl, steps=2).losses
    assert got == pytest.approx(reference_losses(wl, steps=2), rel=1e-4)
    rows = al.validate(p, wl).set_index("quantity")  # no collective the plan does not price
    assert rows.loc["all-reduce", "ok"] and rows.loc[rows["checked"], "ok"].all(), rows


@pytest.mark.parametrize("kernel", ["splash", "cudnn"])
def test_a_model_calling_a_fused_kernel_is_named_from_its_operands(kernel):
    """No scores dot, no softmax to find the heads by: a fused kernel's operands show them
    (q [batch, seq, heads, head_dim], k and v [batch, seq, kv_heads, head_dim])."""
    d, n, kv, h = 64, 4, 2, 16

    def attend(q, k, v):
        if kernel == "splash":
            return al.splash_attention(q, k, v, is_causal=True)
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")

    def loss(p, x):
        b, s, _ = x.shape
        q = (x @ p["wq"]).reshape(b, s, n, h)
        k = (x @ p["wk"]).reshape(b, s, kv, h)
        v = (x @ p["wv"]).reshape(b, s, kv, h)
        return (attend(q, k, v).reshape(b, s, n * h) @ p["wo"]).astype(jnp.float32).mean()

    bf = jnp.bfloat16
    params = {"wq": jax.ShapeDtypeStruct((d, n * h), bf), "wk": jax.ShapeDtypeStruct((d, kv * h), bf),
              "wv": jax.ShapeDtypeStruct((d, kv * h), bf), "wo": jax.ShapeDtypeStruct((n * h, d), bf)}  # fmt: skip
    x = jax.ShapeDtypeStruct((8, 128, d), bf)
    g = al.trace(al.Workload(jax.grad(loss), (params, x)))
    assert {"batch", "seq", "heads", "kv_heads", "head_dim"} <= set(g.dims), list(g.dims)
    assert g.dims["heads"] == n and g.dims["kv_heads"] == kv
