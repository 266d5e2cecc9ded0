"""A 3-D U-Net segmentation train step (Adam): the spatial-partitioning case.

At batch 1 on large volumes neither batch nor channels can carry a big mesh; the spatial
dims (``depth``, ``height``, ``width``) must be split, with halo exchanges around each conv
(Mesh-TF's spatial partitioning, Hou et al. 2019). Convs are 3x3x3 "SAME"; each level
halves the volume with a stride-2 conv and the decoder doubles it with a transposed conv;
normalisation reduces over batch and space per channel (batch-norm style).

    autolayout trace experiments/models/unet3d.py --set size=256
"""

from __future__ import annotations

import _blocks as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

import autolayout as al

# fmt: off
SIZES = {
    "tiny": dict(batch=1, volume=16, channels=4, levels=2, in_channels=1, classes=2),
    "128": dict(batch=1, volume=128, channels=32, levels=4, in_channels=1, classes=4),
    "256": dict(batch=1, volume=256, channels=32, levels=4, in_channels=1, classes=4),
}
# fmt: on
DN = ("NDHWC", "DHWIO", "NDHWC")


def conv(x, w, stride: int = 1):
    return lax.conv_general_dilated(x, w, (stride,) * 3, "SAME", dimension_numbers=DN)


def up(x, w):
    return lax.conv_transpose(x, w, (2, 2, 2), "SAME", dimension_numbers=DN)


def norm_relu(x, scale):
    mean = jnp.mean(x, axis=(0, 1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2, 3), keepdims=True)
    return jax.nn.relu((x - mean) * lax.rsqrt(var + 1e-5) * scale)


def unet_loss(params, batch, down) -> jax.Array:
    """The U-Net's loss: an encoder of conv, norm and strided conv levels, a decoder of
    transposed convs joined to the skips; ``down(x, level)`` names each downsampled
    activation's dims."""
    x = conv(batch["image"], params["stem"])
    skips = []
    n = len(params["enc"])
    for i, p in enumerate(params["enc"]):
        with jax.named_scope(f"enc.{i}"):
            x = norm_relu(conv(x, p["conv"]), p["scale"])
            if i < n - 1:
                skips.append(x)
                x = down(conv(x, p["down"], stride=2), i)
    for i, (p, skip) in enumerate(zip(params["dec"], reversed(skips), strict=True)):
        with jax.named_scope(f"dec.{i}"):
            x = jnp.concatenate([up(x, p["up"]), skip], axis=-1)
            x = norm_relu(conv(x, p["conv"]), p["scale"])
    logits = conv(x, params["head"])
    return nn.cross_entropy(logits, batch["labels"])


def workload(size: str = "tiny", dtype: str = "float32", **overrides) -> al.Workload:
    c = nn.config(SIZES, size, overrides, "size, dtype")
    B, V, C, n, cin, K = (
        c[k] for k in ("batch", "volume", "channels", "levels", "in_channels", "classes")
    )
    if V % 2 ** (n - 1):
        raise ValueError(f"volume {V} must be divisible by 2**(levels-1) = {2 ** (n - 1)}")
    dt = nn.dtype_of(dtype)
    kern = ("kd", "kh", "kw")

    def w(ci, co, a, b):
        return al.spec((3, 3, 3, ci, co), (*kern, a, b), dt)

    ch = [C * 2**i for i in range(n)]
    cn = [f"channels{i}" for i in range(n)]
    params = {"stem": w(cin, ch[0], "in_channels", cn[0]), "enc": [], "dec": []}
    for i in range(n):
        params["enc"].append(
            {
                "conv": w(ch[i], ch[i], cn[i], f"{cn[i]}_b"),
                "scale": al.spec((ch[i],), (f"{cn[i]}_b",), dt),
            }
        )
        if i < n - 1:
            params["enc"][-1]["down"] = w(ch[i], ch[i + 1], f"{cn[i]}_b", cn[i + 1])
    for i in reversed(range(n - 1)):
        params["dec"].append({
            "up": w(ch[i + 1], ch[i], f"{cn[i + 1]}_b", f"{cn[i]}_up"),
            "conv": w(2 * ch[i], ch[i], f"{cn[i]}_cat", f"{cn[i]}_dec"),
            "scale": al.spec((ch[i],), (f"{cn[i]}_dec",), dt),
        })  # fmt: skip
    params["head"] = al.spec((1, 1, 1, ch[0], K), (None, None, None, f"{cn[0]}_dec", "classes"), dt)
    space = ("depth", "height", "width")
    batch = {
        "image": al.spec((B, V, V, V, cin), ("batch", *space, "in_channels"), dt),
        "labels": al.spec((B, V, V, V), ("batch", *space), jnp.int32),
    }

    def loss_fn(params, batch):
        def down(x, i):  # level i+1's planes: depth/2, height/2, ... (their own dims)
            return al.name_dims(x, ("batch", *(f"{s}/{2 ** (i + 1)}" for s in space), None))

        return unet_loss(params, batch, down)

    def make_batch(rng):
        return {
            "image": np.asarray(rng.standard_normal((B, V, V, V, cin)), dt),
            "labels": np.asarray(rng.integers(0, K, (B, V, V, V)), jnp.int32),
        }

    options = dict(size=size, dtype=dtype, **c)
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, batch, make_batch, name=f"unet3d-{size}", options=options
    )
