"""A Flax NNX transformer block stack whose weights carry NNX sharding metadata
(``nnx.with_partitioning``, MaxText-style logical names ``embed``, ``mlp``, ``heads``):
the planner reads those names, so its rules come out in them.

autolayout plan experiments/models/libraries/nnx_lm.py --set size=base --hw tpu-v4-256
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from _common import cast, config, token_workload
from flax import nnx

SIZES = {
    "tiny": dict(layers=2, d_model=64, heads=4, d_ff=256, vocab=512, seq=16, batch=8),
    "base": dict(layers=12, d_model=768, heads=12, d_ff=3072, vocab=32000, seq=1024, batch=256),
}


def _init(names):
    return nnx.with_partitioning(nnx.initializers.normal(0.02), names, eager_sharding=False)


class Block(nnx.Module):
    def __init__(self, c, rngs):
        d, h, f = c["d_model"], c["heads"], c["d_ff"]
        self.ln1, self.ln2 = nnx.RMSNorm(d, rngs=rngs), nnx.RMSNorm(d, rngs=rngs)
        self.qkv = nnx.Param(
            _init(("embed", None, "heads", "kv"))(rngs.params(), (d, 3, h, d // h))
        )
        self.out = nnx.Param(_init(("heads", "kv", "embed"))(rngs.params(), (h, d // h, d)))
        self.up = nnx.Linear(d, f, use_bias=False, kernel_init=_init(("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(f, d, use_bias=False, kernel_init=_init(("mlp", "embed")), rngs=rngs)

    def __call__(self, x):
        q, k, v = jnp.einsum("bsd,dthk->tbshk", self.ln1(x), self.qkv[...])
        s = jnp.einsum("bshk,bthk->bhst", q, k) / jnp.sqrt(q.shape[-1])
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -1e9)
        x = x + jnp.einsum("bhst,bthk,hkd->bsd", jax.nn.softmax(s), v, self.out[...])
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class LM(nnx.Module):
    def __init__(self, c, rngs):
        self.embed = nnx.Embed(c["vocab"], c["d_model"], rngs=rngs,
                               embedding_init=_init(("vocab", "embed")))  # fmt: skip
        self.blocks = nnx.List([Block(c, rngs) for _ in range(c["layers"])])
        self.ln = nnx.RMSNorm(c["d_model"], rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.embed.attend(self.ln(x))


def workload(size: str = "tiny", dtype: str = "", **overrides):
    c, dt = config(SIZES, size, overrides, dtype)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: LM(c, nnx.Rngs(0))))

    def init(key):  # the model's state: NNX variables, their sharding names kept
        state = nnx.state(LM(c, nnx.Rngs(key)))
        return jax.tree.map(lambda v: v.replace(cast(v[...], dt)), state,
                            is_leaf=lambda v: isinstance(v, nnx.Variable))  # fmt: skip

    def logits(params, tokens):
        return nnx.merge(graphdef, params)(tokens)

    return token_workload(f"nnx-lm-{size}", logits, init, c, dict(size=size, **overrides))
