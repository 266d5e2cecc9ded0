"""Every ``keras.applications`` family (its modules: ConvNeXt, DenseNet, EfficientNet, ...),
``weights=None``, logits out (``classifier_activation=None``), trained on Keras 3's JAX
backend through ``model.stateless_call(..., training=True)`` as Keras documents custom JAX
training loops: the non-trainable variables (BatchNorm's moving statistics, dropout's seed
state) are the step's state. Built under ``jax.eval_shape``: no variable is allocated.

Tiny: a small input (the family's least: 32, or 71/75 for Xception and the Inceptions) and,
where the family's constructor takes them, fewer blocks and less width (ConvNeXt's
``depths``, DenseNet's ``blocks``, EfficientNet's coefficients, NASNet's blocks, ResNet's
stacks, MobileNet's ``alpha``); the Inceptions, Xception and VGG have no such argument and are
whole. Published: the family's first constructor at its default input, 1,000 classes.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
from _steps import config, image_workload  # noqa: E402
from keras.src.applications import (  # noqa: E402
    convnext,
    densenet,
    efficientnet,
    efficientnet_v2,
    nasnet,
    resnet,
)

import autolayout as al  # noqa: E402

APPS = keras.applications


def _resnet(block: Callable, preact: bool, blocks: int) -> Callable:
    """ResNet (v1, or v2 with ``preact``) of two stacks of ``blocks`` (8 and 16 filters; v2
    names its first and last block alike, so it has two)."""

    def stacks(x):
        x = block(x, 8, blocks, stride1=1, name="conv2")
        return block(x, 16, blocks, name="conv3")

    return lambda **kw: resnet.ResNet(stacks, preact, True, name="resnet_tiny", **kw)


# family -> (its module's name, the tiny model, its input side), (published constructor, side)
# fmt: off
FAMILIES: dict[str, tuple[tuple[Callable, int], tuple[Callable, int]]] = {
    "convnext": ((lambda **kw: convnext.ConvNeXt([1, 1, 1, 1], [16, 32, 64, 128],
                                                 name="convnext_tiny", **kw), 32),
                 (APPS.ConvNeXtBase, 224)),
    "densenet": ((lambda **kw: densenet.DenseNet([1, 1, 1, 1], name="densenet_tiny", **kw), 32),
                 (APPS.DenseNet121, 224)),
    "efficientnet": ((lambda **kw: efficientnet.EfficientNet(0.25, 0.1, 32,
                                                             name="efficientnet_tiny", **kw), 32),
                     (APPS.EfficientNetB0, 224)),
    "efficientnet_v2": ((lambda **kw: efficientnet_v2.EfficientNetV2(
                             0.25, 0.1, 32, name="efficientnetv2-b0", **kw), 32),
                        (APPS.EfficientNetV2S, 384)),
    "inception_resnet_v2": ((APPS.InceptionResNetV2, 75), (APPS.InceptionResNetV2, 299)),
    "inception_v3": ((APPS.InceptionV3, 75), (APPS.InceptionV3, 299)),
    "mobilenet": ((lambda **kw: APPS.MobileNet(alpha=0.25, **kw), 32), (APPS.MobileNet, 224)),
    "mobilenet_v2": ((lambda **kw: APPS.MobileNetV2(alpha=0.35, **kw), 32),
                     (APPS.MobileNetV2, 224)),
    "mobilenet_v3": ((lambda **kw: APPS.MobileNetV3Small(alpha=0.75, minimalistic=True, **kw), 32),
                     (APPS.MobileNetV3Large, 224)),
    "nasnet": ((lambda **kw: nasnet.NASNet(penultimate_filters=96, num_blocks=1,
                                           stem_block_filters=8, name="nasnet_tiny", **kw), 32),
               (APPS.NASNetMobile, 224)),
    "resnet": ((_resnet(resnet.stack_residual_blocks_v1, False, 1), 32), (APPS.ResNet50, 224)),
    "resnet_v2": ((_resnet(resnet.stack_residual_blocks_v2, True, 2), 32), (APPS.ResNet50V2, 224)),
    "vgg16": ((APPS.VGG16, 32), (APPS.VGG16, 224)),
    "vgg19": ((APPS.VGG19, 32), (APPS.VGG19, 224)),
    "xception": ((APPS.Xception, 71), (APPS.Xception, 299)),
}
# fmt: on
# the families built of depthwise-separable convolutions (memory-bound: their MFU is low)
DEPTHWISE = (
    "efficientnet",
    "efficientnet_v2",
    "mobilenet",
    "mobilenet_v2",
    "mobilenet_v3",
    "nasnet",
    "xception",
)  # fmt: skip
ALIASES = {"resnet50": "resnet"}  # keras.applications.resnet50: ResNet50 of the resnet module
PUBLISHED = {f: getattr(pub, "__name__", f) for f, (_, (pub, _)) in FAMILIES.items()}
# the tiny step: 8 images of 10 classes; the published one: 1,024 images of 1,000
STEPS = {"tiny": dict(batch=8, classes=10), "published": dict(batch=1024, classes=1000)}


def _constants_made(model: keras.Model) -> keras.Model:
    """The constants a ``Normalization`` layer makes while it is built (its given mean and
    variance: ConvNeXt's, EfficientNetV2's; or its adapted ones, read from its variables:
    EfficientNet's) are tracers of the ``jax.eval_shape`` that built the model, and the layer
    reads them, not its variables: made again, for real, from their initial values (a step
    closing over tracers would not run)."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.Normalization):
            if layer.input_mean is not None:
                layer.build(layer._build_input_shape)
            else:  # not adapted: zero mean, unit variance, as its initializers make them
                layer.adapt_mean.assign(jnp.zeros(layer.adapt_mean.shape))
                layer.adapt_variance.assign(jnp.ones(layer.adapt_variance.shape))
                layer.finalize_state()
        leaked = [k for k, v in vars(layer).items() if isinstance(v, jax.core.Tracer)]
        if leaked:
            raise RuntimeError(f"{model.name}: layer {layer.name} holds tracers {leaked}")
    return model


def build(family: str, size: str = "tiny", dtype: str = "") -> al.Workload:
    """The ``family``'s classifier at ``size`` ("tiny" or "published")."""
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()!r}; set KERAS_BACKEND=jax")
    c, dt = config(STEPS, size, {}, dtype)
    make, side = FAMILIES[family][0 if size == "tiny" else 1]
    c = {**c, "image": side}
    holder = {}

    def made():  # the model's structure; its variables' values are never made
        policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy(dt.name)
        try:
            holder["model"] = make(weights=None, input_shape=(side, side, 3),
                                   classes=c["classes"], classifier_activation=None)  # fmt: skip
        finally:
            keras.config.set_dtype_policy(policy)
        return ({v.path: v.value for v in holder["model"].trainable_variables},
                {v.path: v.value for v in holder["model"].non_trainable_variables})  # fmt: skip

    shapes, frozen = jax.eval_shape(made)
    model = _constants_made(holder["model"])
    # the variables in the model's order (the specs' dicts are sorted)
    paths = [v.path for v in model.trainable_variables]
    stats = [v.path for v in model.non_trainable_variables]

    def init(key):  # He-normal kernels (fan-in: every axis but the last); scales 1, shifts 0
        keys = dict(zip(shapes, jax.random.split(key, len(shapes)), strict=True))
        return {p: jax.random.normal(keys[p], s.shape, s.dtype) * (2 / (s.size // s.shape[-1])) ** 0.5
                if s.ndim > 1 else jnp.full(s.shape, p.endswith("gamma"), s.dtype)
                for p, s in shapes.items()}  # fmt: skip

    def init_state(key):  # moving variances 1, the rest (means, seed states) 0
        return {p: jnp.full(s.shape, p.endswith("variance"), s.dtype) for p, s in frozen.items()}

    def apply(params, state, images):
        out, new = model.stateless_call([params[p] for p in paths], [state[p] for p in stats],
                                        images, training=True)  # fmt: skip
        return out, dict(zip(stats, new, strict=True))

    options, name = dict(entry=f"keras_{family}", size=size), f"keras_{family}-{size}"
    if not frozen:  # no non-trainable variable (VGG)
        return image_workload(name, lambda p, x: apply(p, {}, x)[0], init, c, options)
    return image_workload(name, apply, init, c, options, state=init_state)
