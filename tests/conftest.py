"""Loads the example models (the 8 CPU devices are set in the repo's root conftest.py)."""

from pathlib import Path

import pytest

import autolayout as al

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "experiments" / "models"
MODEL_NAMES = ("mlp", "gpt", "moe", "unet3d", "t5")


def load_model(name: str, **options) -> al.Workload:
    return al.load_workload(MODELS / f"{name}.py", **options)


@pytest.fixture(scope="session")
def gpt_graph() -> al.Graph:
    return al.trace(load_model("gpt"))
