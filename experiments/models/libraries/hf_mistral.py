"""Hugging Face ``transformers`` Flax Mistral (``FlaxMistralForCausalLM``), random weights, no
download: the model as a user loads it, with no dim named, its layers unrolled.

autolayout plan experiments/models/libraries/hf_mistral.py --set size=mistral-7b --hw h100-64
"""

from __future__ import annotations

from _common import cast, config, token_workload
from transformers import FlaxMistralForCausalLM, MistralConfig

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=128, vocab=256, seq=16, batch=8),
    # Mistral-7B v0.1's shapes (grouped-query attention, 8 KV heads); one step of 128 x 4096
    # tokens
    "mistral-7b": dict(
        layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336, vocab=32000, seq=4096, batch=128
    ),  # fmt: skip
}


def workload(size: str = "tiny", dtype: str = "", **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    cfg = MistralConfig(
        vocab_size=c["vocab"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], max_position_embeddings=max(c["seq"], 64),
        sliding_window=c["seq"],
    )  # fmt: skip
    model = FlaxMistralForCausalLM(cfg, input_shape=(1, c["seq"]), _do_init=False, dtype=dt)

    def init(key):
        return cast(model.init_weights(key, (1, c["seq"])), dt)

    def logits(params, tokens):
        return model(tokens, params=params).logits

    return token_workload(f"hf-mistral-{size}", logits, init, c, dict(size=size, **overrides))
