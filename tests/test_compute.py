import pytest

import autolayout as al
from autolayout.cost_models.compute import op_time, peak_flops


def test_a_big_matmul_is_compute_bound():
    # H100: [8192 x 8192] @ [8192 x 8192] in bf16: 2 * 8192^3 = 1.0995e12 FLOP at
    # 9.89e14 * 0.8 = 7.912e14 FLOP/s -> 1.390e-3 s; bytes 3 * 8192^2 * 2 = 4.03e8 at
    # 3.35e12 * 0.85 -> 1.415e-4 s: compute wins; plus the 5.6 us every kernel costs.
    hw = al.hardware("h100")
    flops, nbytes = 2 * 8192**3, 3 * 8192**2 * 2
    assert op_time(hw, "dot_general", flops, nbytes, "bfloat16") == pytest.approx(
        flops / (9.89e14 * 0.8) + 5.6e-6
    )


def test_a_thin_matmul_and_an_elementwise_op_are_memory_bound():
    # v5e: [16 x 8192] @ [8192 x 8192]: intensity ~ 16 FLOP/byte, far below v5e's 240.
    hw = al.hardware("tpu-v5e-8")
    flops, nbytes = 2 * 16 * 8192**2, (16 * 8192 * 2 + 8192**2 * 2 + 16 * 8192 * 2)
    t = op_time(hw, "dot_general", flops, nbytes, "bfloat16")
    assert t == pytest.approx(nbytes / (8.19e11 * 0.85))
    assert op_time(hw, "add", 1e12, 4e6, "bfloat16") == pytest.approx(4e6 / (8.19e11 * 0.85))


def test_peak_by_dtype():
    assert peak_flops(al.hardware("h100"), "float8_e4m3fn") == 1.979e15
    assert peak_flops(al.hardware("tpu-v5e-8"), "int8") == 3.94e14
    assert peak_flops(al.hardware("tpu-v4-8"), "float32") == 2.75e14  # one bf16 pass on TPU
    assert peak_flops(al.hardware("h100"), "float32") == 4.95e14  # TF32, JAX's f32 dot there
    with pytest.raises(
        al.HardwareError,
        match=r"hw_profiles/h100.toml: no peak FLOP/s for dtype 'int8'.*add chip.peak_flops.int8",
    ):
        peak_flops(al.hardware("h100"), "int8")
    # a wider integer dot (Flax BigBird's band mask) runs off the fast paths: the slowest float
    # rate the profile states (was an error: the model could not be planned)
    assert peak_flops(al.hardware("h100"), "int32") == 6.7e13
    assert peak_flops(al.hardware("tpu-v4-8"), "int32") == 2.75e14


def test_a_plan_says_what_its_3d_convolutions_are_priced_at():
    """3-D convolutions run far below the matmul rate on GPUs (the H200's U-Net: 0.43% of
    peak); a plan on a profile that prices them so says it, one that does not stays quiet."""
    from autolayout.cost_models import kernel_notes
    from conftest import load_model

    g = al.trace(load_model("unet3d"))
    (note,) = kernel_notes(g, al.hardware("h100-8"))
    assert "3-D convolutions priced at 0.43% of peak" in note and "h100.toml" in note
    assert kernel_notes(g, al.hardware("tpu-v4-8")) == []
