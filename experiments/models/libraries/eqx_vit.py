"""A Vision Transformer built from Equinox's ``nn`` layers (``Conv2d`` patches,
``MultiheadAttention``, ``LayerNorm``, ``Linear``), vmapped over the batch as Equinox models
are, no dim named: ViT-L/16 at ``size=vit-l16``. ``scan=true`` stacks the blocks and runs them
with ``jax.lax.scan``, Equinox's own idiom (``eqx.filter_vmap`` over the keys to build them,
``eqx.partition`` / ``eqx.combine`` in the scanned function).

autolayout plan experiments/models/libraries/eqx_vit.py --set size=vit-l16 --hw tpu-v4-256
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import cast, config

import autolayout as al

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, d_mlp=128, image=32, patch=8, classes=10, batch=8),
    "vit-l16": dict(
        layers=24, d_model=1024, heads=16, d_mlp=4096, image=224, patch=16, classes=1000, batch=1024
    ),  # fmt: skip
}


class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, d, heads, d_mlp, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1, self.ln2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
        self.fc1, self.fc2 = eqx.nn.Linear(d, d_mlp, key=k2), eqx.nn.Linear(d_mlp, d, key=k3)

    def __call__(self, x):  # x [tokens, d]
        y = jax.vmap(self.ln1)(x)
        x = x + self.attn(y, y, y)
        y = jax.nn.gelu(jax.vmap(self.fc1)(jax.vmap(self.ln2)(x)))
        return x + jax.vmap(self.fc2)(y)


class ViT(eqx.Module):
    patches: eqx.nn.Conv2d
    cls: jax.Array
    pos: jax.Array
    blocks: list
    ln: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, c, key, scan=False):
        d, n = c["d_model"], (c["image"] // c["patch"]) ** 2
        keys = jax.random.split(key, c["layers"] + 4)
        self.patches = eqx.nn.Conv2d(3, d, c["patch"], stride=c["patch"], key=keys[0])
        self.cls = 0.02 * jax.random.normal(keys[1], (1, d))
        self.pos = 0.02 * jax.random.normal(keys[2], (n + 1, d))
        if scan:  # one Block whose arrays have a leading layer axis
            self.blocks = eqx.filter_vmap(lambda k: Block(d, c["heads"], c["d_mlp"], k))(keys[4:])
        else:
            self.blocks = [Block(d, c["heads"], c["d_mlp"], k) for k in keys[4:]]
        self.ln = eqx.nn.LayerNorm(d)
        self.head = eqx.nn.Linear(d, c["classes"], key=keys[3])

    def __call__(self, image):  # image [3, H, W]
        x = self.patches(image)
        x = x.reshape(x.shape[0], -1).T
        x = jnp.concatenate([self.cls, x]) + self.pos
        if isinstance(self.blocks, list):
            for blk in self.blocks:
                x = blk(x)
        else:
            arrays, static = eqx.partition(self.blocks, eqx.is_array)

            def layer(x, a):
                return eqx.combine(a, static)(x), None

            x, _ = jax.lax.scan(layer, x, arrays)
        return self.head(self.ln(x[0]))


def workload(size: str = "tiny", dtype: str = "", scan: bool = False, **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    B, H = c["batch"], c["image"]
    abstract = eqx.filter_eval_shape(ViT, c, jax.random.key(0), scan)
    static = eqx.filter(abstract, lambda x: isinstance(x, jax.ShapeDtypeStruct), inverse=True)

    def init(key):
        return cast(eqx.filter(ViT(c, key, scan), eqx.is_array), dt)

    def loss_fn(params, batch):
        model = eqx.combine(params, static)
        logits = jax.vmap(model)(batch["images"].astype(dt)).astype(jnp.float32)
        lp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(lp, batch["labels"][:, None], -1))

    def make_batch(rng: np.random.Generator):
        return {
            "images": rng.standard_normal((B, 3, H, H)).astype(np.float32),
            "labels": rng.integers(0, c["classes"], (B,)).astype(np.int32),
        }

    data = {
        "images": jax.ShapeDtypeStruct((B, 3, H, H), jnp.float32),
        "labels": jax.ShapeDtypeStruct((B,), jnp.int32),
    }
    return al.train_workload(loss_fn, optax.adamw(1e-4), init, data, make_batch,
                             name=f"eqx-vit-{size}", options=dict(size=size, scan=scan, **overrides))  # fmt: skip
