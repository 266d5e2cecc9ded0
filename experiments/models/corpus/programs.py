"""A corpus of small programs written the way users of each library write them: jax.numpy,
jax.lax, jax.nn, jax.random, optax updates, Flax linen and NNX layers, Equinox layers and
Keras 3 layers on its JAX backend. Each is a train-step-like function (a loss and its
gradient, where the op has one) over tiny shapes, so its jaxpr holds the primitives the
library emits forward and backward. ``tests/test_primitives.py`` walks them: every
primitive must have a dim rule or a stated policy, and each program must trace with no
opaque op.

    python experiments/models/corpus/programs.py      # the primitives each program emits
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

F32 = jnp.float32
Program = tuple[Callable[..., Any], tuple[Any, ...]]


def sd(*shape: int, dtype: Any = F32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _step(loss: Callable[..., jax.Array]) -> Callable[..., Any]:
    """The loss and its gradient in the first argument (a whole step's primitives)."""
    return jax.value_and_grad(loss)


def _sum(x: Any) -> jax.Array:
    return sum(jnp.sum(jnp.asarray(v, F32) ** 2) for v in jax.tree.leaves(x))


# --- jax.numpy ------------------------------------------------------------------------------


def numpy_programs() -> dict[str, Program]:
    x, w = sd(8, 16), sd(16, 32)
    return {
        "stack_unstack": (
            _step(lambda a: _sum(jnp.unstack(jnp.stack([a, 2 * a, a * a], axis=1), axis=2))),
            (sd(8, 4, 6),),
        ),
        "rotary_stack": (
            _step(lambda q: _sum(_rotary(q))),
            (sd(2, 16, 4, 8),),
        ),
        "concatenate_split": (
            _step(lambda a: _sum(jnp.split(jnp.concatenate([a, a[:, :4]], axis=1), [3], axis=1))),
            (x,),
        ),
        "cumulative": (
            _step(
                lambda a: (
                    _sum(jnp.cumsum(a, 1))
                    + _sum(jnp.cumprod(a, 0))
                    + _sum(lax.cummax(a, 1))
                    + _sum(lax.cummin(a, 0))
                    + _sum(lax.cumlogsumexp(a, 1))
                )
            ),
            (x,),
        ),
        "sort_argsort_topk": (
            _step(
                lambda a: (
                    _sum(jnp.sort(a, 1))
                    + _sum(jnp.take_along_axis(a, jnp.argsort(a, 0), 0))
                    + _sum(lax.top_k(a, 3)[0])
                    + _sum(lax.approx_max_k(a, 2)[0])
                )
            ),
            (x,),
        ),
        "indexing": (
            _step(
                lambda a, i: (
                    _sum(a[i])
                    + _sum(a[:, 2:7:2])
                    + _sum(a.at[i].add(1.0))
                    + _sum(a.at[i].set(2.0))
                    + _sum(a.at[i].mul(2.0))
                    + _sum(a.at[i].min(0.0))
                    + _sum(a.at[i].max(0.0))
                    + _sum(jnp.take(a, i, axis=1))
                    + _sum(a.at[:, i].get(mode="clip"))
                    + _sum(a.at[i].subtract(1.0))
                )
            ),
            (x, sd(3, dtype=jnp.int32)),
        ),
        "shapes": (
            _step(
                lambda a: (
                    _sum(jnp.tile(a, (2, 1)))
                    + _sum(jnp.repeat(a, 2, axis=0))
                    + _sum(jnp.flip(a, 1))
                    + _sum(jnp.roll(a, 3, 1))
                    + _sum(jnp.pad(a, 1))
                    + _sum(jnp.transpose(a))
                    + _sum(jnp.broadcast_to(a, (2, 8, 16)))
                    + _sum(jnp.tril(a))
                    + _sum(jnp.where(a > 0, a, 0.0))
                    + _sum(jnp.clip(a, -1, 1))
                    + _sum(jnp.diagonal(a[:, :8]))
                    + _sum(jnp.outer(a[0], a[1]))
                    + _sum(jnp.einsum("ij,ik->jk", a, a))
                    + _sum(jnp.linalg.norm(a, axis=1))
                )
            ),
            (x,),
        ),
        "reductions": (
            _step(
                lambda a: (
                    jnp.mean(a)
                    + jnp.max(a)
                    + jnp.min(a)
                    + jnp.prod(a[0, :4])
                    + jnp.var(a)
                    + jnp.std(a, 0).sum()
                    + jnp.argmax(a, 1).sum()
                    + jnp.argmin(a, 0).sum()
                    + jnp.any(a > 1)
                    + jnp.all(a > -9)
                    + jnp.median(a)
                    + jnp.logaddexp(a, a).sum()
                )
            ),
            (x,),
        ),
        "matmul": (_step(lambda w, a: _sum(a @ w) + _sum(jnp.dot(a, w))), (w, x)),
        "one_hot_where": (
            _step(lambda a, i: _sum(a * jax.nn.one_hot(i, 16)) + _sum(jnp.nonzero(i, size=2)[0])),
            (x, sd(8, dtype=jnp.int32)),
        ),
    }


def _rotary(q: jax.Array) -> jax.Array:
    """Rotary position embedding over interleaved pairs with ``jnp.stack`` (Mixtral/GPT-J)."""
    b, s, h, d = q.shape
    freqs = 1.0 / 10000 ** (jnp.arange(0, d, 2) / d)
    ang = jnp.arange(s)[:, None] * freqs[None]
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = q[..., ::2], q[..., 1::2]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(b, s, h, d)


# --- jax.lax, jax.nn, jax.random ------------------------------------------------------------


def lax_programs() -> dict[str, Program]:
    img, k = sd(2, 8, 8, 4), sd(3, 3, 4, 8)
    dn = ("NHWC", "HWIO", "NHWC")

    def conv(a, w, **kw):
        return lax.conv_general_dilated(a, w, (1, 1), "SAME", dimension_numbers=dn, **kw)

    def pool(a, fn, init):
        return lax.reduce_window(a, init, fn, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")

    return {
        "conv": (_step(lambda w, a: _sum(conv(a, w))), (k, img)),
        "conv_grouped": (
            _step(lambda w, a: _sum(conv(a, w, feature_group_count=2))),
            (sd(3, 3, 2, 8), img),
        ),
        "conv_depthwise": (
            _step(lambda w, a: _sum(conv(a, w, feature_group_count=4))),
            (sd(3, 3, 1, 4), img),
        ),
        "conv_depthwise_multiplier": (
            _step(lambda w, a: _sum(conv(a, w, feature_group_count=4))),
            (sd(3, 3, 1, 8), img),
        ),
        "conv_transpose": (
            _step(
                lambda w, a: _sum(lax.conv_transpose(a, w, (2, 2), "SAME", dimension_numbers=dn))
            ),
            (k, img),
        ),
        "pooling": (
            _step(
                lambda a: (
                    _sum(pool(a, lax.max, -jnp.inf))
                    + _sum(pool(a, lax.add, 0.0))
                    + _sum(pool(a, lax.min, jnp.inf))
                )
            ),
            (img,),
        ),
        "pooling_generic": (  # a reduce_window of a computation JAX knows no monoid of (no grad)
            lambda a: _sum(
                lax.reduce_window(
                    a, 1.0, lambda x, y: x * y + 0.0 * x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
                )
            ),
            (img,),
        ),
        "pooling_forward_mode": (  # jvp of max pooling: select_and_gather_add
            lambda a, t: jax.jvp(lambda v: pool(v, lax.max, -jnp.inf), (a,), (t,)),
            (img, img),
        ),
        "scan_while_cond": (
            _step(lambda w, a: _loops(w, a)),
            (sd(16, 16), x_ := sd(8, 16)),
        ),
        "fori_switch": (
            _step(
                lambda w, a: (
                    jnp.sum(lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), a))
                    + lax.switch(jnp.argmax(a[0, :3]), [jnp.sum, jnp.max, jnp.min], a)
                )
            ),
            (sd(16, 16), x_),
        ),
        "nn": (
            _step(
                lambda w, a: (
                    _sum(jax.nn.relu(a @ w))
                    + _sum(jax.nn.gelu(a @ w))
                    + _sum(jax.nn.silu(a))
                    + _sum(jax.nn.softmax(a))
                    + _sum(jax.nn.log_softmax(a))
                    + _sum(jax.nn.sigmoid(a))
                    + _sum(jax.nn.softplus(a))
                    + _sum(jax.nn.elu(a))
                    + _sum(jax.nn.standardize(a))
                    + _sum(jax.nn.logsumexp(a, 1))
                    + _sum(jax.nn.leaky_relu(a))
                    + _sum(jax.nn.glu(a))
                    + _sum(jax.nn.mish(a))
                )
            ),
            (sd(16, 16), x_),
        ),
        "attention": (
            _step(lambda q: _sum(jax.nn.dot_product_attention(q, q, q, is_causal=True))),
            (sd(2, 8, 4, 16),),
        ),
        "attention_gqa": (
            _step(lambda q, kv: _sum(jax.nn.dot_product_attention(q, kv, kv))),
            (sd(2, 8, 4, 16), sd(2, 8, 2, 16)),
        ),
        "random": (
            _step(
                lambda w, key: (
                    _sum(w * jax.random.bernoulli(key, 0.5, w.shape))
                    + _sum(w * jax.random.normal(jax.random.fold_in(key, 3), w.shape))
                    + _sum(w[:2] * jax.random.uniform(jax.random.split(key)[1], (2, 16)))
                    + _sum(w * jax.random.truncated_normal(key, -2, 2, w.shape))
                    + _sum(jax.random.permutation(key, w))
                    + _sum(w[jax.random.randint(key, (3,), 0, 16)])
                    + _sum(w[jax.random.categorical(key, w)])
                    + _sum(w * jax.random.gumbel(key, w.shape))
                )
            ),
            (sd(16, 16), jax.ShapeDtypeStruct((2,), jnp.uint32)),
        ),
        "random_typed_key": (
            _step(
                lambda w, seed: (
                    _sum(w * jax.random.normal(jax.random.key(seed), w.shape))
                    + _sum(jax.random.key_data(jax.random.split(jax.random.key(seed), 4)))
                )
            ),
            (sd(16, 16), jax.ShapeDtypeStruct((), jnp.int32)),
        ),
        "misc": (
            _step(
                lambda a: (
                    _sum(lax.rsqrt(a * a + 1))
                    + _sum(lax.erf_inv(jnp.tanh(a) * 0.5))
                    + _sum(lax.bitcast_convert_type(a, jnp.int32).astype(F32) * 0.0)
                    + _sum(lax.reduce_precision(a, 5, 10))
                    + _sum(lax.expand_dims(a, (0,)))
                    + _sum(lax.rev(a, (0,)))
                    + _sum(lax.dynamic_slice(a, (1, 2), (3, 4)))
                    + _sum(lax.dynamic_update_slice(a, a[:2, :3], (1, 2)))
                    + _sum(lax.clamp(-1.0, a, 1.0))
                    + _sum(lax.sort((a, a), num_keys=1)[1])
                    + _sum(jax.lax.stop_gradient(a))
                    + _sum(lax.square(a))
                    + _sum(lax.integer_pow(a, 3))
                    + _sum(lax.optimization_barrier(a))
                )
            ),
            (x_,),
        ),
        "checkpoint": (
            _step(lambda w, a: _sum(jax.checkpoint(lambda v: jnp.sin(v @ w) @ w)(a))),
            (sd(16, 16), x_),
        ),
        "custom_vjp": (
            _step(lambda w, a: _sum(_clip_gradient(a @ w))),
            (sd(16, 16), x_),
        ),
    }


