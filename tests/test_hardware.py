import pytest

import autolayout as al
from autolayout.core._hardware import _torus_shape

FAMILIES = [
    "tpu-v2",
    "tpu-v3",
    "tpu-v4",
    "tpu-v5e",
    "tpu-v5p",
    "tpu-v6e",
    "a100-80gb",
    "h100",
    "h200",
    "b200",
    "gb200-nvl72",
    "cpu",
]


def test_every_family_has_a_profile():
    assert sorted(al.list_profiles()) == sorted(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_profile_loads(family):
    name = f"{family}-8"
    hw = al.hardware(name)
    assert hw.family == family and hw.num_devices >= 1
    assert hw.chip.hbm_bytes > 0 and hw.chip.hbm_bandwidth > 0 and hw.chip.peak_flops
    assert 0 < hw.efficiency.memory_headroom <= 1
    assert family in hw.describe()


def test_every_number_in_a_profile_has_a_source_comment():
    from autolayout.core._hardware import _profile_dir

    for path in _profile_dir().glob("*.toml"):
        for line in path.read_text().splitlines():
            code = line.split("#", 1)[0]
            value = code.split("=", 1)[1].strip() if "=" in code else ""
            if value and value[0] not in "\"'" and any(ch.isdigit() for ch in value):
                assert "#" in line, f"{path.name}: {line!r} has no source comment"


@pytest.mark.parametrize(
    "name, devices, shape, wrap",
    [
        ("tpu-v4-256", 128, (4, 4, 8), (True, True, True)),
        ("tpu-v4-8", 4, (2, 2, 1), (False, False, False)),
        ("tpu-v4-64", 32, (2, 4, 4), (False, False, False)),
        ("tpu-v4-4096", 2048, (8, 16, 16), (True, True, True)),
        ("tpu-v5p-128", 64, (4, 4, 4), (True, True, True)),
        ("tpu-v5e-256", 256, (16, 16), (True, True)),
        ("tpu-v5e-128", 128, (8, 16), (False, True)),
        ("tpu-v6e-64", 64, (8, 8), (False, False)),
        ("v5litepod-16", 16, (4, 4), (False, False)),
        ("tpu-v4-4x4x8", 128, (4, 4, 8), (True, True, True)),
        # slices of 4x4x4 cubes that are not powers of two: MaxText's v4-384, PaLM's pods
        ("tpu-v4-384", 192, (4, 4, 12), (True, True, True)),
        ("tpu-v4-6144", 3072, (12, 16, 16), (True, True, True)),
        ("tpu-v5p-768", 384, (4, 8, 12), (True, True, True)),
    ],
)
def test_tpu_slice_names(name, devices, shape, wrap):
    hw = al.hardware(name)
    assert hw.num_devices == devices
    assert hw.topology.shape == shape and hw.topology.wraparound == wrap


def test_a_non_power_of_two_slice_has_mesh_shapes_and_prices_a_layout():
    from autolayout.search.meshes import mesh_shapes

    hw = al.hardware("tpu-v4-384")
    shapes = mesh_shapes(hw)
    assert {"a": 192} in shapes and {"a": 12, "b": 16} in shapes, shapes
    import jax.numpy as jnp

    def step(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    wl = al.Workload(step, (al.spec((512, 512), ("d_in", "d_out")),
                            al.spec((192 * 4, 512), ("batch", "d_in"))))  # fmt: skip
    p = al.evaluate(wl, hw, mesh={"data": 192}, rules={"batch": "data"})
    assert p.predicted["step_time_s"] > 0 and p.devices == 192


@pytest.mark.parametrize(
    "name, devices, nodes, per_node",
    [
        ("h100-64", 64, 8, 8),
        ("a100-80gb-256", 256, 32, 8),
        ("gb200-nvl72-144", 144, 2, 72),
        ("h200-4", 4, 1, 4),
        ("cpu-8", 8, 1, 8),
        ("h100", 1, 1, 1),
    ],
)
def test_gpu_and_cpu_cluster_names(name, devices, nodes, per_node):
    hw = al.hardware(name)
    assert (hw.num_devices, hw.topology.nodes, hw.topology.per_node) == (devices, nodes, per_node)


def test_torus_shape_doubles_the_smallest_axis():
    assert [_torus_shape(n, 3) for n in (4, 8, 16, 64, 128, 512)] == [
        (2, 2, 1), (2, 2, 2), (2, 2, 4), (4, 4, 4), (4, 4, 8), (8, 8, 8),
    ]  # fmt: skip


def test_a_users_own_profile_file(tmp_path):
    src = al.hardware("h100-8").source
    from autolayout.core._hardware import _profile_dir

    text = (
        (_profile_dir() / "h100.toml").read_text().replace('family = "h100"', 'family = "my-gpu"')
    )
    p = tmp_path / "my-gpu.toml"
    p.write_text(text.replace('kind = "gpu"', 'kind = "gpu"\ndevices = 16  # two nodes'))
    hw = al.hardware(str(p))
    assert hw.family == "my-gpu" and hw.num_devices == 16 and hw.topology.nodes == 2
    assert src == "hw_profiles/h100.toml"


@pytest.mark.parametrize(
    "name, message",
    [
        (
            "tpu-v9-8",
            r"unknown hardware 'tpu-v9-8': known families are a100-80gb, .*tpu-v6e; names are FAMILY-N: TPU v2/v3/v4/v5p count TensorCores",
        ),
        ("tpu-v4-7", r"count TensorCores \(2 per chip\); 7 is not a multiple of 2"),
        (
            "tpu-v4-24",
            r"12 chips is not a power of two; give the topology instead, e.g. tpu-v4-4x4x4",
        ),
        ("tpu-v5e-512", r"512 chips exceeds the largest tpu-v5e slice \(256 chips"),
        ("h100-12", r"12 GPUs is not a whole number of 8-GPU NVLink domains"),
        ("tpu-v4", r"a TPU name needs a slice size, e.g. tpu-v4-8"),
        ("tpu-v5e-4x4x4", r"tpu-v5e is a 2-D torus, got topology 4x4x4"),
    ],
)
def test_bad_names_say_what_was_expected(name, message):
    with pytest.raises(al.HardwareError, match=message):
        al.hardware(name)


GOOD = """
family = "x"
kind = "gpu"
[chip]
peak_flops = { bf16 = 1e15 }
hbm_bytes = 8e10
hbm_bandwidth = 3e12
[naming]
counts = "gpus"
max_chips = 64
[nvlink]
domain_size = 8
bandwidth = 4.5e11
latency_s = 2e-6
[network]
bandwidth_per_gpu = 5e10
latency_s = 4e-6
[efficiency]
matmul = 0.8
memory = 0.8
collective = 0.8
overlap = 0.5
memory_headroom = 0.9
"""


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s + "\n[chip\n", r"x.toml: not valid TOML"),
        (
            lambda s: s.replace("bandwidth = 4.5e11", "bandwith = 4.5e11"),
            r"x.toml: unknown key 'nvlink.bandwith'; \[nvlink\] takes domain_size, bandwidth, latency_s",
        ),
        (
            lambda s: s.replace("bandwidth = 4.5e11", 'bandwidth = "450 GB/s"'),
            r"x.toml: key 'nvlink.bandwidth' must be bytes per second, one way, per GPU \(a positive finite number\), got '450 GB/s'",
        ),
        # TOML reads inf and nan as floats; an infinite bandwidth made every transfer free
        (
            lambda s: s.replace("hbm_bandwidth = 3e12", "hbm_bandwidth = inf"),
            r"x.toml: key 'chip.hbm_bandwidth' must be .* \(a positive finite number\), got inf$",
        ),
        (
            lambda s: s.replace("bandwidth = 4.5e11", "bandwidth = nan"),
            r"x.toml: key 'nvlink.bandwidth' must be .* \(a positive finite number\), got nan$",
        ),
        (
            lambda s: s.replace("latency_s = 4e-6", "latency_s = -4e-6"),
            r"x.toml: key 'network.latency_s' must be .* \(a positive finite number\), got -4e-06$",
        ),
        (
            lambda s: s.replace("hbm_bytes = 8e10", "hbm_bytes = 0"),
            r"x.toml: key 'chip.hbm_bytes' must be .* \(a positive finite number\), got 0$",
        ),
        (
            lambda s: s.replace("bf16 = 1e15", "bf16 = -inf"),
            r"x.toml: key 'chip.peak_flops.bf16' must be FLOP/s \(a positive finite number\), got -inf$",
        ),
        (
            lambda s: s.replace("overlap = 0.5", "overlap = nan"),
            r"x.toml: key 'efficiency.overlap' must be .* \(a number from 0 to 1\), got nan$",
        ),
        (
            lambda s: s.replace("hbm_bytes = 8e10\n", ""),
            r"x.toml: missing key 'chip.hbm_bytes' \(bytes of HBM per chip\)",
        ),
        (
            lambda s: s.replace('kind = "gpu"', 'kind = "fpga"'),
            r"key 'kind' must be 'tpu', 'gpu' or 'cpu'",
        ),
        (
            lambda s: s.replace("matmul = 0.8", "matmul = 80"),
            r"key 'efficiency.matmul' must be .* \(a number from 0 to 1\), got 80",
        ),
        (
            lambda s: s.replace("[network]", "[ici]\ntopology = 'torus2d'\n[network]"),
            r"unknown section \[ici\] for a gpu profile",
        ),
        (
            lambda s: s.replace("[network]\nbandwidth_per_gpu = 5e10\nlatency_s = 4e-6\n", ""),
            r"missing section \[network\]",
        ),
    ],
)
def test_bad_profile_files_name_the_file_and_key(tmp_path, edit, message):
    p = tmp_path / "x.toml"
    p.write_text(edit(GOOD))
    with pytest.raises(al.HardwareError, match=message):
        al.hardware(str(p))


