"""A small decoder written the way a user writes one: plain JAX, float32, optax AdamW, no dim
names (the tracer names them), its own initialiser. The README's model-file example.

    autolayout plan experiments/models/my_transformer.py --hw cpu-8 --out plan.json
    autolayout run experiments/models/my_transformer.py --plan plan.json --steps 5

Options: ``layers``, ``d_model``, ``heads``, ``d_ff``, ``vocab``, ``seq``, ``batch``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def workload(layers=4, d_model=512, heads=8, d_ff=2048, vocab=1024, seq=64, batch=16):
    L, D, H, F, V, S, B = layers, d_model, heads, d_ff, vocab, seq, batch

    def init(key):
        keys = iter(jax.random.split(key, 4 * L + 2))

        def normal(*shape):
            return 0.02 * jax.random.normal(next(keys), shape, jnp.float32)

        blocks = [
            {
                "wqkv": normal(D, 3 * D),
                "wo": normal(D, D),
                "w_in": normal(D, F),
                "w_out": normal(F, D),
                "g1": jnp.ones(D),
                "g2": jnp.ones(D),
            }
            for _ in range(L)
        ]
        return {"emb": normal(V, D), "blocks": blocks, "out": normal(D, V)}

    def norm(x, g):
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g

    def loss_fn(params, batch):
        x = params["emb"][batch["x"]]
        for b in params["blocks"]:
            q, k, v = jnp.split(norm(x, b["g1"]) @ b["wqkv"], 3, axis=-1)
            q, k, v = (t.reshape(B, S, H, D // H) for t in (q, k, v))
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
            s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
            a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(B, S, D)
            x = x + a @ b["wo"]
            x = x + jax.nn.gelu(norm(x, b["g2"]) @ b["w_in"]) @ b["w_out"]
        logits = x @ params["out"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def make_batch(rng):
        tokens = rng.integers(0, V, (B, S + 1)).astype(np.int32)
        return {"x": tokens[:, :-1], "y": tokens[:, 1:]}

    batch = {
        "x": jax.ShapeDtypeStruct((B, S), jnp.int32),
        "y": jax.ShapeDtypeStruct((B, S), jnp.int32),
    }
    return al.train_workload(loss_fn, optax.adamw(1e-3), init, batch, make_batch, name="my_tf")