def _loops(w: jax.Array, a: jax.Array) -> jax.Array:
    h, _ = lax.scan(lambda h, _: (jnp.tanh(h @ w), None), a, None, length=3)
    h2 = lax.while_loop(
        lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, lax.stop_gradient(h))
    )[1]  # no reverse mode through while
    return lax.cond(jnp.sum(a) > 0, lambda v: jnp.sum(v), lambda v: jnp.max(v), h2 @ w)


@jax.custom_vjp
def _clip_gradient(x: jax.Array) -> jax.Array:
    return x


def _clip_fwd(x):
    return x, None


def _clip_bwd(_, g):
    return (jnp.clip(g, -1.0, 1.0),)


_clip_gradient.defvjp(_clip_fwd, _clip_bwd)


# --- optax ------------------------------------------------------------------------------------


def optax_programs() -> dict[str, Program]:
    import optax

    params = {"w": sd(16, 32), "b": sd(32)}
    out = {}
    for name, opt in {
        "adamw": optax.adamw(1e-3),
        "adafactor": optax.adafactor(1e-3),
        "lion": optax.lion(1e-4),
        "sgd_clip": optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-2, momentum=0.9)),
        "lamb": optax.lamb(1e-3),
        "adagrad_schedule": optax.adagrad(optax.warmup_cosine_decay_schedule(0, 1e-3, 10, 100)),
    }.items():

        def step(p, x, opt=opt):
            state = opt.init(p)
            g = jax.grad(lambda p: _sum(jnp.tanh(x @ p["w"] + p["b"])))(p)
            updates, state = opt.update(g, state, p)
            return optax.apply_updates(p, updates), state

        out[f"optax_{name}"] = (step, (params, sd(8, 16)))
    return out