def test_a_missing_profile_file(tmp_path):
    with pytest.raises(al.HardwareError, match="profile file does not exist"):
        al.hardware(str(tmp_path / "nope.toml"))


def test_a_profile_file_takes_its_device_count_once(tmp_path):
    """--hw ./mine.toml --devices 64, or devices = N in the file; no count at all used to
    mean 1 device silently, and two counts that disagree are ambiguous."""
    p = tmp_path / "mine.toml"
    p.write_text(GOOD)
    with pytest.raises(al.HardwareError, match=r"mine.toml: how many devices\? pass --devices N"):
        al.hardware(str(p))
    hw = al.hardware(str(p), devices=16)
    assert hw.num_devices == 16 and hw.topology.nodes == 2
    p.write_text(GOOD.replace('kind = "gpu"', 'kind = "gpu"\ndevices = 8'))
    assert al.hardware(str(p)).num_devices == 8
    assert al.hardware(str(p), devices=8).num_devices == 8
    with pytest.raises(al.HardwareError, match="says devices = 8 and --devices says 16: give one"):
        al.hardware(str(p), devices=16)
    assert al.hardware("h100", devices=64).name == "h100-64"
    with pytest.raises(al.HardwareError, match="names 8 devices and --devices says 64"):
        al.hardware("h100-8", devices=64)


