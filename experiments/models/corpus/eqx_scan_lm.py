"""An Equinox decoder the way its docs compile a deep model once (no dim named, float32):
the blocks built by ``eqx.filter_vmap`` into one stacked module, run by ``lax.scan`` over
their arrays; ``eqx.nn.Embedding``, ``MultiheadAttention``, ``LayerNorm`` and ``Linear``
applied per position with ``jax.vmap`` (the embedding's lookup under vmap is a gather with
a coordinate vector: its index and the row's offset).

    autolayout plan experiments/models/corpus/eqx_scan_lm.py --hw cpu-8 --time-limit 10
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

SIZES = {"tiny": dict(vocab=512, d_model=64, heads=4, layers=3, seq=32, batch=16)}


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, d: int, heads: int, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1, self.ln2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
        self.up = eqx.nn.Linear(d, 4 * d, key=k2)
        self.down = eqx.nn.Linear(4 * d, d, key=k3)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        h = jax.vmap(self.ln1)(x)
        x = x + self.attn(h, h, h, mask=mask)
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(lambda v: self.down(jax.nn.gelu(self.up(v))))(h)


class LM(eqx.Module):
    emb: eqx.nn.Embedding
    blocks: Block
    ln: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, vocab: int, d: int, heads: int, layers: int, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.emb = eqx.nn.Embedding(vocab, d, key=k1)
        self.blocks = eqx.filter_vmap(lambda k: Block(d, heads, k))(jax.random.split(k2, layers))
        self.ln = eqx.nn.LayerNorm(d)
        self.head = eqx.nn.Linear(d, vocab, use_bias=False, key=k3)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = jax.vmap(self.emb)(tokens)
        mask = jnp.tril(jnp.ones((tokens.shape[0],) * 2, bool))
        arrays, static = eqx.partition(self.blocks, eqx.is_array)

        def layer(x, p):
            return eqx.combine(p, static)(x, mask), None

        x, _ = jax.lax.scan(layer, x, arrays)
        return jax.vmap(self.head)(jax.vmap(self.ln)(x))


def workload(size: str = "tiny") -> al.Workload:
    c = SIZES[size]
    make = (c["vocab"], c["d_model"], c["heads"], c["layers"])
    static = eqx.partition(eqx.filter_eval_shape(LM, *make, jax.random.key(0)), eqx.is_array)[1]

    def init(key: jax.Array):
        return eqx.partition(LM(*make, key), eqx.is_array)[0]

    def loss_fn(params, batch):
        logits = jax.vmap(eqx.combine(params, static))(batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()

    b, s = c["batch"], c["seq"]
    spec = {k: jax.ShapeDtypeStruct((b, s), jnp.int32) for k in ("tokens", "labels")}

    def make_batch(rng: np.random.Generator) -> dict:
        t = rng.integers(0, c["vocab"], (b, s + 1)).astype(np.int32)
        return {"tokens": t[:, :-1], "labels": t[:, 1:]}

    return al.train_workload(loss_fn, optax.adamw(1e-3), init, spec, make_batch)
