"""Layers shared by the example models (imported from the model
files, whose folder is on sys.path while autolayout loads them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import autolayout as al

DTYPES = {
    "float32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "f32": jnp.float32,
    "bf16": jnp.bfloat16,
}


def dtype_of(name: str) -> Any:
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def config(sizes: dict[str, dict], size: str, overrides: dict, others: str) -> dict:
    """A size preset with integer overrides; unknown sizes or options name what is known.
    ``--set size=256`` arrives as the integer 256: presets are looked up by their text."""
    size = str(size)
    if size not in sizes:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(sizes)}")
    c = dict(sizes[size])
    unknown = sorted(set(overrides) - set(c))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; options are {others}, {', '.join(c)}")
    c.update({k: int(v) for k, v in overrides.items()})
    return c


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def attention_specs(d: int, h: int, k: int, dt: Any, kv_heads: int | None = None) -> dict:
    """``wq [d_model, heads, head_dim]``, ``wk/wv [d_model, kv_heads, head_dim]`` (``heads``
    without grouped-query attention) and ``wo [heads, head_dim, d_model]``."""
    q = al.spec((d, h, k), ("d_model", "heads", "head_dim"), dt)
    kv = q if not kv_heads else al.spec((d, kv_heads, k), ("d_model", "kv_heads", "head_dim"), dt)
    return {
        "wq": q,
        "wk": kv,
        "wv": kv,
        "wo": al.spec((h, k, d), ("heads", "head_dim", "d_model"), dt),
    }


ATTENTION = ("auto", "naive", "xla", "cudnn", "splash")


def attention_for(kind: str, dtype: Any = None) -> str:
    """``auto`` (the example transformers' default): the fused kernel of the accelerator the
    step is built for, in 16 bits: on NVIDIA GPUs cuDNN flash attention
    (``jax.nn.dot_product_attention(implementation="cudnn")``), on TPUs splash attention
    (``al.splash_attention``, the Pallas kernel); elsewhere the materialised-scores einsums (a
    CPU runs those; cuDNN takes no float32). ``al.target()`` says which hardware: the
    ``--hw`` a plan is made for, else this machine's devices. The resolved kind is what the
    plan file records."""
    if kind not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {kind!r}")
    if kind != "auto":
        return kind
    if dtype is not None and jnp.dtype(dtype).itemsize != 2:
        return "naive"  # (without asking al.target(): a float32 step is built alike anywhere)
    return {"gpu": "cudnn", "tpu": "splash"}.get(al.target(), "naive")


def rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding of ``x [batch, seq, heads, head_dim]`` (halves rotated)."""
    s, k = x.shape[1], x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, k // 2, dtype=jnp.float32) / (k // 2)))
    ang = jnp.arange(s, dtype=jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attention(
    x: jax.Array,
    p: dict,
    *,
    kv: jax.Array | None = None,
    causal: bool = False,
    kind: str = "naive",
    rotary: bool = False,
) -> jax.Array:
    """Multi-head (or grouped-query) attention; weights as :func:`attention_specs` makes them.

    ``kind``: ``auto`` as :func:`attention_for` resolves it; ``naive`` materialises the
    scores with einsums (what the H200 table measured),
    ``xla`` and ``cudnn`` call ``jax.nn.dot_product_attention`` with that implementation
    (cuDNN flash attention runs on NVIDIA GPUs only; the planner prices it anywhere);
    ``splash`` calls ``al.splash_attention`` (the TPU's kernel; Pallas' interpreter
    elsewhere)."""
    kind = attention_for(kind, x.dtype)
    src = x if kv is None else kv
    q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", src, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", src, p["wv"])
    if rotary:
        q, k = rope(q), rope(k)
    if kind == "splash":
        out = al.splash_attention(q, k, v, is_causal=causal)
        return jnp.einsum("bshk,hkd->bsd", out, p["wo"])
    if kind != "naive":
        impl = None if kind == "xla" else "cudnn"
        out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)
        return jnp.einsum("bshk,hkd->bsd", out, p["wo"])
    if k.shape[2] != q.shape[2]:  # grouped-query: each kv head serves heads / kv_heads queries
        k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
        v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
    scores = jnp.einsum("bshk,bthk->bhst", q, k) / jnp.sqrt(q.shape[-1]).astype(x.dtype)
    if causal:
        s, t = scores.shape[-2:]
        mask = jnp.arange(s)[:, None] >= jnp.arange(t)[None, :]
        scores = jnp.where(mask, scores, jnp.asarray(-1e9, scores.dtype))
    probs = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(x.dtype)
    out = jnp.einsum("bhst,bthk->bshk", probs, v)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"])


def mlp(x: jax.Array, p: dict, kind: str) -> jax.Array:
    """The feed-forward block: ``w1 [d_model, d_ff]``, ``w2 [d_ff, d_model]`` (+ ``w3`` for swiglu)."""
    h = jnp.einsum("bsd,df->bsf", x, p["w1"])
    if kind == "gelu":
        h = jax.nn.gelu(h)
    elif kind == "relu":
        h = jax.nn.relu(h)
    elif kind == "swiglu":
        h = jax.nn.silu(h) * jnp.einsum("bsd,df->bsf", x, p["w3"])
    else:
        raise ValueError(f"mlp must be 'gelu', 'relu' or 'swiglu', got {kind!r}")
    return jnp.einsum("bsf,fd->bsd", h, p["w2"])


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def remat(fn: Callable, policy: str) -> Callable:
    """``none`` saves everything, ``minimal`` saves matmul outputs, ``full`` recomputes the layer."""
    if policy == "none":
        return fn
    if policy == "minimal":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots)
    if policy == "full":
        return jax.checkpoint(fn)
    raise ValueError(f"remat must be 'none', 'minimal' or 'full', got {policy!r}")


def stack(layer: dict, n: int) -> dict:
    """A layer's specs with a leading ``layers`` dim, for ``lax.scan``."""
    return jax.tree.map(lambda s: al.spec((n, *s.shape), ("layers", *s.dims), s.dtype), layer)
