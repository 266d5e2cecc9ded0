"""A Mixtral-style decoder in plain JAX, written the way its users write it (no dim named):
grouped-query attention with rotary embeddings built by ``jnp.stack`` over interleaved
pairs (the ``stack``/``unstack`` primitives), RMSNorm, and a top-2 mixture of SwiGLU experts
that dispatches tokens into per-expert buffers with one-hot einsums. Mixtral-8x7B's shapes
at ``size=mixtral``.

    autolayout plan experiments/models/corpus/moe_rotary.py --set size=mixtral --hw h100-64
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

# fmt: off
SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, head_dim=16, d_ff=128, experts=4,
                 vocab=256, seq=16, batch=8),
    "mixtral": dict(layers=32, d_model=4096, heads=32, kv_heads=8, head_dim=128, d_ff=14336,
                    experts=8, vocab=32000, seq=4096, batch=256),
}
# fmt: on


def rotary(x: jax.Array, theta: float = 1e6) -> jax.Array:
    """Rotates each interleaved pair of ``x [batch, seq, heads, head_dim]`` by its position."""
    b, s, h, d = x.shape
    freqs = 1.0 / theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    ang = jnp.arange(s, dtype=jnp.float32)[:, None] * freqs[None]
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = x[..., ::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(b, s, h, d).astype(x.dtype)


def rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    v = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
    return (x * jax.lax.rsqrt(v + 1e-5)).astype(x.dtype) * w


def attention(x: jax.Array, p: dict, heads: int, kv_heads: int) -> jax.Array:
    b, s, _ = x.shape
    q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    q, k = rotary(q), rotary(k)
    q = q.reshape(b, s, kv_heads, heads // kv_heads, -1)
    scores = jnp.einsum("bsgrk,btgk->bgrst", q, k) / math.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(mask, scores.astype(jnp.float32), -1e9), axis=-1)
    o = jnp.einsum("bgrst,btgk->bsgrk", probs.astype(v.dtype), v).reshape(b, s, heads, -1)
    return jnp.einsum("bshk,hkd->bsd", o, p["wo"])


def experts(x: jax.Array, p: dict, capacity: int) -> jax.Array:
    """Top-2 routing into ``capacity`` slots per expert (Mesh-TF's one-hot dispatch)."""
    e = p["router"].shape[-1]
    probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", x, p["router"]).astype(jnp.float32), -1)
    gates, idx = jax.lax.top_k(probs, 2)
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    combine = 0.0
    filled = 0.0
    for j in range(2):
        m = jax.nn.one_hot(idx[..., j], e, dtype=jnp.float32)
        pos = (jnp.cumsum(m, axis=1) - m + filled) * m
        filled = filled + jnp.sum(m, axis=1, keepdims=True)
        m = m * (pos < capacity)
        slot = jax.nn.one_hot(jnp.sum(pos, -1).astype(jnp.int32), capacity, dtype=jnp.float32)
        combine = combine + gates[..., j, None, None] * m[..., None] * slot[:, :, None, :]
    dispatch = (combine > 0).astype(x.dtype)
    xe = jnp.einsum("bsec,bsd->ebcd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("ebcd,edf->ebcf", xe, p["w1"]))
    h = h * jnp.einsum("ebcd,edf->ebcf", xe, p["w3"])
    ye = jnp.einsum("ebcf,efd->ebcd", h, p["w2"])
    return jnp.einsum("bsec,ebcd->bsd", combine.astype(x.dtype), ye)


def workload(size: str = "tiny", dtype: str = "", **overrides) -> al.Workload:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    c = dict(SIZES[size])
    for k, v in overrides.items():
        if k not in c:
            raise ValueError(f"unknown option {k!r}; known: size, dtype, {', '.join(c)}")
        c[k] = int(v)
    dt = jnp.dtype(dtype or ("float32" if size == "tiny" else "bfloat16"))
    L, d, h, kv, hd = c["layers"], c["d_model"], c["heads"], c["kv_heads"], c["head_dim"]
    f, E, V, S, B = c["d_ff"], c["experts"], c["vocab"], c["seq"], c["batch"]
    capacity = max(1, int(1.25 * 2 * S / E))

    def sd(*shape):
        return jax.ShapeDtypeStruct(shape, dt)

    layer = {
        "attn_norm": sd(d), "wq": sd(d, h, hd), "wk": sd(d, kv, hd), "wv": sd(d, kv, hd),
        "wo": sd(h, hd, d), "mlp_norm": sd(d), "router": sd(d, E),
        "w1": sd(E, d, f), "w3": sd(E, d, f), "w2": sd(E, f, d),
    }  # fmt: skip
    params = {"embed": sd(V, d), "layers": [layer] * L, "norm": sd(d), "lm_head": sd(d, V)}

    def loss_fn(p, batch):
        tokens = batch["tokens"]
        x = p["embed"][tokens]
        for lp in p["layers"]:
            x = x + attention(rms_norm(x, lp["attn_norm"]), lp, h, kv)
            x = x + experts(rms_norm(x, lp["mlp_norm"]), lp, capacity)
        logits = rms_norm(x, p["norm"]) @ p["lm_head"]
        lp_ = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(lp_, tokens[:, 1:, None], -1))

    def make_batch(rng: np.random.Generator):
        return {"tokens": rng.integers(0, V, (B, S)).astype(np.int32)}

    data = {"tokens": jax.ShapeDtypeStruct((B, S), jnp.int32)}
    return al.train_workload(loss_fn, optax.adamw(1e-4), params, data, make_batch,
                             name=f"moe-rotary-{size}", options=dict(size=size, **overrides))  # fmt: skip
