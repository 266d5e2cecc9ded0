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


def check_request_prices_like_price(wl: al.Workload, g: al.Graph, hw, choices: int, seed: int):
    """For ``choices`` random layouts of ``g`` on a 2 x 4 mesh of ``hw``: the search's request
    says the step time and memory ``price`` says, and ``price``'s reuse of the costs of ops
    alike equals pricing each op alone (the cost caches key on everything a cost reads)."""
    import random

    from autolayout.cost_models import donated_inputs, price
    from autolayout.search import liveness
    from autolayout.search import request as rq
    from autolayout.search import structure as st_mod

    donated = donated_inputs(wl, g)
    req = rq.build(st_mod.analyse_on(g, hw, donated=donated), hw, {"a": 2, "b": 4})
    rnd = random.Random(seed)
    for _ in range(choices):
        choice = [rnd.choice(req.allowed(n)) for n in range(len(req.nodes))]
        layouts, assigns = req.layouts_of(choice), req.assigns_of(choice)
        args = (g, hw, req.machine.mesh, layouts, lambda op, groups, a=assigns: list(a[op.name]))
        fast = price(*args, donated=donated)["predicted"]
        assert price(*args, donated=donated, reuse=False)["predicted"] == fast
        assert req.objective(choice) == pytest.approx(fast["step_time_s"], rel=1e-9)
        assert liveness.memory_peak(req, choice)[0] == fast["memory_bytes_per_device"]
        # the array walk finds the same peak at the same point as liveness_peak itself
        arrays = liveness._Liveness(req.structure).peak(req, choice)
        assert arrays == liveness.memory_peak_walk(req, choice) == liveness.memory_peak(req, choice)
