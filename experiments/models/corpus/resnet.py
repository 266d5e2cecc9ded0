"""A ResNet in Keras 3 on its JAX backend, trained through ``model.stateless_call`` the way
Keras documents custom JAX training loops (no dim named): a tiny residual network of
``Conv2D``, ``BatchNormalization``, ``MaxPooling2D``, a grouped and a depthwise convolution
and ``GlobalAveragePooling2D`` at ``size=tiny``; ``keras.applications.ResNet50`` at
``size=resnet50`` (224x224 images; its variables never allocated: built under
``jax.eval_shape``). BatchNorm's moving statistics are read as zeros and their updates
dropped (the step's contract has no non-trainable state yet).

    autolayout plan experiments/models/corpus/resnet.py --set size=resnet50 --hw h100-64
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from _images import image_workload  # noqa: E402

import autolayout as al  # noqa: E402

SIZES = {
    "tiny": dict(batch=16, image=32, classes=10),
    "resnet50": dict(batch=256, image=224, classes=1000),
}


def tiny(image: int, classes: int) -> keras.Model:
    L = keras.layers
    inp = keras.Input((image, image, 3))
    x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False)(inp)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.MaxPooling2D(3, strides=2, padding="same")(x)
    for filters in (16, 32):
        y = L.Conv2D(filters, 1, use_bias=False)(x)
        y = L.ReLU()(L.BatchNormalization()(y))
        y = L.Conv2D(filters, 3, padding="same", groups=4, use_bias=False)(y)
        y = L.DepthwiseConv2D(3, padding="same", use_bias=False)(y)
        y = L.BatchNormalization()(y)
        if x.shape[-1] != filters:
            x = L.Conv2D(filters, 1, use_bias=False)(x)
        x = L.ReLU()(L.Add()([x, y]))
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inp, L.Dense(classes)(x))


def workload(size: str = "tiny", **overrides) -> al.Workload:
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {', '.join(SIZES)}")
    c = {**SIZES[size], **{k: int(v) for k, v in overrides.items()}}
    H, K = c["image"], c["classes"]
    holder = {}

    def make():  # the model's structure; its variables' values are never made
        if size == "resnet50":
            m = keras.applications.ResNet50(weights=None, input_shape=(H, H, 3), classes=K)
        else:
            m = tiny(H, K)
        holder["model"] = m
        return ({v.path: v.value for v in m.trainable_variables},
                [v.value for v in m.non_trainable_variables])  # fmt: skip

    shapes, frozen = jax.eval_shape(make)
    model = holder["model"]
    paths = [v.path for v in model.trainable_variables]

    def init(key):
        keys = jax.random.split(key, len(shapes))
        return {p: 0.05 * jax.random.normal(k, s.shape, s.dtype) if s.ndim > 1 else
                   (jnp.ones if p.endswith("gamma") else jnp.zeros)(s.shape, s.dtype)
                for k, (p, s) in zip(keys, shapes.items(), strict=True)}  # fmt: skip

    def logits(params, images):
        stats = [jnp.zeros(s.shape, s.dtype) for s in frozen]
        out, _ = model.stateless_call([params[p] for p in paths], stats, images, training=True)
        return out

    return image_workload(f"resnet-{size}", logits, init, c, dict(size=size, **overrides))