# --- Flax linen, Flax NNX -----------------------------------------------------------------------


def linen_programs() -> dict[str, Program]:
    import flax.linen as nn

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = True):
            x = nn.Conv(8, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train)(x)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
            x = nn.Conv(8, (3, 3), feature_group_count=2, padding="VALID")(x)
            x = nn.avg_pool(x, (2, 2), strides=(1, 1), padding="SAME")
            x = nn.GroupNorm(num_groups=4)(x)
            x = nn.ConvTranspose(4, (2, 2), strides=(2, 2))(x)
            x = nn.Dropout(0.1, deterministic=not train)(x)
            return nn.Dense(3)(jnp.mean(x, axis=(1, 2)))

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(64, 16)(tokens)
            x = nn.LayerNorm()(x)
            x = nn.MultiHeadDotProductAttention(4)(x, mask=nn.make_causal_mask(tokens))
            x = nn.RMSNorm()(x)
            cell = nn.scan(
                nn.OptimizedLSTMCell,
                variable_broadcast="params",
                split_rngs={"params": False},
                in_axes=1,
                out_axes=1,
            )(16)
            _, x = cell(cell.initialize_carry(jax.random.key(0), x[:, 0].shape), x)
            return nn.Dense(64)(x)

    cnn, lm = CNN(), LM()
    img, tokens = jnp.zeros((2, 8, 8, 3)), jnp.zeros((2, 8), jnp.int32)
    cv = jax.eval_shape(lambda: cnn.init({"params": jax.random.key(0)}, img, train=False))
    lv = jax.eval_shape(lambda: lm.init(jax.random.key(0), tokens))

    def cnn_loss(params, stats, x, key):
        y, upd = cnn.apply(
            {"params": params, "batch_stats": stats},
            x,
            rngs={"dropout": key},
            mutable=["batch_stats"],
        )
        return _sum(y) + _sum(upd)

    def lm_loss(params, t):
        return _sum(lm.apply({"params": params}, t))

    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    return {
        "linen_cnn": (_step(cnn_loss), (cv["params"], cv["batch_stats"], sd(2, 8, 8, 3), key)),
        "linen_lm": (_step(lm_loss), (lv["params"], sd(2, 8, dtype=jnp.int32))),
    }


