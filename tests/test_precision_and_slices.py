"""Precision as JAX runs a float32 dot, and TPU jobs of several slices joined by the
data-centre network (issue 22, items 2 and 5)."""

import jax
import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.cost_models import collective_time, peak_flops, place_mesh


@pytest.mark.parametrize(
    ("hw", "default", "high", "highest"),
    [
        ("h100-8", 4.95e14, 4.95e14, 6.7e13),  # TF32, TF32, the CUDA cores
        ("a100-80gb-8", 1.56e14, 1.56e14, 1.95e13),
        ("tpu-v4-8", 2.75e14, 2.75e14 / 3, 2.75e14 / 6),  # 1, 3 or 6 bf16 passes
        ("cpu-8", 5e10, 5e10, 5e10),
    ],
)
def test_float32_peaks_follow_the_precision(hw, default, high, highest):
    h = al.hardware(hw)
    got = [peak_flops(h, "float32", p) for p in ("default", "high", "highest")]
    assert got == pytest.approx([default, high, highest])


def _f32_step():
    def step(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    return al.Workload(step, (al.spec((1024, 1024), ("d_in", "d_out")),
                              al.spec((4096, 1024), ("batch", "d_in"))))  # fmt: skip


@pytest.mark.parametrize("hw", ["h100-1", "h200-1", "a100-80gb-1", "b200-1", "gb200-nvl72-1"])
def test_every_gpu_profile_prices_a_float32_step_at_every_precision(hw):
    wl = _f32_step()
    times = {}
    for p in ("bfloat16", "tensorfloat32", "float32"):
        with jax.default_matmul_precision(p):
            g = al.trace(wl)
        times[p] = al.evaluate(wl, hw, mesh={"data": 1}, rules={}, graph=g).predicted["compute_s"]
    # HIGHEST runs on the CUDA cores: slower than TF32; bfloat16 / tensorfloat32 both TF32
    assert times["float32"] > 3 * times["tensorfloat32"]
    assert times["bfloat16"] == pytest.approx(times["tensorfloat32"])


def test_a_dots_own_precision_is_read():
    def step(w, x):
        return jax.grad(lambda w: jnp.sum(jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST)))(w)

    g = al.trace(al.Workload(step, (al.spec((64, 64), ("a", "b")), al.spec((32, 64), ("n", "a")))))
    dots = [op for op in g.ops if op.primitive == "dot_general"]
    assert dots and all(op.param("precision") == "highest" for op in dots)


def test_two_slices_are_one_hardware_with_the_slices_outermost_on_dcn():
    hw = al.hardware("2xtpu-v5p-256")
    one = al.hardware("tpu-v5p-256")
    assert hw.num_devices == 2 * one.num_devices == 256
    placed = place_mesh(hw, {"slice": 2, "fsdp": 128})
    assert [s.level for s in placed["slice"]] == ["dcn"]
    assert {s.level for s in placed["fsdp"]} == {"ici"}
    # an all-reduce over the slices alone moves V per chip over DCN: V (m-1)/m / W * 2
    v = 1e9
    want = 2 * (1e-5 + v / 2 / (6.25e9 * hw.efficiency.collective))
    assert collective_time(hw, "all-reduce", placed["slice"], v) == pytest.approx(want)


def test_two_slices_price_maxtexts_layout_on_dcn_and_the_planner_matches_it():
    """MaxText's multi-slice layout: data parallelism across the slices (on DCN), FSDP
    inside each. The same layout on one slice of as many chips has no DCN to cross."""
    wl = al.load_workload("experiments/models/gpt.py", size="gpt3-xl", scan=True, remat="full",
                          batch=512, attention="naive")  # fmt: skip
    mesh = {"data": 2, "fsdp": 128}
    rules = {"batch": ("data", "fsdp"), "d_model": "fsdp"}
    two = al.evaluate(wl, "2xtpu-v5p-256", mesh=mesh, rules=rules).predicted
    one = al.evaluate(wl, "tpu-v5p-512", mesh=mesh, rules=rules).predicted
    assert two["comm_s"] > one["comm_s"]
    assert two["compute_s"] == pytest.approx(one["compute_s"])
    p = al.plan(wl, "2xtpu-v5p-256", time_limit_s=20, deterministic=True)
    assert p.status in ("OPTIMAL", "FEASIBLE")
    # within the 1% the planner gives a plain standard layout over a search result
    assert p.predicted["step_time_s"] <= two["step_time_s"] * 1.01


@pytest.mark.parametrize("name", ["3xtpu-v3-8", "2xh100-8", "0xtpu-v4-8"])
def test_bad_multislice_names_fail_in_one_line(name):
    with pytest.raises(al.HardwareError) as e:
        al.hardware(name)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("hw", ["a100-80gb-8", "h100-8", "h200-8", "b200-8", "gb200-nvl72-72"])
def test_every_gpu_profile_plans_a_float32_model(hw):
    """A user's float32 transformer (no names, AdamW) plans on every GPU profile: its dots
    run as TF32 there, as JAX runs them (the profiles used to refuse float32)."""
    wl = al.load_workload("experiments/models/my_transformer.py", layers=2, d_model=128,
                          d_ff=512, batch=72)  # fmt: skip
    p = al.plan(wl, hw, time_limit_s=5, deterministic=True)
    assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT") and p.predicted["fits"]
    assert p.predicted["dtype"] == "float32" and p.predicted["mfu"] > 0
