"""The package installs as one namespace: no top-level search/runtime in site-packages."""

import subprocess
import sys
import zipfile
from pathlib import Path

import autolayout as al

ROOT = Path(__file__).resolve().parent.parent


def test_subpackages_are_under_autolayout():
    import autolayout.cost_models
    import autolayout.hw_profiles
    import autolayout.runtime
    import autolayout.search

    assert Path(autolayout.search.__file__).parent.name == "search"
    assert Path(autolayout.hw_profiles.__file__).parent.name == "hw_profiles"
    assert al.__version__


def test_wheel_holds_only_the_autolayout_namespace(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("autolayout-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"autolayout", next(t for t in tops if t.endswith(".dist-info"))}
    for sub in ("cost_models", "search", "runtime", "hw_profiles"):
        assert f"autolayout/{sub}/__init__.py" in names
    assert "autolayout/hw_profiles/tpu-v4.toml" in names
    entry = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith("entry_points.txt")))
        .decode()
    )
    assert "autolayout = autolayout._cli:entry" in entry


def test_jax_sees_eight_cpu_devices():
    import jax

    assert len(jax.devices()) == 8 and jax.devices()[0].platform == "cpu"
