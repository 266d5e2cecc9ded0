"""Gives JAX 8 CPU devices before it is imported (as the runtime tests need), and loads
the example models."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

import autolayout as al  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "experiments" / "models"
MODEL_NAMES = ("mlp", "gpt", "moe", "unet3d", "t5")


def load_model(name: str, **options) -> al.Workload:
    return al.load_workload(MODELS / f"{name}.py", **options)


@pytest.fixture(scope="session")
def gpt_graph() -> al.Graph:
    return al.trace(load_model("gpt"))
