"""What a scan's iterations share is hoisted out of it, as XLA's loop-invariant code motion
does: a stranger's ALBERT-style stack (one weight set for every layer) reads its weights
in a scan as a closure constant, through ``fori_loop``, or as a carry it hands on
unchanged. Under FSDP each weight is gathered once for the forward scan and once for the
backward one (before: once an iteration, 3x XLA:CPU's bytes at 6 layers), and the copies
live through their loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

import autolayout as al
from conftest import check_request_prices_like_price

D, F, L, B, S = 64, 256, 6, 16, 32


def _albert(form: str) -> al.Workload:
    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return {"w1": jax.random.normal(k1, (D, F)) * 0.02,
                "w2": jax.random.normal(k2, (F, D)) * 0.02,
                "out": jax.random.normal(k3, (D, 8)) * 0.02}  # fmt: skip

    def loss_fn(p, batch):
        x, y = batch

        def block(h, w1, w2):
            return h + jax.nn.gelu(h @ w1) @ w2

        if form == "closure":
            h, _ = jax.lax.scan(lambda h, _: (block(h, p["w1"], p["w2"]), None), x, None, L)
        elif form == "fori_loop":
            h = jax.lax.fori_loop(0, L, lambda i, h: block(h, p["w1"], p["w2"]), x)
        else:  # the weights carried, unchanged
            (h, _, _), _ = jax.lax.scan(
                lambda c, _: ((block(*c), c[1], c[2]), None), (x, p["w1"], p["w2"]), None, L
            )
        logits = h.mean(1) @ p["out"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def batches(rng):
        return (rng.standard_normal((B, S, D)).astype("float32"),
                rng.integers(0, 8, B).astype("int32"))  # fmt: skip

    spec = (jax.ShapeDtypeStruct((B, S, D), jnp.float32), jax.ShapeDtypeStruct((B,), jnp.int32))
    params = jax.eval_shape(init, jax.random.key(0))
    return al.train_workload(loss_fn, optax.adam(1e-3), params, spec, batches)


@pytest.mark.parametrize("form", ["closure", "fori_loop", "carry"])
def test_a_shared_weights_gathers_are_hoisted_out_of_each_scan(form):
    wl = _albert(form)
    g = al.trace(wl)
    rules = {"batch": "fsdp", "d_ff": "fsdp"}
    p = al.evaluate(wl, "cpu-8", mesh={"fsdp": 8}, rules=rules, graph=g)
    v = al.validate(p, wl).set_index("quantity")
    gathers = v.loc["all-gather"]
    assert gathers["ratio"] == pytest.approx(1, abs=0.02), v.to_string()
    assert gathers["predicted_count"] == gathers["compiled_count"] == 4, v.to_string()
    assert v.loc["memory", "ratio"] == pytest.approx(1, abs=0.2), v.to_string()
    # the body's matmuls run every layer; nothing of theirs is hoisted
    dots = [op for op in g.ops if op.primitive == "dot_general" and op.scope]
    assert dots and all(op.trip_count == L for op in dots)


def test_the_search_prices_hoisted_copies_as_price_does():
    wl = _albert("closure")
    g = al.trace(wl)
    for hw in ("cpu-8", "h100-8"):
        check_request_prices_like_price(wl, g, al.hardware(hw), choices=6, seed=3)
