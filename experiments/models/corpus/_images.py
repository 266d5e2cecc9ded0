"""What the corpus's image classifiers share: the train step over ``image [batch, H, H, 3]``
and ``label [batch]`` (softmax cross-entropy, AdamW), through ``al.train_workload``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def image_workload(name: str, logits: Callable[[Any, jax.Array], jax.Array], init: Any,
                   c: dict, options: dict) -> al.Workload:  # fmt: skip
    """A classifier's train step; ``c`` holds ``batch``, ``image`` (its side) and ``classes``."""
    B, H, K = c["batch"], c["image"], c["classes"]

    def loss_fn(params, batch):
        out = logits(params, batch["image"])
        return optax.softmax_cross_entropy_with_integer_labels(out, batch["label"]).mean()

    def make_batch(rng: np.random.Generator):
        return {"image": rng.standard_normal((B, H, H, 3), np.float32),
                "label": rng.integers(0, K, (B,)).astype(np.int32)}  # fmt: skip

    data = {"image": jax.ShapeDtypeStruct((B, H, H, 3), jnp.float32),
            "label": jax.ShapeDtypeStruct((B,), jnp.int32)}  # fmt: skip
    return al.train_workload(loss_fn, optax.adamw(1e-3), init, data, make_batch, name=name,
                             options=options)  # fmt: skip
