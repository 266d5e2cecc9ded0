"""Equinox's and Flax NNX's own example models, as their documentation writes them.

Equinox: ``eqx.nn.MLP`` (its "getting started"), the CNN of its MNIST example, the GRU of its
"Train RNN" example (``lax.scan`` over ``eqx.nn.GRUCell``), vmapped over the batch as
Equinox models are, and the ViT of ``libraries/eqx_vit.py``. NNX: the ``MLP`` of "Flax
basics" (``Linear``, ``Dropout``, ``BatchNorm``: its batch statistics and its dropout RNG
are the step's state), the CNN of the MNIST tutorial, and the LM of ``libraries/nnx_lm.py``.

Tiny: the example's layers at small widths, 8 examples. Published: the example's own
widths, a step of 64 examples per chip of a 128-chip slice (8,192), as its tutorial
trains 32 to 64 per step on one device.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from _steps import LIBRARIES, cast, config, image_workload
from flax import nnx

import autolayout as al

PUBLISHED_BATCH = 8192


class EqxCNN(eqx.Module):
    """Equinox's MNIST example (``docs/examples/mnist.ipynb``), ``width`` its 512."""

    layers: list

    def __init__(self, key, width=512, side=28):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        flat = 3 * (side - 4) ** 2  # 1728 at 28x28
        self.layers = [
            eqx.nn.Conv2d(1, 3, kernel_size=4, key=k1),
            eqx.nn.MaxPool2d(kernel_size=2),
            jax.nn.relu,
            jnp.ravel,
            eqx.nn.Linear(flat, width, key=k2),
            jax.nn.sigmoid,
            eqx.nn.Linear(width, 64, key=k3),
            jax.nn.relu,
            eqx.nn.Linear(64, 10, key=k4),
            jax.nn.log_softmax,
        ]

    def __call__(self, x):  # x [1, 28, 28]
        for layer in self.layers:
            x = layer(x)
        return x


class EqxRNN(eqx.Module):
    """Equinox's "Train RNN" example: a GRU cell scanned over the sequence, one logit."""

    hidden_size: int
    cell: eqx.nn.GRUCell
    linear: eqx.nn.Linear
    bias: jax.Array

    def __init__(self, in_size, out_size, hidden_size, *, key):
        ckey, lkey = jax.random.split(key)
        self.hidden_size = hidden_size
        self.cell = eqx.nn.GRUCell(in_size, hidden_size, key=ckey)
        self.linear = eqx.nn.Linear(hidden_size, out_size, use_bias=False, key=lkey)
        self.bias = jnp.zeros(out_size)

    def __call__(self, inputs):  # inputs [seq, in_size]
        def f(carry, inp):
            return self.cell(inp, carry), None

        out, _ = jax.lax.scan(f, jnp.zeros((self.hidden_size,)), inputs)
        return self.linear(out) + self.bias  # the example's sigmoid is in the loss


class NnxMLP(nnx.Module):
    """The ``MLP`` of Flax's "Flax basics" (NNX)."""

    def __init__(self, din, dmid, dout, *, rngs):
        self.linear1 = nnx.Linear(din, dmid, rngs=rngs)
        self.dropout = nnx.Dropout(rate=0.1, rngs=rngs)
        self.bn = nnx.BatchNorm(dmid, rngs=rngs)
        self.linear2 = nnx.Linear(dmid, dout, rngs=rngs)

    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.gelu(self.dropout(self.bn(self.linear1(x)))))


