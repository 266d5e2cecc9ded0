"""Kernels a plan may hold that the devices at hand cannot run, and what runs in their place.

A step built for NVIDIA GPUs traces to JAX's cuDNN attention primitives on any machine (so a
GPU or TPU job is planned on a laptop). Their kernel compiles only on an NVIDIA GPU; on other
devices ``al.apply`` runs JAX's own composition of the same attention in their place
(``jax.nn.dot_product_attention(implementation="xla")``: the same function, its scores
materialised), so a plan for GPUs is validated and run on CPU devices with its layouts as
planned. The results are the kernel's up to rounding; its speed and memory are not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from autolayout.core import ATTENTION_BWD, ATTENTION_FWD, Graph, PlanError

CUDNN = ATTENTION_FWD + ATTENTION_BWD
_MASKS = {0: False, 2: True}  # cuDNN's MaskType: NO_MASK, CAUSAL (the two JAX's own runs)


def runs_cudnn(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform in ("gpu", "cuda")


def _why_not(params: dict, ins: list) -> str | None:
    """Why JAX's composition cannot stand in for this cuDNN call (``None`` where it can)."""
    mask = getattr(params.get("mask_type"), "value", params.get("mask_type"))
    if mask not in _MASKS:
        return f"its mask ({params.get('mask_type')})"
    if any(params.get("variadic_args", ())):
        return "its bias"
    if params.get("dropout_rate", 0.0):
        return "its dropout"
    if params.get("sliding_window_length") is not None:
        return "its sliding window"
    if params.get("layout", 0) != 0:
        return "its layout (not [batch, seq, heads, head_dim])"
    if any(x.size for x in ins[3:10]):  # bias, mask, sequence lengths, offsets, page tables
        return "its sequence lengths or offsets"
    return None


def check_kernels(graph: Graph, mesh: Mesh) -> str | None:
    """A note where the step's cuDNN attention runs as JAX's composition on these devices
    (a call the composition does not cover is refused, in one line, where it runs)."""
    if runs_cudnn(mesh):
        return None
    ops = [op for op in graph.ops if op.primitive in CUDNN]
    if not ops:
        return None
    return (
        f"the step's cuDNN attention ({len(ops)} calls) runs on "
        f"{mesh.devices.flat[0].platform} devices as JAX's own composition "
        f"(jax.nn.dot_product_attention(implementation='xla')): the same results and layouts, "
        f"not the kernel's speed or memory"
    )


def _reference(q, k, v, params: dict):
    causal = _MASKS[getattr(params["mask_type"], "value", params["mask_type"])]
    out, lse = jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, scale=float(params["scale"]), implementation="xla",
        return_residual=True,
    )  # fmt: skip
    return out, jnp.transpose(lse, (0, 2, 1)).astype(jnp.float32)  # cuDNN's [B, N, T]


def run_in_place(name: str, params: dict, ins: list) -> list:
    """The outputs of cuDNN attention primitive ``name`` on ``ins``, by JAX's composition:
    the forward gives the output and the log-sum-exp; the backward recomputes the forward
    and takes its vector-Jacobian product with the output's cotangent."""
    why = _why_not(params, ins)
    if why:
        raise PlanError(
            f"the step calls cuDNN attention, which runs only on NVIDIA GPUs, and JAX's own "
            f"attention cannot stand in for it on these devices ({why}): run it on GPUs, or "
            f"call it with implementation='xla'"
        )
    q, k, v = ins[:3]
    if name in ATTENTION_FWD:
        out, lse = _reference(q, k, v, params)
        return [out, lse] if params.get("is_training", True) else [out]
    d_out = ins[-1]
    _, vjp = jax.vjp(lambda a, b, c: _reference(a, b, c, params)[0], q, k, v)
    return list(vjp(d_out.astype(q.dtype)))
