"""Layers and the optax train step shared by the example models (imported from the model
files, whose folder is on sys.path while autolayout loads them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def attention_specs(d: int, h: int, k: int, dt: Any) -> dict:
    """``wq/wk/wv [d_model, heads, head_dim]`` and ``wo [heads, head_dim, d_model]``."""
    qkv = al.spec((d, h, k), ("d_model", "heads", "head_dim"), dt)
    return {
        "wq": qkv,
        "wk": qkv,
        "wv": qkv,
        "wo": al.spec((h, k, d), ("heads", "head_dim", "d_model"), dt),
    }


def attention(
    x: jax.Array, p: dict, *, kv: jax.Array | None = None, causal: bool = False
) -> jax.Array:
    """Multi-head attention; weights ``wq/wk/wv [d_model, heads, head_dim]``, ``wo [heads, head_dim, d_model]``."""
    src = x if kv is None else kv
    q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
    k = jnp.einsum("btd,dhk->bthk", src, p["wk"])
    v = jnp.einsum("btd,dhk->bthk", src, p["wv"])
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


def init_params(specs: Any, rng: np.random.Generator, scale: float = 0.02) -> Any:
    """Real arrays for a pytree of specs: ones for 1-D scales, scaled normals elsewhere
    (numpy on the host: no per-shape compile, so tiny models start in milliseconds)."""

    def one(s):
        if _is_scale(s):
            return jnp.ones(s.shape, s.dtype)
        return jnp.asarray(scale * rng.standard_normal(s.shape, np.float32), s.dtype)

    return jax.tree.map(one, specs)


def _is_scale(s) -> bool:
    return len(s.shape) == 1 or (len(s.shape) == 2 and s.dims[0] == "layers")  # norm scales


def init_params_jax(specs: Any, key: jax.Array, scale: float = 0.02) -> Any:
    """``init_params`` on the devices, jittable: ``jax.jit(..., out_shardings=...)`` makes
    each device's shard where it lives (nothing is built whole first).

    The normals come from a counter hash of (seed, leaf, element index) — elementwise over an
    iota, so every sharding gives the same numbers and XLA compiles it in milliseconds
    (threefry takes 5-15 s to compile per sharding on the CPU)."""
    seed = jax.random.key_data(key).ravel()[-1].astype(jnp.uint32)
    leaves, treedef = jax.tree.flatten(specs)
    out = [
        jnp.ones(s.shape, s.dtype)
        if _is_scale(s)
        else (scale * hash_normal(s.shape, seed, k)).astype(s.dtype)
        for k, s in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, out)


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash (murmur3's finaliser)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def hash_normal(shape: tuple[int, ...], seed: jax.Array, stream: int) -> jax.Array:
    """Standard normals (Box-Muller over two hashed uniforms) of the element indices."""
    idx = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for ax in range(len(shape) - 1, -1, -1):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, ax) * jnp.uint32(stride % 2**32)
        stride *= shape[ax]
    base = _mix(seed * jnp.uint32(0x9E3779B1) + jnp.uint32(stream * 0x632BE5AB % 2**32))
    u1 = (_mix(idx * jnp.uint32(2) + base) >> 8).astype(jnp.float32) / 2**24
    u2 = (_mix(idx * jnp.uint32(2) + jnp.uint32(1) + base) >> 8).astype(jnp.float32) / 2**24
    return jnp.sqrt(-2.0 * jnp.log1p(-u1)) * jnp.cos(2.0 * jnp.pi * u2)


def train_workload(
    loss_fn: Callable[[Any, Any], jax.Array],
    params: Any,
    batch: Any,
    make_batch: Callable[[np.random.Generator], Any],
    *,
    name: str,
    options: dict,
    learning_rate: float = 1e-3,
) -> al.Workload:
    """A whole train step ``(params, opt_state, batch) -> (params, opt_state, loss)`` with Adam."""
    opt = optax.adam(learning_rate)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = jax.eval_shape(opt.init, params)

    def init(seed: int = 0):
        rng = np.random.default_rng(seed)
        real = init_params(params, rng)
        return real, opt.init(real), make_batch(rng)

    def init_state(key):  # the donated arguments, jittable
        real = init_params_jax(params, key)
        return real, opt.init(real)

    def batches(step: int, seed: int = 0):  # the other arguments of step `step`, on the host
        return (make_batch(np.random.default_rng([seed, step])),)

    return al.Workload(
        train_step,
        (params, opt_state, batch),
        donate_argnums=(0, 1),
        name=name,
        init=init,
        init_state=init_state,
        batches=batches,
        options=options,
    )