class NnxCNN(nnx.Module):
    """The CNN of Flax's MNIST tutorial (NNX), ``width`` its 256."""

    def __init__(self, *, rngs, width=256, side=28):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.linear1 = nnx.Linear(64 * (side // 4) ** 2, width, rngs=rngs)  # 3136 at 28x28
        self.linear2 = nnx.Linear(width, 10, rngs=rngs)

    def __call__(self, x):  # x [batch, 28, 28, 1]
        def pool(y):
            return nnx.avg_pool(y, window_shape=(2, 2), strides=(2, 2))

        x = pool(nnx.relu(self.conv1(x)))
        x = pool(nnx.relu(self.conv2(x)))
        x = x.reshape(x.shape[0], -1)
        return self.linear2(nnx.relu(self.linear1(x)))


# entry -> (tiny, published) shapes: the step's batch, the image side and the model's widths
# fmt: off
SIZES = {
    "eqx_mlp": (dict(batch=8, image=8, width=32, depth=2),
                dict(batch=PUBLISHED_BATCH, image=28, width=4096, depth=2)),
    "eqx_cnn": (dict(batch=8, image=12, width=32), dict(batch=PUBLISHED_BATCH, image=28, width=512)),
    "eqx_rnn": (dict(batch=8, seq=8, hidden=16), dict(batch=PUBLISHED_BATCH, seq=16, hidden=16)),
    "nnx_mlp": (dict(batch=8, image=8, width=32), dict(batch=PUBLISHED_BATCH, image=28, width=4096)),
    "nnx_cnn": (dict(batch=8, image=8, width=32), dict(batch=PUBLISHED_BATCH, image=28, width=256)),
}
# fmt: on
WRAPPED = {"eqx_vit": ("eqx_vit.py", "vit-l16"), "nnx_lm": ("nnx_lm.py", "base")}
PUBLISHED = {
    "eqx_mlp": "eqx.nn.MLP 784-4096-4096-10",
    "eqx_cnn": "Equinox MNIST CNN",
    "eqx_rnn": "Equinox Train-RNN GRU (hidden 16)",
    "nnx_mlp": "Flax basics MLP 784-4096-10",
    "nnx_cnn": "Flax MNIST tutorial CNN",
    **{k: v[1] for k, v in WRAPPED.items()},
}
FAMILY = {"eqx_rnn": "sequence-classification", "eqx_vit": "image-classification",
          "nnx_lm": "causal-lm"}  # the rest: image classification  # fmt: skip


def build(name: str, size: str = "tiny", dtype: str = "") -> al.Workload:
    """The example ``name`` at ``size`` ("tiny" or "published")."""
    if name in WRAPPED:
        file, published = WRAPPED[name]
        return al.load_workload(LIBRARIES / file, size="tiny" if size == "tiny" else published,
                                dtype=dtype)  # fmt: skip
    tiny, pub = SIZES[name]
    c, dt = config({"tiny": tiny, "published": pub}, size, {}, dtype)
    c = {**c, "classes": 10, "channels": 1}
    options, wl_name = dict(entry=name, size=size), f"{name}-{size}"
    if name == "eqx_rnn":
        return _eqx_rnn(wl_name, c, dt, options)
    if name.startswith("eqx_"):
        if name == "eqx_mlp":

            def make(key):
                return eqx.nn.MLP(c["image"] ** 2, 10, c["width"], c["depth"], key=key)
        else:

            def make(key):
                return EqxCNN(key, c["width"], c["image"])

        static, init = _eqx(make, dt)

        def apply(params, images):
            model = eqx.combine(params, static)
            x = images.astype(dt)
            return jax.vmap(model)(x.reshape(x.shape[0], -1) if name == "eqx_mlp" else x)

        return image_workload(wl_name, apply, init, c, options, channels_first=True)
    if name == "nnx_mlp":

        def make(rngs):
            return NnxMLP(c["image"] ** 2, c["width"], 10, rngs=rngs)
    else:

        def make(rngs):
            return NnxCNN(rngs=rngs, width=c["width"], side=c["image"])

    graphdef, _, _ = nnx.split(nnx.eval_shape(lambda: make(nnx.Rngs(0))), nnx.Param, ...)

    def parts(key):  # the parameters, and the rest (batch statistics, RNG state)
        _, params, rest = nnx.split(make(nnx.Rngs(params=key, dropout=key)), nnx.Param, ...)
        return jax.tree.map(lambda v: v.replace(cast(v[...], dt)), params,
                            is_leaf=lambda v: isinstance(v, nnx.Variable)), rest  # fmt: skip

    def apply(params, rest, images):
        model = nnx.merge(graphdef, params, rest)
        model.train()
        logits = model(images.astype(dt))
        return logits, nnx.state(model, nnx.Not(nnx.Param))

    if not jax.tree.leaves(jax.eval_shape(lambda k: parts(k)[1], jax.random.key(0))):
        return image_workload(wl_name, lambda p, x: apply(p, {}, x)[0],
                              lambda k: parts(k)[0], c, options)  # fmt: skip
    return image_workload(wl_name, apply, lambda k: parts(k)[0], c, options,
                          state=lambda k: parts(k)[1])  # fmt: skip


def _eqx(make, dt) -> tuple:
    """An Equinox model's static part (its structure: no array) and ``init(key)`` of its
    arrays as ``dt``, from ``make(key) -> model``."""
    static = eqx.filter(eqx.filter_eval_shape(make, jax.random.key(0)),
                        lambda x: isinstance(x, jax.ShapeDtypeStruct), inverse=True)  # fmt: skip
    return static, lambda key: cast(eqx.filter(make(key), eqx.is_array), dt)


def _eqx_rnn(name: str, c: dict, dt, options: dict) -> al.Workload:
    """The "Train RNN" example's step: points of a spiral [batch, seq, 2], a 0/1 label, the
    binary cross-entropy of the one logit, AdamW."""
    B, S = c["batch"], c["seq"]

    def make(key):
        return EqxRNN(2, 1, c["hidden"], key=key)

    static, init = _eqx(make, dt)

    def loss(params, batch):
        logit = jax.vmap(eqx.combine(params, static))(batch["points"].astype(dt))[:, 0]
        return optax.sigmoid_binary_cross_entropy(logit.astype(jnp.float32), batch["labels"]).mean()

    def make_batch(rng: np.random.Generator):
        return {"points": rng.standard_normal((B, S, 2), np.float32),
                "labels": rng.integers(0, 2, (B,)).astype(np.float32)}  # fmt: skip

    data = {"points": jax.ShapeDtypeStruct((B, S, 2), jnp.float32),
            "labels": jax.ShapeDtypeStruct((B,), jnp.float32)}  # fmt: skip
    return al.train_workload(loss, optax.adamw(3e-3), init, data, make_batch, name=name,
                             options=options)  # fmt: skip
