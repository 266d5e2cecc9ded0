"""An MLP-Mixer in Flax linen as a newcomer writes it from the README (float32, no dim named,
modules auto-named ``MixerBlock_0`` ... ``MixerBlock_3``, each with ``Dense_0`` ... ``Dense_3``):
every block's token- and channel-mixing widths are one dim each, named without a block's index
(they were ``MixerBlock_0_Dense_0`` and ``Dense_2``, after block 0's weights).

    autolayout plan experiments/models/corpus/mixer.py --hw cpu-8
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


class MixerBlock(nn.Module):
    tokens_hidden: int
    channels_hidden: int

    @nn.compact
    def __call__(self, x):
        y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)
        y = nn.Dense(x.shape[1])(nn.gelu(nn.Dense(self.tokens_hidden)(y)))
        x = x + jnp.swapaxes(y, 1, 2)
        y = nn.Dense(self.channels_hidden)(nn.LayerNorm()(x))
        return x + nn.Dense(x.shape[2])(nn.gelu(y))


class Mixer(nn.Module):
    hidden: int
    blocks: int
    classes: int

    @nn.compact
    def __call__(self, x):  # [batch, patches, patch_dim]
        x = nn.Dense(self.hidden)(x)
        for _ in range(self.blocks):
            x = MixerBlock(self.hidden // 2, 4 * self.hidden)(x)
        return nn.Dense(self.classes)(nn.LayerNorm()(x).mean(axis=1))


def workload(batch=16, patches=16, patch_dim=12, hidden=32, blocks=4, classes=10):
    model = Mixer(hidden, blocks, classes)

    def loss_fn(params, b):
        logits = model.apply(params, b["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

    def init(key):
        return model.init(key, jnp.zeros((1, patches, patch_dim)))

    spec = {"x": jax.ShapeDtypeStruct((batch, patches, patch_dim), jnp.float32),
            "y": jax.ShapeDtypeStruct((batch,), jnp.int32)}  # fmt: skip

    def make_batch(rng):
        return {"x": rng.standard_normal((batch, patches, patch_dim), np.float32),
                "y": rng.integers(0, classes, (batch,), np.int32)}  # fmt: skip

    return al.train_workload(loss_fn, optax.adam(1e-3), init, spec, make_batch)
