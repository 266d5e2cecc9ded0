"""Models from other libraries (issue 21), as a user writes them, no dim named: Hugging Face
Flax Llama and BERT, an Equinox ViT, a Keras 3 GPT-2 through ``stateless_call``, a Flax NNX
LM with sharding metadata. Skipped where the ``libraries`` extra is not installed
(``.ci/run`` installs it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import autolayout as al
from autolayout.core._report import rule_lines
from autolayout.runtime.run import reference_losses, run
from search.baselines import standard_layout, standard_layouts

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "experiments" / "models" / "libraries"
NEEDS = {"hf_llama": "transformers", "hf_bert": "transformers", "eqx_vit": "equinox",
         "keras_gpt2": "keras", "nnx_lm": "flax"}  # fmt: skip
ROLES = {
    "hf_llama": {"batch", "seq", "vocab", "d_model", "heads", "head_dim", "kv_heads", "d_ff"},
    "hf_bert": {"batch", "seq", "vocab", "d_model", "heads", "head_dim", "d_ff"},
    "eqx_vit": {"batch", "seq", "classes", "d_model", "heads", "head_dim", "d_ff"},
    "keras_gpt2": {"batch", "seq", "vocab", "d_model", "heads", "head_dim", "d_ff"},
    # the NNX model's own names (nnx.with_partitioning) are kept
    "nnx_lm": {"batch", "seq", "vocab", "embed", "heads", "kv", "mlp"},
}


def _load(name: str, **options) -> al.Workload:
    if importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{NEEDS[name]} is not installed (pip install -e '.[libraries]')")
    return al.load_workload(LIB / f"{name}.py", **options)


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_tiny_model_is_named_by_role_planned_and_runs_as_unsharded(name):
    wl = _load(name)
    g = al.trace(wl)
    assert g.opaque == []
    assert ROLES[name] <= set(g.dims), sorted(g.dims)
    assert not [d for d in g.dims if "/" in d]  # no dim named by a parameter path
    p = al.plan(wl, "cpu-8", time_limit_s=3, deterministic=True, graph=g)
    assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT")  # TIMEOUT: the limit, a plan found
    got = run(p, wl, steps=3).losses
    assert got == pytest.approx(reference_losses(wl, steps=3), rel=1e-5), (name, p.mesh)


def test_layer_copies_share_their_dims_and_megatron_splits_heads_and_d_ff():
    """Three layers name no more dims than one (the d_ff of layer 2 is layer 0's), and the
    hand-written Megatron layouts split attention heads and the MLP, as Megatron-LM does."""
    one, three = (al.trace(_load("hf_llama", layers=n)) for n in (1, 3))
    roles = {d for d in three.dims if ":" not in d}
    assert roles == {d for d in one.dims if ":" not in d}
    layouts = standard_layouts(three, 4)
    assert {"heads", "d_ff"} <= {d for d, _ in layouts["megatron"][1]}
    assert {"heads", "d_ff"} <= {d for d, a in layouts["2d"][1] if a == ("tensor",)}


def test_an_equinox_models_report_groups_its_ops_by_block_not_by_module_class():
    """Equinox scopes every module call by its class (``eqx.nn.Linear``): no layer. The
    report's ``layer`` column takes the block from the weights' paths (``blocks.1``)."""
    wl = _load("eqx_vit")
    r = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules=[]).report()
    by = r.groupby("layer")["time_s"].sum()
    assert {"blocks.0", "blocks.1"} <= set(by.index), by
    assert by[[x for x in by.index if x.startswith("eqx.")]].sum() < 0.05 * by.sum(), by


_VOXELS = """
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, optax
import autolayout as al

class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        for c in (16, 32):
            x = nn.relu(nn.GroupNorm(num_groups=4)(nn.Conv(c, (3, 3, 3))(x)))
            x = nn.Conv(c, (3, 3, 3), strides=(2, 2, 2))(x)
        return nn.Dense(10)(x.mean(axis=(1, 2, 3)))

def workload(batch=16, size=16):
    net = Net()
    init = lambda key: net.init(key, jnp.zeros((1, size, size, size, 1)))["params"]
    def loss_fn(params, b):
        logits = net.apply({"params": params}, b["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()
    def make_batch(rng):
        return {"x": rng.standard_normal((batch, size, size, size, 1)).astype(np.float32),
                "y": rng.integers(0, 10, (batch,)).astype(np.int32)}
    specs = {"x": jax.ShapeDtypeStruct((batch, size, size, size, 1), jnp.float32),
             "y": jax.ShapeDtypeStruct((batch,), jnp.int32)}
    return al.train_workload(loss_fn, optax.adam(1e-3), init, specs, make_batch)
"""


def test_a_plan_is_never_fatter_than_an_equally_fast_hand_layout(tmp_path):
    """A user's float32 3-D CNN (Flax): the search found data parallelism's step time with
    the batch input kept whole (it is sliced for free), 17% more memory; the plan is the
    hand layout then, and says why."""
    pytest.importorskip("flax")
    (tmp_path / "voxels.py").write_text(_VOXELS)
    wl = al.load_workload(tmp_path / "voxels.py")
    p = al.plan(wl, "cpu-8", time_limit_s=2)
    dp = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules=[("batch", ("data",))]).predicted
    assert p.predicted["step_time_s"] <= dp["step_time_s"] * (1 + 1e-9)
    assert p.predicted["memory_bytes_per_device"] <= dp["memory_bytes_per_device"]
    assert ("batch", ("data",)) in p.rules(), p.rules()


def test_metadata_names_and_role_names_print_one_rule_line_per_role():
    wl = _load("hf_llama", layers=4)
    p = al.evaluate(wl, "cpu-8", mesh={"data": 2, "model": 4},
                    rules=[("batch", ("data",)), ("heads", ("model",)), ("d_ff", ("model",))])  # fmt: skip
    lines = rule_lines(p)
    assert len(lines) <= 15 and all("/" not in line for line in lines), lines


@pytest.mark.parametrize("layout", ["dp", "fsdp"])
@pytest.mark.parametrize("name", sorted(NEEDS))
def test_predicted_collective_counts_are_what_xla_compiles(name, layout):
    """Gradient all-reduces (DP) and FSDP's gathers and reduce-scatters are counted as XLA
    combines them: within 10% of the compiled program's count on 8 CPU devices."""
    wl = _load(name)
    g = al.trace(wl)
    mesh, rules = standard_layout(g, layout, 8)
    rows = al.validate(al.evaluate(wl, "cpu-8", mesh=mesh, rules=rules, graph=g), wl)
    colls = rows[rows["predicted_count"].notna()]
    assert len(colls)
    for r in colls.itertuples():
        assert abs(r.predicted_count - r.compiled_count) <= max(1, round(0.1 * r.compiled_count)), r
    assert rows["ok"].all(), rows


def test_flax_logical_partitioning_names_are_the_dim_names():
    """A linen model whose weights carry ``nn.with_logical_partitioning`` names: the rules
    come out in those names (the metadata reader; flax is a test dependency)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            init = nn.initializers.lecun_normal()
            h = nn.Dense(64, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
            return nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(
                jax.nn.relu(h)
            )

    model = MLP()
    wl = al.train_workload(
        lambda p, b: jnp.mean((model.apply({"params": p}, b["x"]) - b["x"]) ** 2),
        optax.adamw(1e-3),
        lambda key: model.init(key, jnp.zeros((1, 16)))["params"],
        {"x": jax.ShapeDtypeStruct((32, 16), jnp.float32)},
        lambda rng: {"x": rng.standard_normal((32, 16)).astype(np.float32)},
    )
    g = al.trace(wl)
    assert {"embed", "mlp", "batch"} <= set(g.dims)
    assert g.input_tensor("params/Dense_0/kernel").dims == ("embed", "mlp")
    p = al.evaluate(wl, "cpu-8", mesh={"data": 4, "model": 2},
                    rules=[("batch", ("data",)), ("mlp", ("model",))], graph=g)  # fmt: skip
    assert run(p, wl, steps=2).losses == pytest.approx(reference_losses(wl, steps=2), rel=1e-5)
