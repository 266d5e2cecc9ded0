"""A plain-JAX MLP whose residual layers share one weight, run by ``lax.fori_loop`` (a
stranger's model, written from the README; float32, no dim named):

    h = x @ w_in;  3 times: h = h + tanh(h @ w_res + b_res)

The square ``w_res`` maps the residual stream to itself, so its two axes are two dims.

    autolayout plan experiments/models/corpus/loop_shared.py --hw cpu-8 --time-limit 10
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def workload(d_in=64, hidden=128, batch=32, trips=3):
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"w_in": jax.random.normal(k1, (d_in, hidden)) / 8.0,
                "w_res": jax.random.normal(k2, (hidden, hidden)) / 11.3,
                "b_res": jnp.zeros(hidden)}  # fmt: skip

    def loss_fn(p, b):
        h = b["x"] @ p["w_in"]
        h = jax.lax.fori_loop(0, trips, lambda i, h: h + jnp.tanh(h @ p["w_res"] + p["b_res"]), h)
        return jnp.mean((h - b["y"]) ** 2)

    spec = {"x": jax.ShapeDtypeStruct((batch, d_in), jnp.float32),
            "y": jax.ShapeDtypeStruct((batch, hidden), jnp.float32)}  # fmt: skip

    def make_batch(rng):
        return {"x": rng.standard_normal((batch, d_in), np.float32),
                "y": rng.standard_normal((batch, hidden), np.float32)}  # fmt: skip

    return al.train_workload(loss_fn, optax.adamw(1e-3), init, spec, make_batch)
