"""What the wrappers of models from other libraries share: a size table, a next-token loss and
the train step (``al.train_workload``, AdamW). Nothing here names a dim: the planner finds
them. Each wrapper's library is an optional dependency (``pip install -e '.[libraries]'``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def config(sizes: dict, size: str, overrides: dict, dtype: str = "") -> tuple[dict, Any]:
    """The size's shapes with ``overrides`` applied, and the element type: ``dtype``, else
    float32 at the tiny size (the tests' exact losses) and bfloat16 at the published ones."""
    if size not in sizes:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(sizes)}")
    c = dict(sizes[size])
    for k, v in overrides.items():
        if k not in c:
            raise ValueError(f"unknown option {k!r}; known: size, {', '.join(c)}")
        c[k] = type(c[k])(v)
    return c, jnp.dtype(dtype or ("float32" if size == "tiny" else "bfloat16"))


def cast(tree: Any, dtype: Any) -> Any:
    """Every floating leaf of ``tree`` as ``dtype``."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Mean cross-entropy of each position's logits against the next token."""
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    return -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], -1))


def token_workload(name: str, logits: Callable[[Any, jax.Array], jax.Array], init: Any,
                   c: dict, options: dict) -> al.Workload:  # fmt: skip
    """A language-model train step over ``tokens [batch, seq]`` of ``c["vocab"]`` ids."""
    B, S, V = c["batch"], c["seq"], c["vocab"]

    def loss_fn(params, batch):
        return next_token_loss(logits(params, batch["tokens"]), batch["tokens"])

    def make_batch(rng: np.random.Generator):
        return {"tokens": rng.integers(0, V, (B, S)).astype(np.int32)}

    data = {"tokens": jax.ShapeDtypeStruct((B, S), jnp.int32)}
    return al.train_workload(loss_fn, optax.adamw(1e-4), init, data, make_batch, name=name,
                             options=options)  # fmt: skip
