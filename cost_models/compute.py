"""The compute roofline of one op on one device.

``time = max(flops / (peak[dtype] * matmul_eff), bytes / (hbm_bw * memory_eff))``: an op is
either compute-bound or bound by the HBM traffic of reading its inputs and writing its
outputs (``shared/DESIGN.md``). Elementwise work runs on the vector units, so only
matmul-like ops (``dot_general``, ``conv_general_dilated``) use the matrix peak; the rest are
priced by their bytes alone, as XLA fuses them into their neighbours' memory traffic.
"""

from __future__ import annotations

import jax.numpy as jnp

from autolayout.core import (
    ATTENTION_BWD,
    ATTENTION_BWD_FLOPS,
    ATTENTION_FWD,
    Graph,
    Hardware,
    HardwareError,
)

MATRIX_OPS = frozenset({"dot_general", "conv_general_dilated"})
GROUPED_MATMUL = "ragged_dot_general"  # a matmul per group (lax.ragged_dot): on the roofline too
KERNEL_OPS = frozenset({"pallas_call"})  # priced from their cost estimate, on the matrix peak
ATTENTION_OPS = frozenset(ATTENTION_FWD + ATTENTION_BWD)  # fused: priced as one kernel each
_DTYPE_KEYS = {
    "bfloat16": ("bf16",),
    "float16": ("fp16", "bf16"),
    "float32": ("f32",),
    "int8": ("int8",),
    # wider integer dots (a block-sparse mask's einsum: Flax BigBird) run off the matrix
    # units' fast paths: priced at the chip's slowest float rate it states
    "int16": ("f32_highest", "f32", "bf16"),
    "int32": ("f32_highest", "f32", "bf16"),
    "int64": ("f32_highest", "f32", "bf16"),
    "uint32": ("f32_highest", "f32", "bf16"),
    "float8_e4m3fn": ("fp8",),
    "float8_e5m2": ("fp8",),
}


# A float32 dot's precision (a dot_general's ``precision``, or ``jax.default_matmul_precision``
# as JAX resolves it into the dot while tracing) -> how the chip runs it: on NVIDIA GPUs
# DEFAULT and HIGH run as TF32 on the tensor cores (``f32``), HIGHEST as IEEE float32 on the
# CUDA cores (``f32_highest``); on TPUs as 1, 3 or 6 bf16 passes (JAX's bf16, bf16_3x,
# bf16_6x algorithms).
TPU_PASSES = {"default": 1, "high": 3, "highest": 6}


def compute_dtype(dtypes: list[str]) -> str:
    """The element type an op computes in: its widest floating input (an integer mask times
    float scores is a float32 matmul, as XLA converts it), else its first input's.

    Example:
      >>> compute_dtype(["int32", "float32"]), compute_dtype(["bfloat16", "bfloat16"])
      ('float32', 'bfloat16')
    """
    floats = [d for d in dtypes if d.startswith(("float", "bfloat"))]
    if floats:
        return max(floats, key=lambda d: jnp.dtype(d).itemsize)
    return dtypes[0] if dtypes else "float32"


def peak_flops(hw: Hardware, dtype: str, precision: str = "default") -> float:
    """Peak matrix FLOP/s per device for an element type at a dot's precision.

    On TPUs a float32 matmul at JAX's default precision runs as one bf16 pass, so it is
    priced at the bf16 peak when the profile gives no ``f32``, and at a third or a sixth of it
    at HIGH / HIGHEST; on GPUs HIGHEST uses ``f32_highest`` (the CUDA cores). Elsewhere a
    missing dtype is an error naming the profile and the key to add.

    Example:
      >>> import autolayout as al
      >>> peak_flops(al.hardware("tpu-v4-8"), "float32")
      275000000000000.0
    """
    keys = _DTYPE_KEYS.get(dtype, (dtype,))
    precision = precision.lower()
    if dtype == "float32" and hw.kind == "tpu":
        passes = TPU_PASSES.get(precision, 1)
        if passes > 1 and "bf16" in hw.chip.peak_flops:
            return hw.chip.peak_flops["bf16"] / passes
        keys = ("f32", "bf16")
    elif dtype == "float32" and precision in ("highest", "f32_f32_f32") and hw.kind == "gpu":
        keys = ("f32_highest",)
    elif precision.startswith("bf16_bf16"):  # an explicit bf16 algorithm on any input type
        keys = ("bf16",)
    elif precision.startswith("tf32"):
        keys = ("f32",)
    for k in keys:
        if k in hw.chip.peak_flops:
            return hw.chip.peak_flops[k]
    have = ", ".join(hw.chip.peak_flops)
    raise HardwareError(
        f"{hw.source}: no peak FLOP/s for dtype {dtype!r} (profile has {have}); add chip.peak_flops.{keys[0]}"
    )


