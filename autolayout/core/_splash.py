"""Splash attention, the TPU's fused attention kernel (``jax.experimental.pallas.ops.tpu``), as
two primitives a step traces to and a plan prices and lays out: ``splash_attention_fwd`` (q,
k, v -> the output and the softmax's log-sum-exp) and ``splash_attention_bwd`` (q, k, v, the
log-sum-exp, the output and its cotangent -> dq, dk, dv), one kernel each, as cuDNN's pair.

:func:`splash_attention` takes what ``jax.nn.dot_product_attention`` takes (``[batch, seq,
heads, head_dim]``; k and v may have fewer heads, grouped-query attention) and is
differentiable. A primitive compiles to the Pallas kernel at the shapes it is given: the
TPU's Mosaic kernel on a TPU, Pallas' interpreter elsewhere (the same blocks and arithmetic,
as plain XLA ops: slow, for tests on CPU devices). XLA cannot partition a Pallas kernel, so a
plan splits batch and heads (the kernel's own rule) and ``al.apply`` runs each call under
``shard_map`` on its shards (:func:`autolayout.runtime.kernels`)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

SPLASH_FWD = ("splash_attention_fwd",)
SPLASH_BWD = ("splash_attention_bwd",)
BLOCKS = (512, 256, 128)  # the kernel's block sizes along a sequence, largest dividing it

fwd_p = Primitive(SPLASH_FWD[0])
fwd_p.multiple_results = True
bwd_p = Primitive(SPLASH_BWD[0])
bwd_p.multiple_results = True


def splash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    is_causal: bool = False,
    scale: float | None = None,
) -> jax.Array:
    """Attention of ``query [B, T, N, H]`` over ``key``/``value [B, S, K, H]`` (K divides N:
    query head ``n`` reads kv head ``n // (N // K)``), scaled by ``scale`` (default
    ``H ** -0.5``), causal or not, by the splash kernel: what
    ``jax.nn.dot_product_attention(query, key, value, is_causal=, scale=)`` computes."""
    if query.ndim != 4 or key.shape != value.shape or key.ndim != 4:
        raise ValueError(
            f"splash_attention takes q [B, T, N, H] and k, v [B, S, K, H] alike, got "
            f"{query.shape}, {key.shape}, {value.shape}"
        )
    n, k = query.shape[2], key.shape[2]
    if n % k or query.shape[0] != key.shape[0] or query.shape[3] != key.shape[3]:
        raise ValueError(
            f"splash_attention: k/v heads ({k}) must divide q heads ({n}), with one batch "
            f"and head_dim: q {query.shape}, k {key.shape}"
        )
    s = float(query.shape[-1] ** -0.5 if scale is None else scale)
    return _attention(query, key, value, bool(is_causal), s)


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attention(q, k, v, is_causal, scale):
    return fwd_p.bind(q, k, v, is_causal=is_causal, scale=scale)[0]


def _attention_fwd(q, k, v, is_causal, scale):
    out, lse = fwd_p.bind(q, k, v, is_causal=is_causal, scale=scale)
    return out, (q, k, v, lse, out)


def _attention_bwd(is_causal, scale, res, d_out):
    q, k, v, lse, out = res
    return tuple(bwd_p.bind(q, k, v, lse, out, d_out, is_causal=is_causal, scale=scale))


_attention.defvjp(_attention_fwd, _attention_bwd)


@fwd_p.def_abstract_eval
def _fwd_shapes(q, k, v, *, is_causal, scale):
    b, t, n, _ = q.shape
    return [jax.core.ShapedArray(q.shape, q.dtype), jax.core.ShapedArray((b, n, t), jnp.float32)]


@bwd_p.def_abstract_eval
def _bwd_shapes(q, k, v, lse, out, d_out, *, is_causal, scale):
    return [jax.core.ShapedArray(x.shape, x.dtype) for x in (q, k, v)]


LANES = 128  # the kernel's sequences are whole blocks of 128


def _block(n: int) -> int:
    return next(b for b in BLOCKS if n % b == 0)


def _up(n: int) -> int:
    return -(-n // LANES) * LANES


def _kernel(t: int, s: int, heads: int, is_causal: bool, mqa: bool, interpret: bool):
    """The splash kernel of one example (``[heads, T, H]``; MQA: k, v ``[S, H]``) with its
    backward blocks, saving the log-sum-exp; ``t`` and ``s`` multiples of :data:`LANES`."""
    one = sm.CausalMask((t, s)) if is_causal else sm.FullMask((t, s))
    bq, bkv = _block(t), _block(s)
    sizes = sk.BlockSizes(
        block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq, block_kv_dkv=bkv,
        block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv,
    )  # fmt: skip
    make = sk.make_splash_mqa_single_device if mqa else sk.make_splash_mha_single_device
    mask = sm.MultiHeadMask([one] * (1 if mqa else heads))
    return make(mask, block_sizes=sizes, save_residuals=True, interpret=interpret)


class _Call:
    """One call's kernel and its operands as the kernel takes them: scaled queries ``[B, K,
    N/K, T', H]``, k and v ``[B, K, S', H]``, sequences padded to whole blocks (``T'``,
    ``S'``) with segment ids that keep the padding apart (a real query reads no padded key)."""

    def __init__(self, q, k, is_causal, scale, interpret):
        self.b, self.t, self.n, self.h = q.shape
        self.s, self.kh = k.shape[1], k.shape[2]
        self.tp, self.sp = _up(self.t), _up(self.s)
        self.mqa = self.kh != self.n
        self.kern = _kernel(self.tp, self.sp, self.n // self.kh, is_causal, self.mqa, interpret)
        self.scale = scale
        self.segments = None
        if (self.tp, self.sp) != (self.t, self.s):
            self.segments = sk.SegmentIds(
                q=(jnp.arange(self.tp) >= self.t).astype(jnp.int32),
                kv=(jnp.arange(self.sp) >= self.s).astype(jnp.int32),
            )

    def queries(self, x, scaled=False):  # [B, T, N, H] -> [B, K, N/K, T', H]
        if scaled:
            x = (x.astype(jnp.float32) * self.scale).astype(x.dtype)
        x = jnp.pad(x, ((0, 0), (0, self.tp - self.t), (0, 0), (0, 0)))
        return x.transpose(0, 2, 1, 3).reshape(self.b, self.kh, self.n // self.kh, self.tp, -1)

    def keys(self, x):  # [B, S, K, H] -> [B, K, S', H]
        return jnp.pad(x, ((0, 0), (0, self.sp - self.s), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    def lse(self, x):  # [B, N, T] -> [B, K, N/K, T']
        x = jnp.pad(x, ((0, 0), (0, 0), (0, self.tp - self.t)))
        return x.reshape(self.b, self.kh, self.n // self.kh, self.tp)

    def back(self, x):  # [B, K, N/K, T', ...] -> [B, T, N, ...] (the lse: [B, N, T])
        x = x.reshape(self.b, self.n, self.tp, *x.shape[4:])[:, :, : self.t]
        return x.transpose(0, 2, 1, 3) if x.ndim == 4 else x


def _run_fwd(q, k, v, *, is_causal, scale, interpret):
    c = _Call(q, k, is_causal, scale, interpret)

    def one(q1, k1, v1):
        return c.kern(q1, k1, v1, segment_ids=c.segments)

    gq = c.queries(q, scaled=True)
    if c.mqa:
        out, (lse,) = jax.vmap(jax.vmap(one))(gq, c.keys(k), c.keys(v))
    else:
        out, (lse,) = jax.vmap(one)(gq[:, :, 0], c.keys(k), c.keys(v))
        out, lse = out[:, :, None], lse[:, :, None]
    return [c.back(out).astype(q.dtype), c.back(lse).astype(jnp.float32)]


def _run_bwd(q, k, v, lse, out, d_out, *, is_causal, scale, interpret):
    c = _Call(q, k, is_causal, scale, interpret)
    kern, kw = c.kern, c.kern.kwargs

    def one(q1, k1, v1, lse1, o1, do1):  # one example's (and kv head's) kernels
        res = (q1, k1, v1, c.segments, None, o1, lse1, kern.dq_mask_info, kern.dkv_mask_info)
        got = sk._splash_attention_bwd(
            False, kw["mask_value"], kw["is_mqa"], kw["block_sizes"], None,
            kw["mask_function"], kw["attn_logits_soft_cap"], interpret, res, do1,
        )  # fmt: skip
        return got[3:6]

    args = (c.queries(q, scaled=True), c.keys(k), c.keys(v), c.lse(lse), c.queries(out),
            c.queries(d_out))  # fmt: skip
    if c.mqa:
        dq, dk, dv = jax.vmap(jax.vmap(one))(*args)
    else:
        a = [x[:, :, 0] if i not in (1, 2) else x for i, x in enumerate(args)]
        dq, dk, dv = jax.vmap(one)(*a)
        dq = dq[:, :, None]
    dq = (c.back(dq).astype(jnp.float32) * scale).astype(q.dtype)
    dk, dv = (x.transpose(0, 2, 1, 3)[:, : c.s].astype(k.dtype) for x in (dk, dv))
    return [dq, dk, dv]


def _batched(p, args, dims, **params):
    """``jax.vmap`` of a call: the mapped axis folded into the batch (every operand's
    leading axis), an unmapped operand broadcast along it."""
    v = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    xs = [
        jnp.broadcast_to(x, (v, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    outs = p.bind(*[x.reshape(v * x.shape[1], *x.shape[2:]) for x in xs], **params)
    return [o.reshape(v, o.shape[0] // v, *o.shape[1:]) for o in outs], [0] * len(outs)


def _impl(run, *args, **params):
    return run(*args, **params, interpret=jax.default_backend() != "tpu")


fwd_p.def_impl(partial(_impl, _run_fwd))
bwd_p.def_impl(partial(_impl, _run_bwd))
for _p, _run in ((fwd_p, _run_fwd), (bwd_p, _run_bwd)):
    batching.primitive_batchers[_p] = partial(_batched, _p)
    mlir.register_lowering(_p, mlir.lower_fun(partial(_run, interpret=True), multiple_results=True))
    mlir.register_lowering(
        _p, mlir.lower_fun(partial(_run, interpret=False), multiple_results=True), platform="tpu"
    )
del _p, _run
