"""A GPT-2 written in Keras 3 layers (``Embedding``, ``MultiHeadAttention``,
``LayerNormalization``, ``Dense``) and trained through its JAX backend with
``model.stateless_call``, the way Keras documents custom JAX training loops; no dim named.
GPT-2 XL's shapes at ``size=gpt2-xl`` (its variables are never allocated: built under
``jax.eval_shape``).

autolayout plan experiments/models/libraries/keras_gpt2.py --set size=gpt2-xl --hw h100-64
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from _common import config, token_workload  # noqa: E402

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, vocab=512, seq=16, batch=8),
    "gpt2-xl": dict(layers=48, d_model=1600, heads=25, vocab=50257, seq=1024, batch=512),
}


def build(c: dict, dtype: str) -> keras.Model:
    d, S = c["d_model"], c["seq"]
    tokens = keras.Input((S,), dtype="int32")
    x = keras.layers.Embedding(c["vocab"], d, name="wte", dtype=dtype)(tokens)
    # positions computed when the model runs (a constant made while building would be a
    # tracer of the jax.eval_shape that builds it)
    positions = keras.layers.Lambda(lambda t: keras.ops.zeros_like(t) + keras.ops.arange(S))(tokens)
    x = x + keras.layers.Embedding(S, d, name="wpe", dtype=dtype)(positions)
    for i in range(c["layers"]):
        y = keras.layers.LayerNormalization(name=f"h{i}_ln_1", dtype=dtype)(x)
        y = keras.layers.MultiHeadAttention(c["heads"], d // c["heads"], name=f"h{i}_attn",
                                            dtype=dtype)(y, y, use_causal_mask=True)  # fmt: skip
        x = x + y
        y = keras.layers.LayerNormalization(name=f"h{i}_ln_2", dtype=dtype)(x)
        y = keras.layers.Dense(4 * d, activation="gelu", name=f"h{i}_mlp_fc", dtype=dtype)(y)
        x = x + keras.layers.Dense(d, name=f"h{i}_mlp_proj", dtype=dtype)(y)
    x = keras.layers.LayerNormalization(name="ln_f", dtype=dtype)(x)
    logits = keras.layers.Dense(c["vocab"], use_bias=False, name="lm_head", dtype=dtype)(x)
    return keras.Model(tokens, logits)


def workload(size: str = "tiny", dtype: str = "", **overrides):
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax")
    c, dtype_ = config(SIZES, size, overrides, dtype)
    dt = dtype_.name  # Keras takes the type's name
    holder = {}

    def make():  # the model's structure; its variables' values are never made
        holder["model"] = build(c, dt)
        return {v.path: v.value for v in holder["model"].trainable_variables}

    shapes = jax.eval_shape(make)
    model = holder["model"]
    paths = [v.path for v in model.trainable_variables]
    nontrainable = [v.value for v in model.non_trainable_variables]

    def init(key):
        keys = jax.random.split(key, len(shapes))
        return {p: 0.02 * jax.random.normal(k, s.shape, s.dtype) if s.ndim > 1 else
                   (jnp.ones if p.endswith("gamma") else jnp.zeros)(s.shape, s.dtype)
                for k, (p, s) in zip(keys, shapes.items(), strict=True)}  # fmt: skip

    def logits(params, tokens):
        out, _ = model.stateless_call([params[p] for p in paths], nontrainable, tokens)
        return out

    return token_workload(f"keras-gpt2-{size}", logits, init, c, dict(size=size, **overrides))
