"""A multi-layer perceptron regression train step (Adam): the smallest example.

autolayout trace experiments/models/mlp.py --set hidden=4096 --set layers=4
"""

from __future__ import annotations

import _blocks as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import autolayout as al


def workload(
    batch: int = 32,
    d_in: int = 64,
    hidden: int = 256,
    d_out: int = 16,
    layers: int = 2,
    dtype: str = "float32",
) -> al.Workload:
    if layers < 2:
        raise ValueError(f"layers must be at least 2, got {layers}")
    dt = nn.dtype_of(dtype)
    names = ["d_in"] + [f"hidden{i}" for i in range(1, layers)] + ["d_out"]
    sizes = [d_in] + [hidden] * (layers - 1) + [d_out]
    params = {
        f"w{i}": al.spec((sizes[i], sizes[i + 1]), (names[i], names[i + 1]), dt)
        for i in range(layers)
    }
    params |= {f"b{i}": al.spec((sizes[i + 1],), (names[i + 1],), dt) for i in range(layers)}
    data = {
        "x": al.spec((batch, d_in), ("batch", "d_in"), dt),
        "y": al.spec((batch, d_out), ("batch", "d_out"), dt),
    }

    def loss_fn(params, data):
        h = data["x"]
        for i in range(layers):
            with jax.named_scope(f"layers.{i}"):
                h = h @ params[f"w{i}"] + params[f"b{i}"]
                if i < layers - 1:
                    h = jax.nn.relu(h)
        return jnp.mean((h - data["y"]) ** 2)

    def make_batch(rng):
        return {
            "x": np.asarray(rng.standard_normal((batch, d_in)), dt),
            "y": np.asarray(rng.standard_normal((batch, d_out)), dt),
        }

    options = dict(batch=batch, d_in=d_in, hidden=hidden, d_out=d_out, layers=layers, dtype=dtype)
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, data, make_batch, name="mlp", options=options
    )
