"""A user's small language model with a learned position table (as GPT-2 has) and no dim
names: the table's rows carry the token sequence's dim, which FSDP and sequence parallelism
would both lay out (issue 21's crash: 'two rules for dim seq')."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def workload(d=64, seq=32, vocab=256, batch=16):
    def init(key):
        k = jax.random.split(key, 4)
        return {
            "tok": jax.random.normal(k[0], (vocab, d)) * 0.02,
            "pos": jax.random.normal(k[1], (seq, d)) * 0.02,
            "w1": jax.random.normal(k[2], (d, 4 * d)) * 0.02,
            "w2": jax.random.normal(k[3], (4 * d, d)) * 0.02,
        }

    def loss_fn(p, b):
        x = p["tok"][b["x"]] + p["pos"][None]
        x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        logits = x @ p["tok"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

    def make_batch(rng):
        t = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)
        return {"x": t[:, :-1], "y": t[:, 1:]}

    specs = {k: jax.ShapeDtypeStruct((batch, seq), jnp.int32) for k in ("x", "y")}
    return al.train_workload(loss_fn, optax.adamw(1e-3), init, specs, make_batch)