def nnx_programs() -> dict[str, Program]:
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(3, 8, (3, 3), rngs=rngs)
            self.bn = nnx.BatchNorm(8, rngs=rngs)
            self.lin = nnx.Linear(8, 4, rngs=rngs)
            self.emb = nnx.Embed(16, 8, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)

        def __call__(self, x, t):
            x = nnx.max_pool(nnx.relu(self.bn(self.conv(x))), (2, 2), (2, 2))
            x = nnx.avg_pool(x, (2, 2), (2, 2))
            return self.lin(self.drop(jnp.mean(x, (1, 2)) + self.emb(t)))

    graphdef, params, rest = nnx.split(jax.eval_shape(lambda: Net(nnx.Rngs(0))), nnx.Param, ...)

    def step(params, rest, x, t):  # NNX's own transform: the net's statistics updated in place
        net = nnx.merge(graphdef, params, rest)
        value, grads = nnx.value_and_grad(lambda net: _sum(net(x, t)))(net)
        return value, grads, nnx.state(net)

    return {"nnx_net": (step, (params, rest, sd(2, 8, 8, 3), sd(2, dtype=jnp.int32)))}


# --- Equinox ----------------------------------------------------------------------------------


def equinox_programs() -> dict[str, Program]:
    import equinox as eqx

    key = jax.random.key(0)
    k = jax.random.split(key, 8)

    def build():
        return {
            "conv": eqx.nn.Conv2d(3, 8, 3, padding=1, key=k[0]),
            "dw": eqx.nn.Conv2d(8, 8, 3, padding=1, groups=8, key=k[1]),
            "max": eqx.nn.MaxPool2d(2, 2),
            "avg": eqx.nn.AvgPool2d(2, 1),
            "adaptive": eqx.nn.AdaptiveAvgPool2d(2),
            "norm": eqx.nn.LayerNorm((8, 2, 2)),
            "mlp": eqx.nn.MLP(32, 4, 16, 2, key=k[2]),
            "attn": eqx.nn.MultiheadAttention(2, 8, key=k[3]),
            "gru": eqx.nn.GRUCell(8, 8, key=k[4]),
            "lstm": eqx.nn.LSTMCell(8, 8, key=k[5]),
            "emb": eqx.nn.Embedding(16, 8, key=k[6]),
            "tconv": eqx.nn.ConvTranspose2d(8, 3, 2, stride=2, key=k[7]),
            "rms": eqx.nn.RMSNorm(8),
        }

    model = eqx.filter_eval_shape(build)
    params, static = eqx.partition(model, lambda v: isinstance(v, jax.ShapeDtypeStruct))

    def one(m, x, t):  # one example: Equinox layers are vmapped over the batch
        h = jax.nn.relu(m["conv"](x))
        h = m["dw"](h)
        up = m["tconv"](h)
        h = m["avg"](m["max"](h))
        h = m["norm"](m["adaptive"](h))
        y = m["mlp"](h.reshape(-1))
        e = jax.vmap(m["rms"])(jax.vmap(m["emb"])(t))
        a = m["attn"](e, e, e)
        g = m["gru"](a[0], a[1])
        c, _ = m["lstm"](a[0], (a[1], a[2]))
        return _sum(y) + _sum(g) + _sum(c) + _sum(up)

    def loss(p, x, t):
        m = eqx.combine(p, static)
        return jnp.mean(jax.vmap(lambda a, b: one(m, a, b))(x, t))

    return {"equinox_layers": (_step(loss), (params, sd(2, 3, 8, 8), sd(2, 4, dtype=jnp.int32)))}


