"""The example models: each tiny size builds, runs a real train step on the CPU and learns."""

import jax
import numpy as np
import pytest

from conftest import MODEL_NAMES, load_model


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_model_runs_two_steps_and_the_loss_falls(name):
    wl = load_model(name)
    params, opt_state, batch = wl.init(0)
    for leaf, spec in zip(
        jax.tree.leaves((params, opt_state, batch)), jax.tree.leaves(wl.args), strict=True
    ):
        assert leaf.shape == spec.shape and leaf.dtype == spec.dtype
    step = jax.jit(wl.fn)
    losses = []
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0], losses


def test_gpt_sizes_and_overrides():
    wl = load_model("gpt", size="gpt3-175b")
    assert wl.options["layers"] == 96 and wl.options["d_model"] == 12288
    params = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(wl.args[0]))
    assert 174e9 < params < 176e9
    small = load_model("gpt", size="tiny", layers=3, d_model=32)
    assert len(small.args[0]["layers"]) == 3 and small.args[0]["embed"].shape == (512, 32)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_unknown_options_are_refused(name):
    import autolayout as al

    with pytest.raises(al.ModelFileError, match=r"workload\(bogus=1\) raised"):
        load_model(name, bogus=1)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_models_recorded_options_rebuild_it(name):
    """`autolayout run` and `validate` rebuild a plan's model from the options its file
    records: every example takes back what it records and builds the same step (MoE
    recorded its derived `capacity`, which it does not take: every MoE plan file failed)."""
    wl = load_model(name)
    again = load_model(name, **wl.options)
    assert again.options == wl.options
    assert jax.tree.structure(again.args) == jax.tree.structure(wl.args)
