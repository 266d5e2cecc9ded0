"""A decoder written by someone who never read this project: plain JAX, float32, optax AdamW
with gradient clipping, pre-LayerNorm blocks (scale and bias), separate q/k/v projections,
learned positions, a GELU MLP with biases, unrolled layers, no dim names, no scopes. It stands
for issue 34's user model (an 8-layer transformer planned under half of FSDP's memory with
``remat="auto"``); tests/test_memory_strangers.py compiles its remat plans.

Options: ``layers``, ``d_model``, ``heads``, ``d_ff``, ``vocab``, ``seq``, ``batch``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def workload(layers=8, d_model=256, heads=4, d_ff=1024, vocab=1024, seq=256, batch=16):
    def init(key):
        k = jax.random.split(key, 3 + 6 * layers)
        glorot = jax.nn.initializers.glorot_normal()
        p = {
            "tok": 0.02 * jax.random.normal(k[0], (vocab, d_model)),
            "pos": 0.01 * jax.random.normal(k[1], (seq, d_model)),
            "head": glorot(k[2], (d_model, vocab)),
            "ln_f": {"g": jnp.ones(d_model), "b": jnp.zeros(d_model)},
            "layers": [],
        }
        for i in range(layers):
            kk = k[3 + 6 * i : 9 + 6 * i]
            p["layers"].append(
                {
                    "ln1": {"g": jnp.ones(d_model), "b": jnp.zeros(d_model)},
                    "ln2": {"g": jnp.ones(d_model), "b": jnp.zeros(d_model)},
                    "wq": glorot(kk[0], (d_model, d_model)),
                    "wk": glorot(kk[1], (d_model, d_model)),
                    "wv": glorot(kk[2], (d_model, d_model)),
                    "wo": glorot(kk[3], (d_model, d_model)),
                    "w_in": glorot(kk[4], (d_model, d_ff)),
                    "b_in": jnp.zeros(d_ff),
                    "w_out": glorot(kk[5], (d_ff, d_model)),
                    "b_out": jnp.zeros(d_model),
                }
            )
        return p

    def layer_norm(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p["g"] + p["b"]

    def attention(x, p):
        b, s, d = x.shape
        hd = d // heads

        def split_heads(t):
            return t.reshape(b, s, heads, hd).transpose(0, 2, 1, 3)

        q, k, v = (split_heads(x @ p[w]) for w in ("wq", "wk", "wv"))
        scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(hd).astype(x.dtype)
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))
        scores = jnp.where(causal[None, None], scores, jnp.finfo(x.dtype).min)
        out = jax.nn.softmax(scores, axis=-1) @ v
        return out.transpose(0, 2, 1, 3).reshape(b, s, d) @ p["wo"]

    def mlp(x, p):
        return jax.nn.gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]

    def loss_fn(params, batch):
        x = params["tok"][batch["inputs"]] + params["pos"][None]
        for p in params["layers"]:
            x = x + attention(layer_norm(x, p["ln1"]), p)
            x = x + mlp(layer_norm(x, p["ln2"]), p)
        logits = layer_norm(x, params["ln_f"]) @ params["head"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1).mean()

    def make_batch(rng):
        tokens = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    specs = {k: jax.ShapeDtypeStruct((batch, seq), jnp.int32) for k in ("inputs", "targets")}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(3e-4, weight_decay=0.1))
    return al.train_workload(loss_fn, opt, init, specs, make_batch, name="stranger_lm")
