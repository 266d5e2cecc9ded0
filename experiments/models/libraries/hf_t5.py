"""Hugging Face ``transformers`` Flax T5 (``FlaxT5ForConditionalGeneration``), random weights,
no download, no dim named: an encoder-decoder trained on the targets' next tokens (teacher
forcing), its 48 layers unrolled as the library writes them (about 20,000 ops at T5-3B).

autolayout plan experiments/models/libraries/hf_t5.py --set size=t5-3b --hw tpu-v4-256
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import cast, config
from transformers import FlaxT5ForConditionalGeneration, T5Config
from transformers.models.t5 import modeling_flax_t5

import autolayout as al


class _Numpy:
    """``jax.numpy`` as transformers 4.x's Flax T5 calls it: its relative-position buckets
    pass ``jnp.clip(x, a_max=...)``, a keyword this JAX no longer takes (it is ``max=``)."""

    def __getattr__(self, name):
        return getattr(jnp, name)

    @staticmethod
    def clip(x, a_min=None, a_max=None, **kw):
        return jnp.clip(x, kw.pop("min", a_min), kw.pop("max", a_max), **kw)


modeling_flax_t5.jnp = _Numpy()

SIZES = {
    "tiny": dict(
        layers=2, d_model=64, heads=4, d_kv=16, d_ff=128, vocab=256, seq=16, target_seq=8, batch=8
    ),  # fmt: skip
    # T5-3B's shapes (the ``t5-3b`` config: 24 layers each side, ReLU MLP); one step of 128
    # inputs of 512 tokens and targets of 128
    "t5-3b": dict(
        layers=24,
        d_model=1024,
        heads=32,
        d_kv=128,
        d_ff=16384,
        vocab=32128,
        seq=512,
        target_seq=128,
        batch=128,
    ),  # fmt: skip
}


def workload(size: str = "tiny", dtype: str = "", **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    cfg = T5Config(
        vocab_size=c["vocab"], d_model=c["d_model"], d_kv=c["d_kv"], d_ff=c["d_ff"],
        num_layers=c["layers"], num_decoder_layers=c["layers"], num_heads=c["heads"],
        dropout_rate=0.0, feed_forward_proj="relu", tie_word_embeddings=True,
    )  # fmt: skip
    model = FlaxT5ForConditionalGeneration(cfg, input_shape=(1, 1), _do_init=False, dtype=dt)
    B, S, T, V = c["batch"], c["seq"], c["target_seq"], c["vocab"]

    def init(key):
        return cast(model.init_weights(key, (1, 1)), dt)

    def loss_fn(params, batch):
        out = model(batch["inputs"], decoder_input_ids=batch["targets"][:, :-1], params=params)
        lp = jax.nn.log_softmax(out.logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(lp, batch["targets"][:, 1:, None], -1))

    def make_batch(rng: np.random.Generator):
        return {"inputs": rng.integers(0, V, (B, S)).astype(np.int32),
                "targets": rng.integers(0, V, (B, T + 1)).astype(np.int32)}  # fmt: skip

    data = {"inputs": jax.ShapeDtypeStruct((B, S), jnp.int32),
            "targets": jax.ShapeDtypeStruct((B, T + 1), jnp.int32)}  # fmt: skip
    return al.train_workload(loss_fn, optax.adamw(1e-4), init, data, make_batch,
                             name=f"hf-t5-{size}", options=dict(size=size, **overrides))  # fmt: skip