def op_time(
    hw: Hardware,
    primitive: str,
    flops: float,
    nbytes: float,
    dtype: str,
    precision: str = "default",
    spatial: int = 0,
) -> float:
    """Seconds for one op on one device: its local FLOPs and HBM bytes on the roofline.
    ``spatial``: a convolution's spatial dims (a 3-D one runs at the profile's ``conv3d``
    fraction of peak where it gives one).

    A fused attention kernel runs at the profile's ``efficiency.attention`` of peak (flash
    kernels keep the scores on chip, and run below a plain matmul's rate: the softmax
    between the two matmuls), plus ``attention_call_s`` per forward+backward pair, shared
    between the two kernels by their FLOPs (fitted on one H200: docs/decisions.md). Any
    other op that writes HBM (a kernel XLA launches) pays the profile's ``kernel_s`` too.
    """
    e = hw.efficiency
    memory = nbytes / (hw.chip.hbm_bandwidth * e.memory)
    launch = e.kernel_s if nbytes > 0 else 0.0
    if primitive in ATTENTION_OPS:
        share = (ATTENTION_BWD_FLOPS if primitive in ATTENTION_BWD else 1.0) / (
            1.0 + ATTENTION_BWD_FLOPS
        )
        rate = peak_flops(hw, dtype) * (e.attention if e.attention is not None else e.matmul)
        return max(flops / rate, memory) + e.attention_call_s * share
    matrix = primitive in MATRIX_OPS or primitive in KERNEL_OPS or primitive == GROUPED_MATMUL
    if not matrix or flops <= 0:
        return memory + launch
    eff = e.conv3d if spatial == 3 and e.conv3d is not None else e.matmul
    return max(flops / (peak_flops(hw, dtype, precision) * eff), memory) + launch


def kernel_notes(g: Graph, hw: Hardware) -> list[str]:
    """What the plan assumes of the fused kernels and library calls the step makes, where it
    is not measured or not what this hardware runs (printed with the plan)."""
    e = hw.efficiency
    notes = []
    convs = sum(
        op.primitive == "conv_general_dilated" and len(g.tensors[op.inputs[0]].shape) == 5
        for op in g.ops
    )
    if convs and e.conv3d is not None:
        notes.append(
            f"{convs} 3-D convolutions priced at {e.conv3d:.2%} of peak (efficiency.conv3d in "
            f"{hw.source}; XLA:GPU runs them channels-first, at 0.43% of peak on one H200): "
            "`autolayout calibrate` measures your devices'"
        )
    grouped = sum(op.primitive == "conv_general_dilated" and bool(op.param("grouped"))
                  for op in g.ops)  # fmt: skip
    if grouped:
        notes.append(
            f"{grouped} grouped convolution ops (forward and gradients): al.apply and "
            "`autolayout run` run each on its devices' images (shard_map over the batch's mesh "
            "axes), as priced; under your own jit with these rules XLA runs them whole on every "
            "device, the batch gathered (openxla/xla#47945)"
        )
    rate = (
        f"{e.attention} of peak"
        if e.attention is not None
        else f"the matmul efficiency {e.matmul} (not measured for attention)"
    )
    # each fused kernel: the chips that run it, and what to call on the other kind
    kernels = (
        ("cuDNN", "gpu", "NVIDIA GPUs", "on a TPU call al.splash_attention (the Pallas kernel)"),
        ("splash", "tpu", "TPUs", "on a GPU call cuDNN's (jax.nn.dot_product_attention)"),
    )
    for kernel, kind, chips, instead in kernels:
        n = sum(op.primitive in ATTENTION_OPS and op.param("kernel") == kernel.lower()
                for op in g.ops)  # fmt: skip
        if n and hw.kind != kind:
            notes.append(
                f"the step calls {kernel} attention ({n} kernels), which runs only on {chips}: "
                f"priced as {hw.kind.upper()} fused attention at {rate}; {instead} to run it"
            )
        elif n and e.attention is None:
            notes.append(
                f"{kernel} attention ({n} kernels) priced at {rate}: set efficiency.attention "
                f"in {hw.source}"
            )
    return notes
