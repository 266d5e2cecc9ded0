"""Hugging Face ``transformers`` Flax Llama (``FlaxLlamaForCausalLM``), random weights, no
download: the model as a user loads it, with no dim named.

autolayout plan experiments/models/libraries/hf_llama.py --set size=llama2-7b --hw tpu-v4-256
"""

from __future__ import annotations

from _common import cast, config, token_workload
from transformers import FlaxLlamaForCausalLM, LlamaConfig

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, d_ff=128, vocab=256, seq=16, batch=8),
    # Llama-2-7B's shapes; one step of 128 x 4096 tokens (a micro-batch of 2 on 64 DP ranks)
    "llama2-7b": dict(
        layers=32,
        d_model=4096,
        heads=32,
        kv_heads=32,
        d_ff=11008,
        vocab=32000,
        seq=4096,
        batch=128,
    ),  # fmt: skip
}


def workload(size: str = "tiny", dtype: str = "", **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    cfg = LlamaConfig(
        vocab_size=c["vocab"], hidden_size=c["d_model"], intermediate_size=c["d_ff"],
        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        num_key_value_heads=c["kv_heads"], max_position_embeddings=max(c["seq"], 64),
    )  # fmt: skip
    model = FlaxLlamaForCausalLM(cfg, input_shape=(1, c["seq"]), _do_init=False, dtype=dt)

    def init(key):
        params = model.init_weights(key, (1, c["seq"]))
        return cast(params, dt)

    def logits(params, tokens):
        return model(tokens, params=params).logits

    return token_workload(f"hf-llama-{size}", logits, init, c, dict(size=size, **overrides))
