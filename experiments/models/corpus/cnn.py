"""A Flax linen CNN classifier as its users write it (no dim named): convolutions with
BatchNorm (its statistics recomputed each step: batch statistics, the running ones
dropped), ``nn.max_pool`` and ``nn.avg_pool``, a depthwise convolution, dropout and a dense
head, trained with ``al.train_workload`` (AdamW).

    autolayout plan experiments/models/corpus/cnn.py --hw cpu-8
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from _images import image_workload

import autolayout as al

SIZES = {
    "tiny": dict(batch=16, image=16, channels=8, classes=10),
    "base": dict(batch=256, image=64, channels=64, classes=1000),
}


class CNN(nn.Module):
    channels: int
    classes: int

    @nn.compact
    def __call__(self, x, train: bool = True):
        c = self.channels
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Conv(c, (3, 3))(x)))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        x = nn.Conv(c, (3, 3), feature_group_count=c)(x)  # depthwise
        x = nn.relu(nn.Conv(2 * c, (1, 1))(x))
        x = nn.avg_pool(x, (2, 2), strides=(2, 2))
        x = nn.Dropout(0.1, deterministic=not train)(x)
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


def workload(size: str = "tiny", **overrides) -> al.Workload:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    c = {**SIZES[size], **{k: int(v) for k, v in overrides.items()}}
    H, C, K = c["image"], c["channels"], c["classes"]
    model = CNN(C, K)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, H, H, 3))))

    def init(key):
        return model.init(key, jnp.zeros((1, H, H, 3)))["params"]

    def logits(params, images):
        stats = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["batch_stats"])
        out, _ = model.apply({"params": params, "batch_stats": stats}, images,
                             rngs={"dropout": jax.random.key(0)}, mutable=["batch_stats"])  # fmt: skip
        return out

    return image_workload(f"cnn-{size}", logits, init, c, dict(size=size, **overrides))