# --- Keras 3 (JAX backend) ----------------------------------------------------------------------


def keras_programs() -> dict[str, Program]:
    import keras

    def build():
        L = keras.layers
        inp = keras.Input((8, 8, 4))
        x = L.Conv2D(8, 3, groups=2, padding="same")(inp)
        x = L.BatchNormalization()(x)
        x = L.ReLU()(x)
        x = L.DepthwiseConv2D(3, padding="same")(x)
        x = L.SeparableConv2D(8, 3, padding="same")(x)
        x = L.MaxPooling2D(3, strides=2, padding="same")(x)
        x = L.AveragePooling2D(2)(x)
        x = L.Conv2DTranspose(4, 2, strides=2)(x)
        x = L.ZeroPadding2D(1)(x)
        x = L.LayerNormalization()(x)
        x = L.Dropout(0.1)(x)
        x = L.GlobalAveragePooling2D()(x)
        x = L.Dense(5, activation="softmax")(x)
        return keras.Model(inp, x)

    holder = {}

    def make():
        holder["m"] = build()
        m = holder["m"]
        return [v.value for v in m.trainable_variables], [
            v.value for v in m.non_trainable_variables
        ]

    tv, ntv = jax.eval_shape(make)
    model = holder["m"]

    def loss(tv, ntv, x):
        y, ntv2 = model.stateless_call(tv, ntv, x, training=True)
        return _sum(y) + _sum(ntv2)

    return {"keras_cnn": (_step(loss), (tv, ntv, sd(2, 8, 8, 4)))}


# --- all of them --------------------------------------------------------------------------------

GROUPS: dict[str, Callable[[], dict[str, Program]]] = {
    "numpy": numpy_programs,
    "lax": lax_programs,
    "optax": optax_programs,
    "linen": linen_programs,
    "nnx": nnx_programs,
    "equinox": equinox_programs,
    "keras": keras_programs,
}


def programs() -> dict[str, Program]:
    """Every program of the corpus by name: ``(fn, args)``, args as shapes."""
    out: dict[str, Program] = {}
    for make in GROUPS.values():
        out.update(make())
    return out


def primitives(closed: Any) -> set[str]:
    """The primitives a closed jaxpr's equations bind, inner jaxprs (call, loop and branch
    bodies, custom derivatives' rules) included."""
    seen: set[str] = set()
    stack = [closed.jaxpr if hasattr(closed, "jaxpr") else closed]
    while stack:
        j = stack.pop()
        for eqn in j.eqns:
            seen.add(eqn.primitive.name)
            for v in eqn.params.values():
                for s in v if isinstance(v, (tuple, list)) else (v,):
                    inner = getattr(s, "jaxpr", None) if not hasattr(s, "eqns") else s
                    if inner is not None and hasattr(inner, "eqns"):
                        stack.append(inner)
    return seen


if __name__ == "__main__":
    for name, (fn, args) in programs().items():
        print(f"{name}: {' '.join(sorted(primitives(jax.make_jaxpr(fn)(*args))))}")
