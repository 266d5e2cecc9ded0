"""Hugging Face ``transformers`` Flax BERT (``FlaxBertForMaskedLM``), random weights, no
download, no dim named: an encoder trained on the masked-LM head (every position's token).

autolayout plan experiments/models/libraries/hf_bert.py --set size=bert-large --hw h100-64
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from _common import cast, config
from transformers import BertConfig, FlaxBertForMaskedLM

import autolayout as al

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, d_ff=256, vocab=512, seq=16, batch=8),
    "bert-large": dict(
        layers=24, d_model=1024, heads=16, d_ff=4096, vocab=30522, seq=512, batch=256
    ),  # fmt: skip
}


def workload(size: str = "tiny", dtype: str = "", **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    cfg = BertConfig(
        vocab_size=c["vocab"], hidden_size=c["d_model"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], intermediate_size=c["d_ff"],
        max_position_embeddings=max(c["seq"], 64), hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    model = FlaxBertForMaskedLM(cfg, input_shape=(1, c["seq"]), _do_init=False, dtype=dt)
    B, S, V = c["batch"], c["seq"], c["vocab"]

    def init(key):
        return cast(model.init_weights(key, (1, S)), dt)

    def loss_fn(params, batch):
        logits = model(batch["tokens"], params=params).logits.astype(jnp.float32)
        lp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(lp, batch["labels"][..., None], -1))

    def make_batch(rng: np.random.Generator):
        tokens = rng.integers(0, V, (B, S)).astype(np.int32)
        return {"tokens": tokens, "labels": tokens}

    data = {k: jax.ShapeDtypeStruct((B, S), jnp.int32) for k in ("tokens", "labels")}
    return al.train_workload(loss_fn, optax.adamw(1e-4), init, data, make_batch,
                             name=f"hf-bert-{size}", options=dict(size=size, **overrides))  # fmt: skip
