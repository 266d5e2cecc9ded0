"""Kernels a plan may hold: what runs in place of one the devices at hand cannot run, and how
one XLA cannot partition runs on its shards.

A step built for NVIDIA GPUs traces to JAX's cuDNN attention primitives on any machine (so a
GPU or TPU job is planned on a laptop). Their kernel compiles only on an NVIDIA GPU; on other
devices ``al.apply`` runs JAX's own composition of the same attention in their place
(``jax.nn.dot_product_attention(implementation="xla")``: the same function, its scores
materialised), so a plan for GPUs is validated and run on CPU devices with its layouts as
planned. The results are the kernel's up to rounding; its speed and memory are not.

Splash attention (``al.splash_attention``) is a Pallas kernel, which XLA cannot partition:
``al.apply`` runs each call under ``shard_map`` over the mesh axes its q is laid out on along
batch and heads (the only axes a plan splits; k and v alike on their kv heads), so each
device calls the kernel on its shard. Off a TPU it is Pallas' interpreter (the same blocks
and arithmetic as plain XLA ops).

A grouped convolution (groups of more than one channel: ResNeXt, RegNet) XLA's partitioner
runs whole on every device, its input gathered (openxla/xla#47945): ``al.apply`` runs it
under ``shard_map`` over the mesh axes its input's batch is laid out on, as planned.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from autolayout.core import (
    CUDNN_BWD,
    CUDNN_FWD,
    SPLASH_BWD,
    SPLASH_FWD,
    Graph,
    PlanError,
    grouped_conv,
    partition_spec,
)

CUDNN = CUDNN_FWD + CUDNN_BWD
SPLASH = SPLASH_FWD + SPLASH_BWD
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


def composed(graph: Graph, mesh: Mesh) -> int:
    """The step's cuDNN attention calls these devices run as JAX's composition (none on
    NVIDIA GPUs)."""
    return 0 if runs_cudnn(mesh) else sum(op.primitive in CUDNN for op in graph.ops)


def check_kernels(graph: Graph, mesh: Mesh) -> str | None:
    """A note where the step's kernels run other than as the hardware they were built for
    runs them: cuDNN attention as JAX's composition off NVIDIA GPUs (a call the composition
    does not cover is refused, in one line, where it runs), splash attention through Pallas'
    interpreter off TPUs."""
    platform = mesh.devices.flat[0].platform
    notes = []
    cudnn = composed(graph, mesh)
    if cudnn:
        notes.append(
            f"the step's cuDNN attention ({cudnn} calls) runs on {platform} devices as JAX's "
            f"own composition (jax.nn.dot_product_attention(implementation='xla')): the same "
            f"results and layouts, not the kernel's speed or memory"
        )
    splash = sum(op.primitive in SPLASH for op in graph.ops)
    if splash and platform != "tpu":
        notes.append(
            f"the step's splash attention ({splash} calls) runs on {platform} devices through "
            f"Pallas' interpreter, on each device's shard: the same results and layouts, not "
            f"the kernel's speed or memory"
        )
    return "; ".join(notes) or None


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
    if name in CUDNN_FWD:
        out, lse = _reference(q, k, v, params)
        return [out, lse] if params.get("is_training", True) else [out]
    d_out = ins[-1]
    _, vjp = jax.vjp(lambda a, b, c: _reference(a, b, c, params)[0], q, k, v)
    return list(vjp(d_out.astype(q.dtype)))


def run_sharded(eqn, ins: list, layouts: list, mesh: Mesh) -> list:
    """A splash attention call on each device's shard: ``shard_map`` over the axes q's
    layout (``layouts[0]``, as the op reads it) puts on batch and heads; k and v are read
    split alike on their heads, the outputs come back so (the log-sum-exp ``[B, N, T]``)."""
    lay = (layouts[0] if layouts else None) or ((),) * 4
    if any(lay[a] for a in (1, 3)):
        raise PlanError(
            f"the plan splits splash attention's sequence or head_dim ({lay}): the kernel "
            f"splits batch and heads only; plan it again"
        )

    b, _, n, _ = partition_spec(lay)
    qs = PartitionSpec(b, None, n, None)
    stat = PartitionSpec(b, n, None)
    in_specs = (qs, qs, qs) + ((stat, qs, qs) if eqn.primitive.name in SPLASH_BWD else ())
    out_specs = [qs, qs, qs] if eqn.primitive.name in SPLASH_BWD else [qs, stat]

    def body(*xs):
        return eqn.primitive.bind(*xs, **eqn.params)

    f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    return list(f(*ins))


def runs_grouped(eqn) -> tuple | None:
    """A grouped convolution XLA would run whole: its batch's positions
    (``core.grouped_conv``)."""
    if eqn.primitive.name != "conv_general_dilated":
        return None
    lhs, rhs = (tuple(v.aval.shape) for v in eqn.invars[:2])
    return grouped_conv(eqn.params, lhs, rhs)


def run_grouped(eqn, batch: tuple, ins: list, layouts: list, mesh: Mesh):
    """A grouped convolution on each device's images: ``shard_map`` over the mesh axes the
    batch is laid out on (``batch``, from :func:`runs_grouped`; ``layouts`` as the op reads
    its operands), everything else whole; a forward conv's or an input gradient's output
    split alike on its batch (no collective), a weight gradient's partial sums all-reduced,
    as the plan prices it."""
    (k, a), (k2, a2) = batch
    lay = (layouts[k] if k < len(layouts) else None) or ((),) * len(ins[k].shape)
    axes = partition_spec(lay)[a]
    if axes is None:
        return eqn.primitive.bind(*ins, **eqn.params)
    shapes = [x.shape for x in ins[:2]] + [eqn.outvars[0].aval.shape]
    specs = [[None] * len(s) for s in shapes]
    specs[k][a] = specs[k2][a2] = axes

    def body(x, w):
        y = eqn.primitive.bind(x, w, **eqn.params)
        return y if k2 == 2 else jax.lax.psum(y, axes)

    f = jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec(*specs[0]), PartitionSpec(*specs[1])),
                      out_specs=PartitionSpec(*specs[2]), check_vma=False)  # fmt: skip
    return f(*ins)
