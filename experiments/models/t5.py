"""A T5-style encoder-decoder transformer train step (Adam): Mesh-TF's translation model.

The encoder attends over ``enc_seq`` (bidirectional), the decoder over ``dec_seq`` (causal)
and across to the encoder's output; embeddings are shared. Sizes follow T5 1.1.

    autolayout trace experiments/models/t5.py --set size=base

``scan=true`` stacks each side's layers and runs them with ``lax.scan`` (two stacks).
``attention``: ``auto`` (the fused kernel when built for a GPU or TPU in 16 bits, else
``naive``), ``naive``, ``xla``, ``cudnn`` or ``splash``, as in ``gpt.py``.
"""

from __future__ import annotations

import _blocks as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al

# fmt: off
SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, head_dim=16, d_ff=128, vocab=512, enc_seq=32, dec_seq=16, batch=8),
    "base": dict(layers=12, d_model=768, heads=12, head_dim=64, d_ff=2048, vocab=32128, enc_seq=512, dec_seq=128, batch=128),
    "large": dict(layers=24, d_model=1024, heads=16, head_dim=64, d_ff=2816, vocab=32128, enc_seq=512, dec_seq=128, batch=128),
    "xl": dict(layers=24, d_model=2048, heads=32, head_dim=64, d_ff=5120, vocab=32128, enc_seq=512, dec_seq=128, batch=128),
}
# fmt: on


def workload(
    size: str = "tiny",
    dtype: str | None = None,
    attention: str = "auto",
    scan: bool = False,
    **overrides,
) -> al.Workload:
    c = nn.config(SIZES, size, overrides, "size, dtype, attention, scan")
    dt = nn.dtype_of(dtype or ("float32" if size == "tiny" else "bfloat16"))
    attention = nn.attention_for(attention, dt)
    L, d, h, k, f, V = (c[n] for n in ("layers", "d_model", "heads", "head_dim", "d_ff", "vocab"))
    Se, Sd, B = c["enc_seq"], c["dec_seq"], c["batch"]

    def attn():
        return nn.attention_specs(d, h, k, dt)

    norm = al.spec((d,), ("d_model",), dt)
    ffn = {
        "w1": al.spec((d, f), ("d_model", "d_ff"), dt),
        "w2": al.spec((f, d), ("d_ff", "d_model"), dt),
    }
    enc_layer = {"ln1": norm, "attn": attn(), "ln2": norm, **ffn}
    dec_layer = {"ln1": norm, "self": attn(), "ln2": norm, "cross": attn(), "ln3": norm, **ffn}
    params = {
        "embed": al.spec((V, d), ("vocab", "d_model"), dt),
        "encoder": nn.stack(enc_layer, L) if scan else [enc_layer] * L,
        "enc_ln": norm,
        "decoder": nn.stack(dec_layer, L) if scan else [dec_layer] * L,
        "dec_ln": norm,
    }
    batch = {
        "inputs": al.spec((B, Se), ("batch", "enc_seq"), jnp.int32),
        "targets_in": al.spec((B, Sd), ("batch", "dec_seq"), jnp.int32),
        "targets": al.spec((B, Sd), ("batch", "dec_seq"), jnp.int32),
    }

    def encoder(x, p):
        x = x + nn.attention(nn.rms_norm(x, p["ln1"]), p["attn"], kind=attention)
        return x + nn.mlp(nn.rms_norm(x, p["ln2"]), p, "relu"), None

    def decoder(y, p, memory):
        y = y + nn.attention(nn.rms_norm(y, p["ln1"]), p["self"], causal=True, kind=attention)
        y = y + nn.attention(nn.rms_norm(y, p["ln2"]), p["cross"], kv=memory, kind=attention)
        return y + nn.mlp(nn.rms_norm(y, p["ln3"]), p, "relu"), None

    def layers(name, fn, x, stacked):
        if scan:
            with jax.named_scope(name):
                return jax.lax.scan(fn, x, stacked)[0]
        for i, p in enumerate(stacked):
            with jax.named_scope(f"{name}.{i}"):
                x = fn(x, p)[0]
        return x

    def loss_fn(params, batch):
        x = layers("encoder", encoder, params["embed"][batch["inputs"]], params["encoder"])
        memory = nn.rms_norm(x, params["enc_ln"])
        y = params["embed"][batch["targets_in"]]
        y = layers("decoder", lambda y, p: decoder(y, p, memory), y, params["decoder"])
        logits = jnp.einsum("bsd,vd->bsv", nn.rms_norm(y, params["dec_ln"]), params["embed"])
        return nn.cross_entropy(logits, batch["targets"])

    def make_batch(rng):
        tgt = np.asarray(rng.integers(0, V, (B, Sd + 1)), jnp.int32)
        inputs = np.asarray(rng.integers(0, V, (B, Se)), jnp.int32)
        return {"inputs": inputs, "targets_in": tgt[:, :-1], "targets": tgt[:, 1:]}

    options = dict(size=size, dtype=jnp.dtype(dt).name, attention=attention, scan=scan, **c)
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, batch, make_batch, name=f"t5-{size}", options=options
    )
