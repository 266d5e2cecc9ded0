"""A GPT-style decoder-only transformer train step (Adam), from tiny to GPT-3 175B.

    autolayout trace experiments/models/gpt.py --set size=gpt3-175b
    autolayout trace experiments/models/gpt.py --set size=tiny --set scan=true --set remat=full

Options: ``size`` (a preset below), any of its fields to override (``layers``, ``d_model``,
``heads``, ``head_dim``, ``d_ff``, ``vocab``, ``seq``, ``batch``), ``mlp`` (gelu, relu, swiglu),
``remat`` (none, minimal, full), ``scan`` (stack the layers with ``lax.scan``), ``dtype``
(float32 for the tiny sizes, bfloat16 for the others by default), ``attention`` (``auto``,
the default: the fused kernel when the step is built for a GPU (cuDNN's) or a TPU (splash)
in 16 bits, else ``naive``; ``naive``: einsums that materialise the scores; ``xla`` /
``cudnn``: ``jax.nn.dot_product_attention`` with that implementation, cuDNN's flash kernel
running on NVIDIA GPUs only; ``splash``: ``al.splash_attention``, the TPU's Pallas kernel). The ``llama*`` sizes are Llama's block: grouped-query attention
(``kv_heads``), rotary positions, SwiGLU:

    autolayout plan experiments/models/gpt.py --hw h100-64 --set size=llama3-8b --set scan=true
"""

from __future__ import annotations

import _blocks as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import autolayout as al

# GPT-3 paper (Brown et al. 2020) Table 2.1; batch = tokens per batch / 2048. Vocab 50257
# padded to 50304 (a multiple of 64 and 128) as Megatron-LM does.
# fmt: off
SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, head_dim=16, d_ff=256, vocab=512, seq=32, batch=8),
    "gpt3-small": dict(layers=12, d_model=768, heads=12, head_dim=64, d_ff=3072, vocab=50304, seq=2048, batch=256),
    "gpt3-medium": dict(layers=24, d_model=1024, heads=16, head_dim=64, d_ff=4096, vocab=50304, seq=2048, batch=256),
    "gpt3-large": dict(layers=24, d_model=1536, heads=16, head_dim=96, d_ff=6144, vocab=50304, seq=2048, batch=256),
    "gpt3-xl": dict(layers=24, d_model=2048, heads=16, head_dim=128, d_ff=8192, vocab=50304, seq=2048, batch=512),
    "gpt3-2.7b": dict(layers=32, d_model=2560, heads=32, head_dim=80, d_ff=10240, vocab=50304, seq=2048, batch=512),
    "gpt3-6.7b": dict(layers=32, d_model=4096, heads=32, head_dim=128, d_ff=16384, vocab=50304, seq=2048, batch=1024),
    "gpt3-13b": dict(layers=40, d_model=5120, heads=40, head_dim=128, d_ff=20480, vocab=50304, seq=2048, batch=1024),
    "gpt3-175b": dict(layers=96, d_model=12288, heads=96, head_dim=128, d_ff=49152, vocab=50304, seq=2048, batch=1536),
    # Llama 3 (Dubey et al. 2024, Table 3); batch 128 x 8192 = 1M tokens
    "llama-tiny": dict(layers=2, d_model=64, heads=4, kv_heads=2, head_dim=16, d_ff=192, vocab=512, seq=32, batch=8),
    "llama3-8b": dict(layers=32, d_model=4096, heads=32, kv_heads=8, head_dim=128, d_ff=14336, vocab=128256, seq=8192, batch=128),
    "llama3-70b": dict(layers=80, d_model=8192, heads=64, kv_heads=8, head_dim=128, d_ff=28672, vocab=128256, seq=8192, batch=256),
}
# fmt: on


def layer_specs(c: dict, mlp: str, dt) -> dict:
    d, h, k, f = c["d_model"], c["heads"], c["head_dim"], c["d_ff"]
    p = {
        "ln1": al.spec((d,), ("d_model",), dt),
        **nn.attention_specs(d, h, k, dt, c.get("kv_heads") or None),
        "ln2": al.spec((d,), ("d_model",), dt),
        "w1": al.spec((d, f), ("d_model", "d_ff"), dt),
        "w2": al.spec((f, d), ("d_ff", "d_model"), dt),
    }
    if mlp == "swiglu":
        p["w3"] = al.spec((d, f), ("d_model", "d_ff"), dt)
    return p


def block(x, p, mlp: str, attention: str = "naive", rotary: bool = False):
    x = x + nn.attention(nn.rms_norm(x, p["ln1"]), p, causal=True, kind=attention, rotary=rotary)
    return x + nn.mlp(nn.rms_norm(x, p["ln2"]), p, mlp)


def workload(
    size: str = "tiny",
    mlp: str = "gelu",
    remat: str = "none",
    scan: bool = False,
    dtype: str | None = None,
    attention: str = "auto",
    **overrides,
) -> al.Workload:
    c = nn.config(SIZES, size, overrides, "size, mlp, remat, scan, dtype, attention")
    llama = size.startswith("llama")
    if llama:  # Llama's block: grouped-query attention, rotary positions, SwiGLU
        mlp = "swiglu"
    dt = nn.dtype_of(dtype or ("float32" if size in ("tiny", "llama-tiny") else "bfloat16"))
    attention = nn.attention_for(attention, dt)
    L, d, V, S, B = c["layers"], c["d_model"], c["vocab"], c["seq"], c["batch"]
    layer = layer_specs(c, mlp, dt)
    params = {
        "embed": al.spec((V, d), ("vocab", "d_model"), dt),
        **({} if llama else {"pos": al.spec((S, d), ("seq", "d_model"), dt)}),
        "layers": nn.stack(layer, L) if scan else [layer] * L,
        "ln_f": al.spec((d,), ("d_model",), dt),
        "unembed": al.spec((d, V), ("d_model", "vocab"), dt),
    }
    batch = {
        "tokens": al.spec((B, S), ("batch", "seq"), jnp.int32),
        "targets": al.spec((B, S), ("batch", "seq"), jnp.int32),
    }
    body = nn.remat(lambda x, p: block(x, p, mlp, attention, rotary=llama), remat)

    def loss_fn(params, batch):
        x = params["embed"][batch["tokens"]]
        if not llama:
            x = x + params["pos"][None]
        if scan:
            with jax.named_scope("layers"):
                x, _ = lax.scan(lambda x, p: (body(x, p), None), x, params["layers"])
        else:
            for i, p in enumerate(params["layers"]):
                with jax.named_scope(f"layers.{i}"):
                    x = body(x, p)
        logits = jnp.einsum("bsd,dv->bsv", nn.rms_norm(x, params["ln_f"]), params["unembed"])
        return nn.cross_entropy(logits, batch["targets"])

    def make_batch(rng):
        toks = np.asarray(rng.integers(0, V, (B, S + 1)), jnp.int32)
        return {"tokens": toks[:, :-1], "targets": toks[:, 1:]}

    options = dict(size=size, mlp=mlp, remat=remat, scan=scan, dtype=jnp.dtype(dt).name,
                   attention=attention, **c)  # fmt: skip
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, batch, make_batch, name=f"gpt-{size}", options=options
    )
