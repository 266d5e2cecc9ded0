"""A user's MLP-stack LM as one might write it for MaxText-style remat: float32, no
``al.spec`` names, the MLP's matmul outputs tagged with ``checkpoint_name`` ("mlpwi",
"mlpwo"), the layers scanned over stacked weights (``scan=true``) or a list of layers.
What ``save_only_these_names:...`` and ``+offload`` are tested on
(``tests/test_remat.py``) and measured with (``experiments/device_check.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.ad_checkpoint import checkpoint_name

import autolayout as al


def workload(d=128, ff=512, seq=64, batch=16, vocab=256, layers=3, scan=False):
    def init(key):  # scanned: stacked weights; unrolled: a list of layers
        ks = jax.random.split(key, 3)
        p = {"emb": jax.random.normal(ks[0], (vocab, d)) * 0.02,
             "up": jax.random.normal(ks[1], (layers, d, ff)) * 0.02,
             "down": jax.random.normal(ks[2], (layers, ff, d)) * 0.02}  # fmt: skip
        return p if scan else {"emb": p["emb"], "up": list(p["up"]), "down": list(p["down"])}

    def block(x, up, down):
        h = checkpoint_name(jnp.tanh(x) @ up, "mlpwi")
        return x + checkpoint_name(jax.nn.gelu(h) @ down, "mlpwo")

    def loss_fn(p, b):
        x = p["emb"][b["x"]]
        if scan:
            x, _ = jax.lax.scan(lambda x, w: (block(x, *w), None), x, (p["up"], p["down"]))
        else:
            for i in range(layers):
                x = block(x, p["up"][i], p["down"][i])
        logits = x @ p["emb"].T
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

    def make_batch(rng):
        t = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)
        return {"x": t[:, :-1], "y": t[:, 1:]}

    return al.train_workload(loss_fn, optax.sgd(1e-2), init,
                             make_batch(np.random.default_rng(0)), make_batch)  # fmt: skip