def test_the_cli_takes_devices_for_a_profile_file(tmp_path):
    from click.testing import CliRunner

    from autolayout._cli import main
    from conftest import MODELS

    p = tmp_path / "mine.toml"
    p.write_text(GOOD.replace("{ bf16 = 1e15 }", "{ bf16 = 1e15, f32 = 5e14 }"))
    mlp = str(MODELS / "mlp.py")
    r = CliRunner().invoke(main, ["evaluate", mlp, "--hw", str(p), "--layout", "dp"])
    assert r.exit_code == 2 and "how many devices?" in r.output
    r = CliRunner().invoke(main, ["evaluate", mlp, "--hw", str(p), "--devices", "16",
                                  "--layout", "dp"])  # fmt: skip
    assert r.exit_code == 0 and "mesh data=16" in r.output, r.output


@pytest.mark.parametrize("family", ["a100-80gb", "h100", "h200", "b200", "gb200-nvl72"])
def test_every_gpu_profile_prices_a_float32_model(family):
    """JAX runs a float32 dot on these GPUs as TF32 at default precision; a profile without
    an f32 peak made every float32 model unplannable."""
    import jax.numpy as jnp

    def step(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    hw = al.hardware(f"{family}-8" if family != "gb200-nvl72" else "gb200-nvl72-72")
    n = hw.num_devices
    wl = al.Workload(step, (al.spec((512, 512), ("d_in", "d_out")),
                            al.spec((8 * n, 512), ("batch", "d_in"))))  # fmt: skip
    p = al.evaluate(wl, hw, mesh={"data": n}, rules={"batch": "data"})
    assert 0 < p.predicted["compute_s"] and hw.chip.peak_flops["f32"] < hw.chip.peak_flops["bf16"]
