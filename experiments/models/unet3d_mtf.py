"""A 3-D U-Net train step (Adam) with its dims named the Mesh-TensorFlow way.

Mesh-TF's ``mtf.layers.conv3d`` names every kernel's depth, height and width ``fd``/``fh``/
``fw`` whatever its size, and its U-Net reuses one name for every level's channels and
volume: a dim is a name *and* a size, so ``kd`` of size 3 (the 3x3x3 convs) and ``kd`` of
size 2 (the 2x2x2 up-convs) are two dims, ``kd(3)`` and ``kd(2)``, and a layout rule for
``depth`` splits the volume at every level. The same network as ``unet3d.py`` (which gives
every level its own names) but for its up-convs' 2x2x2 kernels.

Names: kernels ``kd``, ``kh``, ``kw``; every conv reads channels ``c`` and writes ``c_out``
(the down- and up-convs back to ``c``); the volume ``depth``, ``height``, ``width`` at every
level.

    autolayout plan experiments/models/unet3d_mtf.py --hw tpu-v4-32 --set size=128
"""

from __future__ import annotations

import _blocks as nn
import jax.numpy as jnp
import numpy as np
import optax
from unet3d import SIZES, unet_loss  # the same network, but for the names

import autolayout as al

KERNEL = ("kd", "kh", "kw")
SPACE = ("depth", "height", "width")


def workload(
    size: str = "tiny", dtype: str = "float32", names: str = "mtf", **overrides
) -> al.Workload:
    """``names="mtf"``: one name a kind of axis; ``"sized"``: the same dims with distinct
    names (``kd3``, ``kd2``, ``c8``, ``depth16``...), as autolayout asked before Mesh-TF's."""
    c = nn.config(SIZES, size, overrides, "size, dtype, names")
    if names not in ("mtf", "sized"):
        raise ValueError(f"names must be 'mtf' or 'sized', got {names!r}")

    def spec(shape, dims, dt):  # Mesh-TF: a dim is a name and a size
        if names == "sized":
            dims = [d and f"{d}{n}" for d, n in zip(dims, shape, strict=True)]
        return al.spec(shape, dims, dt)

    def name_dims(x, dims):
        if names == "sized":
            dims = [d and f"{d}{n}" for d, n in zip(dims, x.shape, strict=True)]
        return al.name_dims(x, dims)

    B, V, C, n, cin, K = (
        c[k] for k in ("batch", "volume", "channels", "levels", "in_channels", "classes")
    )
    if V % 2 ** (n - 1):
        raise ValueError(f"volume {V} must be divisible by 2**(levels-1) = {2 ** (n - 1)}")
    dt = nn.dtype_of(dtype)

    def w(k, ci, co, a, b):  # a k x k x k kernel from channels named a to channels named b
        return spec((k, k, k, ci, co), (*KERNEL, a, b), dt)

    ch = [C * 2**i for i in range(n)]
    params = {"stem": w(3, cin, ch[0], "in_channels", "c"), "enc": [], "dec": []}
    for i in range(n):
        params["enc"].append(
            {"conv": w(3, ch[i], ch[i], "c", "c_out"), "scale": spec((ch[i],), ("c_out",), dt)}
        )
        if i < n - 1:
            params["enc"][-1]["down"] = w(3, ch[i], ch[i + 1], "c_out", "c")
    for i in reversed(range(n - 1)):
        params["dec"].append({
            "up": w(2, ch[i + 1], ch[i], "c_out", "c"),
            "conv": w(3, 2 * ch[i], ch[i], "c", "c_out"),
            "scale": spec((ch[i],), ("c_out",), dt),
        })  # fmt: skip
    params["head"] = spec((1, 1, 1, ch[0], K), (None, None, None, "c_out", "classes"), dt)
    batch = {
        "image": spec((B, V, V, V, cin), ("batch", *SPACE, "in_channels"), dt),
        "labels": spec((B, V, V, V), ("batch", *SPACE), jnp.int32),
    }

    def loss_fn(params, batch):
        return unet_loss(params, batch, lambda x, i: name_dims(x, ("batch", *SPACE, "c")))

    def make_batch(rng):
        image = np.asarray(rng.standard_normal((B, V, V, V, cin)), dt)
        return {
            "image": image,
            "labels": np.asarray(rng.integers(0, K, image.shape[:4]), jnp.int32),
        }

    options = dict(size=size, dtype=dtype, names=names, **c)
    return al.train_workload(
        loss_fn, optax.adam(1e-3), params, batch, make_batch, name=f"unet3d-mtf-{size}",
        options=options,
    )  # fmt: skip
