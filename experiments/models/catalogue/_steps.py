"""The train steps the catalogue's entries share (``al.train_workload``, AdamW): over token
ids (a masked-LM's or a seq2seq model's loss; the causal LMs use
``libraries/_common.token_workload``) and over images, with the model's non-trainable state
(batch statistics, a dropout seed) carried where it has some."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

MODELS = Path(__file__).resolve().parent.parent  # experiments/models
LIBRARIES = MODELS / "libraries"
if str(LIBRARIES) not in sys.path:  # the library wrappers' helpers (_common) and files
    sys.path.insert(0, str(LIBRARIES))

from _common import cast, config, next_token_loss, token_workload  # noqa: E402

__all__ = ["LIBRARIES", "cast", "config", "image_workload", "text_workload", "token_workload"]


def text_workload(name: str, loss: Callable[[Any, dict], jax.Array], init: Any,
                  shapes: dict[str, tuple[int, ...]], vocab: int, options: dict) -> al.Workload:  # fmt: skip
    """A train step over int32 token-id arrays of ``shapes`` (ids below ``vocab``), its
    ``loss(params, batch)``."""
    data = {k: jax.ShapeDtypeStruct(s, jnp.int32) for k, s in shapes.items()}

    def make_batch(rng: np.random.Generator):
        return {k: rng.integers(0, vocab, s).astype(np.int32) for k, s in shapes.items()}

    return al.train_workload(loss, optax.adamw(1e-4), init, data, make_batch, name=name,
                             options=options)  # fmt: skip


def masked_lm_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Every position's logits against its own token (a masked LM's head, no mask drawn)."""
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), labels
    ).mean()


def seq2seq_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Teacher forcing: the decoder read ``targets``; each position predicts the next."""
    return next_token_loss(logits, targets)


def image_workload(name: str, apply: Callable, init: Any, c: dict, options: dict, *,
                   channels_first: bool = False, state: Any = None) -> al.Workload:  # fmt: skip
    """A classifier's train step over ``images`` (``[batch, H, H, C]``, or ``[batch, C, H, H]``
    with ``channels_first``) and ``labels [batch]``; ``c`` holds ``batch``, ``image``,
    ``channels`` (3 unless given) and ``classes``. ``apply(params, images) -> logits``, or with
    ``state`` (its specs or ``init(key)``) ``apply(params, state, images) -> (logits,
    new_state)``."""
    B, H, C, K = c["batch"], c["image"], c.get("channels", 3), c["classes"]
    shape = (B, C, H, H) if channels_first else (B, H, H, C)

    def ce(logits, labels):
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32),
                                                               labels).mean()  # fmt: skip

    if state is None:

        def loss(params, batch):
            return ce(apply(params, batch["images"]), batch["labels"])
    else:

        def loss(params, st, batch):
            logits, new = apply(params, st, batch["images"])
            return ce(logits, batch["labels"]), new

    def make_batch(rng: np.random.Generator):
        return {"images": rng.standard_normal(shape, np.float32),
                "labels": rng.integers(0, K, (B,)).astype(np.int32)}  # fmt: skip

    data = {"images": jax.ShapeDtypeStruct(shape, jnp.float32),
            "labels": jax.ShapeDtypeStruct((B,), jnp.int32)}  # fmt: skip
    return al.train_workload(loss, optax.adamw(1e-4), init, data, make_batch, name=name,
                             options=options, state=state)  # fmt: skip
