"""A mixture of experts in plain JAX that dispatches by sorting (no dim named): grouped-query
attention through ``jax.nn.dot_product_attention``, a top-k over the router's softmax, the
flattened choices ``argsort``-ed by expert, the tokens' rows gathered in that order, then
either ``lax.ragged_dot`` over the experts' stacked weights with ``bincount`` group sizes
(MaxText's megablox path; ``dispatch=ragged``) or a dense loop over the experts, each row
masked to its own (``dispatch=dense``, with ``take_along_axis`` and ``segment_sum``); the
rows scatter-added back to their tokens.

    autolayout plan experiments/models/corpus/moe_sorted.py --hw cpu-8 --time-limit 10
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

# fmt: off
SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=128, experts=4, top_k=2,
                 vocab=512, seq=32, batch=16),
}
# fmt: on


def rms(x: jax.Array, g: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g


def attention(x: jax.Array, p: dict, heads: int, kv_heads: int) -> jax.Array:
    b, s, d = x.shape
    q = (x @ p["wq"]).reshape(b, s, heads, d // heads)
    k = (x @ p["wk"]).reshape(b, s, kv_heads, d // heads)
    v = (x @ p["wv"]).reshape(b, s, kv_heads, d // heads)
    o = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return o.reshape(b, s, d) @ p["wo"]


def moe(x: jax.Array, p: dict, k: int, dispatch: str) -> jax.Array:
    b, s, d = x.shape
    e = p["router"].shape[-1]
    t = x.reshape(-1, d)
    gates, idx = jax.lax.top_k(jax.nn.softmax(t @ p["router"]), k)  # [tokens, k]
    flat = idx.reshape(-1)
    order = jnp.argsort(flat)
    if dispatch == "ragged":
        tok = jnp.repeat(jnp.arange(t.shape[0]), k)[order]
        sizes = jnp.bincount(flat, length=e).astype(jnp.int32)
        h = jax.nn.silu(jax.lax.ragged_dot(t[tok], p["w_in"], sizes))
        y = jax.lax.ragged_dot(h, p["w_out"], sizes) * gates.reshape(-1)[order][:, None]
        return jnp.zeros_like(t).at[tok].add(y).reshape(b, s, d)
    tok = order // k
    xs = jnp.take(t, tok, axis=0)
    mine = jnp.take_along_axis(flat, order, 0)
    y = 0.0
    for i in range(e):
        h = jax.nn.silu(xs @ p["w_in"][i]) * (mine == i)[:, None]
        y = y + h @ p["w_out"][i]
    y = y * jnp.take_along_axis(gates.reshape(-1), order, 0)[:, None]
    return jax.ops.segment_sum(y, tok, num_segments=t.shape[0]).reshape(b, s, d)


def workload(size: str = "tiny", dispatch: str = "ragged", **overrides) -> al.Workload:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    if dispatch not in ("ragged", "dense"):
        raise ValueError(f"unknown dispatch {dispatch!r}; known: ragged, dense")
    c = dict(SIZES[size])
    for key, v in overrides.items():
        if key not in c:
            raise ValueError(f"unknown option {key!r}; known: size, dispatch, {', '.join(c)}")
        c[key] = int(v)
    L, d, h, kv, f = c["layers"], c["d_model"], c["heads"], c["kv_heads"], c["d_ff"]
    E, k, V, S, B = c["experts"], c["top_k"], c["vocab"], c["seq"], c["batch"]

    def sd(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    layer = {
        "wq": sd(d, d), "wk": sd(d, d * kv // h), "wv": sd(d, d * kv // h), "wo": sd(d, d),
        "router": sd(d, E), "w_in": sd(E, d, f), "w_out": sd(E, f, d), "g1": sd(d), "g2": sd(d),
    }  # fmt: skip
    params = {"emb": sd(V, d), "out": sd(d, V), "blocks": [layer] * L}

    def loss_fn(p, batch):
        x = p["emb"][batch["tokens"]]
        for blk in p["blocks"]:
            x = x + attention(rms(x, blk["g1"]), blk, h, kv)
            x = x + moe(rms(x, blk["g2"]), blk, k, dispatch)
        logits = x @ p["out"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    def make_batch(rng: np.random.Generator):
        t = rng.integers(0, V, (B, S + 1)).astype(np.int32)
        return {"tokens": t[:, :-1], "labels": t[:, 1:]}

    data = {k_: jax.ShapeDtypeStruct((B, S), jnp.int32) for k_ in ("tokens", "labels")}
    return al.train_workload(loss_fn, optax.adam(1e-3), params, data, make_batch,
                             name=f"moe-sorted-{dispatch}",
                             options=dict(size=size, dispatch=dispatch, **overrides))  # fmt: skip
