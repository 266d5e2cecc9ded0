"""A Mesh-TensorFlow-style mixture-of-experts transformer train step (top-2 gating).

Each layer is attention followed by an MoE feed-forward block: a gate picks two experts per
token, tokens are dispatched into per-expert buffers of ``capacity`` slots with one-hot
einsums (``dispatch [batch, seq, experts, capacity]``), each expert runs its own MLP
(``w1 [experts, d_model, d_ff]``), and the results are combined back, as in Shazeer et al.
2017/2018 and ``mesh_tensorflow/transformer/moe.py``. Groups are sequences.

    autolayout trace experiments/models/moe.py --set size=base --set experts=64

``scan=true`` stacks the layers and runs them with ``lax.scan`` (the balance loss is carried).
``attention``: ``auto`` (the fused kernel when built for a GPU or TPU in 16 bits, else
``naive``), ``naive``, ``xla``, ``cudnn`` or ``splash``, as in ``gpt.py``.
"""

from __future__ import annotations

import math

import _blocks as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

# fmt: off
SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, head_dim=16, d_ff=128, experts=4, vocab=512, seq=32, batch=8),
    "base": dict(layers=12, d_model=1024, heads=16, head_dim=64, d_ff=4096, experts=64, vocab=32768, seq=1024, batch=256),
    "large": dict(layers=24, d_model=2048, heads=32, head_dim=64, d_ff=8192, experts=128, vocab=32768, seq=1024, batch=512),
}
# fmt: on


def moe_ffn(x, p, capacity: int):
    """Top-2 MoE: returns the combined output and the load-balancing loss."""
    e = p["wg"].shape[-1]
    probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", x, p["wg"]).astype(jnp.float32), axis=-1)
    gates, idx = jax.lax.top_k(probs, 2)
    gates = al.name_dims(gates, ("batch", "seq", "top_k"))
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    m1 = jax.nn.one_hot(idx[..., 0], e, dtype=jnp.float32)
    m2 = jax.nn.one_hot(idx[..., 1], e, dtype=jnp.float32)
    pos1 = jnp.cumsum(m1, axis=1) * m1 - m1
    pos2 = (jnp.cumsum(m2, axis=1) - m2 + jnp.sum(m1, axis=1, keepdims=True)) * m2
    m1 = m1 * (pos1 < capacity)
    m2 = m2 * (pos2 < capacity)
    slot1 = jax.nn.one_hot(jnp.sum(pos1, axis=-1).astype(jnp.int32), capacity, dtype=jnp.float32)
    slot2 = jax.nn.one_hot(jnp.sum(pos2, axis=-1).astype(jnp.int32), capacity, dtype=jnp.float32)
    combine = (gates[..., 0, None, None] * m1[..., None] * slot1[:, :, None, :]
               + gates[..., 1, None, None] * m2[..., None] * slot2[:, :, None, :])  # fmt: skip
    combine = al.name_dims(combine, ("batch", "seq", "experts", "capacity"))
    dispatch = (combine > 0).astype(x.dtype)
    expert_in = jnp.einsum("bsec,bsd->ebcd", dispatch, x)
    h = jax.nn.relu(jnp.einsum("ebcd,edf->ebcf", expert_in, p["w1"]))
    expert_out = jnp.einsum("ebcf,efd->ebcd", h, p["w2"])
    y = jnp.einsum("bsec,ebcd->bsd", combine.astype(x.dtype), expert_out)
    balance = e * jnp.sum(jnp.mean(probs, axis=(0, 1)) * jnp.mean(m1, axis=(0, 1)))
    return y, balance


def workload(
    size: str = "tiny",
    capacity_factor: float = 1.25,
    dtype: str | None = None,
    attention: str = "auto",
    scan: bool = False,
    **overrides,
) -> al.Workload:
    c = nn.config(SIZES, size, overrides, "size, capacity_factor, dtype, attention, scan")
    dt = nn.dtype_of(dtype or ("float32" if size == "tiny" else "bfloat16"))
    attention = nn.attention_for(attention, dt)
    L, d, h, k, f, E, V, S, B = (
        c[n]
        for n in (
            "layers",
            "d_model",
            "heads",
            "head_dim",
            "d_ff",
            "experts",
            "vocab",
            "seq",
            "batch",
        )
    )
    capacity = max(1, math.ceil(2 * S / E * capacity_factor))
    layer = {
        "ln1": al.spec((d,), ("d_model",), dt),
        **nn.attention_specs(d, h, k, dt),
        "ln2": al.spec((d,), ("d_model",), dt),
        "wg": al.spec((d, E), ("d_model", "experts"), dt),
        "w1": al.spec((E, d, f), ("experts", "d_model", "d_ff"), dt),
        "w2": al.spec((E, f, d), ("experts", "d_ff", "d_model"), dt),
    }
    params = {
        "embed": al.spec((V, d), ("vocab", "d_model"), dt),
        "layers": nn.stack(layer, L) if scan else [layer] * L,
        "ln_f": al.spec((d,), ("d_model",), dt),
        "unembed": al.spec((d, V), ("d_model", "vocab"), dt),
    }
    batch = {
        "tokens": al.spec((B, S), ("batch", "seq"), jnp.int32),
        "targets": al.spec((B, S), ("batch", "seq"), jnp.int32),
    }

    def layer_fn(carry, p):
        x, aux = carry
        x = x + nn.attention(nn.rms_norm(x, p["ln1"]), p, causal=True, kind=attention)
        y, balance = moe_ffn(nn.rms_norm(x, p["ln2"]), p, capacity)
        return (x + y, aux + balance), None

    def loss_fn(params, batch):
        x = params["embed"][batch["tokens"]]
        aux = jnp.zeros((), jnp.float32)
        if scan:
            with jax.named_scope("layers"):
                (x, aux), _ = jax.lax.scan(layer_fn, (x, aux), params["layers"])
        else:
            for i, p in enumerate(params["layers"]):
                with jax.named_scope(f"layers.{i}"):
                    (x, aux), _ = layer_fn((x, aux), p)
        logits = jnp.einsum("bsd,dv->bsv", nn.rms_norm(x, params["ln_f"]), params["unembed"])
        return nn.cross_entropy(logits, batch["targets"]) + 0.01 * aux / L

    def make_batch(rng):
        toks = np.asarray(rng.integers(0, V, (B, S + 1)), jnp.int32)
        return {"tokens": toks[:, :-1], "targets": toks[:, 1:]}

    options = dict(
        size=size, capacity_factor=capacity_factor, dtype=jnp.dtype(dt).name,
        attention=attention, scan=scan, **c,
    )  # fmt: skip
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, batch, make_batch, name=f"moe-{size}", options=options
    )
