"""The contract users need (issue 35.4): non-trainable state in ``al.train_workload`` (Flax
linen's ``batch_stats``, Keras non-trainable variables), updated by the step, laid out like
the parameters and carried by ``al.apply`` from step to step; a linen model calling cuDNN
attention loads and plans on a machine without a GPU. Skipped where the ``libraries``
extra is not installed."""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import autolayout as al
from autolayout.runtime.run import reference_losses, run

B, H, D = 16, 8, 8


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[libraries]')")


def _images(rng: np.random.Generator) -> dict:
    return {"image": rng.standard_normal((B, H, H, 3), np.float32),
            "label": rng.integers(0, 10, (B,)).astype(np.int32)}  # fmt: skip


IMAGES = {"image": jax.ShapeDtypeStruct((B, H, H, 3), jnp.float32),
          "label": jax.ShapeDtypeStruct((B,), jnp.int32)}  # fmt: skip


def _linen_bn(state_as_init: bool = False) -> al.Workload:
    import flax.linen as nn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for c in (8, 16):  # no conv bias: BatchNorm removes it (Adam would amplify noise)
                x = nn.Conv(c, (3, 3), use_bias=False)(x)
                x = nn.relu(nn.BatchNorm(use_running_average=False, momentum=0.5)(x))
            return nn.Dense(10)(jnp.mean(x, axis=(1, 2)))

    model, x0 = Net(), jnp.zeros((1, H, H, 3))

    def loss_fn(params, state, batch):
        out, updates = model.apply({"params": params, **state}, batch["image"],
                                   mutable=["batch_stats"])  # fmt: skip
        loss = optax.softmax_cross_entropy_with_integer_labels(out, batch["label"]).mean()
        return loss, updates

    variables = jax.eval_shape(model.init, jax.random.key(0), x0)
    state = {"batch_stats": variables["batch_stats"]}
    if state_as_init:
        state = lambda k: {"batch_stats": model.init(k, x0)["batch_stats"]}  # noqa: E731
    # specs, not init(key): numpy initialises them (jit of linen's init compiles for seconds)
    return al.train_workload(loss_fn, optax.adamw(1e-2), variables["params"], IMAGES, _images,
                             state=state, name="linen-bn")  # fmt: skip


def _two_steps(wl: al.Workload, f) -> tuple:
    """Two steps of ``f`` from ``wl``'s initial arguments: (initial state, state after)."""
    args = wl.init(0)
    first = args[2]
    carried = jax.tree.map(jnp.array, args[:3])
    for step in range(2):
        carried = f(*carried, *wl.batches(step, 0))[:3]
    return first, carried[2]


def _max_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a),
                                                               jax.tree.leaves(b), strict=True))  # fmt: skip


def _check_sharded_equals_unsharded(wl: al.Workload, rules: dict) -> None:
    p = al.evaluate(wl, "cpu-8", mesh={"data": 4, "model": 2}, rules=rules)
    first, want = _two_steps(wl, jax.jit(wl.fn))
    _, got = _two_steps(wl, al.apply(p, wl.fn))
    assert _max_diff(first, want) > 1e-2, "the step left the batch statistics as they were"
    assert _max_diff(got, want) <= 1e-5


def test_linen_batch_stats_are_state_named_like_the_params_and_carried_by_apply():
    """The statistics are an argument of the step (``state``), donated with the parameters,
    their dims the BatchNorm scales' (so a rule for one lays out both); two steps laid out
    over data=4 x model=2 (channels split) equal two unsharded steps."""
    _needs("flax")
    wl = _linen_bn()
    assert wl.argnames == ("params", "opt_state", "state", "batch")
    assert wl.donate_argnums == (0, 1, 2)
    g = al.trace(wl)
    assert g.opaque == []
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    for i in (0, 1):
        scale = dims[f"params/BatchNorm_{i}/scale"]
        assert dims[f"state/batch_stats/BatchNorm_{i}/mean"] == scale
        assert dims[f"state/batch_stats/BatchNorm_{i}/var"] == scale
    channels = dims["params/BatchNorm_1/scale"][0]
    _check_sharded_equals_unsharded(wl, {"batch": "data", channels: "model"})
    p = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    assert run(p, wl, steps=2).losses == pytest.approx(reference_losses(wl, steps=2), rel=1e-5)


def test_nnx_batch_stats_are_state_named_like_the_params():
    _needs("flax")
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l = nnx.Linear(D, 16, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(16, momentum=0.5, rngs=rngs)
            self.o = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.o(nnx.relu(self.bn(self.l(x))))

    graphdef = nnx.split(Net(nnx.Rngs(0)), nnx.Param, nnx.BatchStat)[0]

    def part(i):
        return lambda key: nnx.split(Net(nnx.Rngs(key)), nnx.Param, nnx.BatchStat)[i]

    def loss_fn(params, state, batch):
        model = nnx.merge(graphdef, params, state)
        y = model(batch["x"])
        return jnp.mean((y - batch["y"]) ** 2), nnx.split(model, nnx.Param, nnx.BatchStat)[2]

    data = {"x": jax.ShapeDtypeStruct((B, D), jnp.float32),
            "y": jax.ShapeDtypeStruct((B, 4), jnp.float32)}  # fmt: skip
    wl = al.train_workload(loss_fn, optax.adamw(1e-2), part(1), data, lambda rng: {
        "x": rng.standard_normal((B, D), np.float32),
        "y": rng.standard_normal((B, 4), np.float32)}, state=part(2))  # fmt: skip
    g = al.trace(wl)
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["state/bn/mean"] == dims["state/bn/var"] == dims["params/bn/scale"]


def test_state_given_as_init_is_built_by_init_state_and_the_plan_keeps_it():
    _needs("flax")
    wl = _linen_bn(state_as_init=True)
    built = jax.eval_shape(wl.init_state, jax.random.key(0))
    assert len(built) == 3
    assert jax.tree.map(lambda s: s.shape, built[2]) == jax.tree.map(lambda s: s.shape, wl.args[2])
    p = al.plan(wl, "cpu-8", time_limit_s=2, deterministic=True)
    state_inputs = [i for i in p.inputs if str(i.get("path", "")).startswith("state/")]
    assert len(state_inputs) == 4, p.inputs[:3]


def test_keras_non_trainable_variables_are_state_through_stateless_call():
    """A ``keras.Sequential`` with BatchNormalization: ``stateless_call`` returns the moving
    statistics, which the step carries; two sharded steps equal two unsharded ones."""
    _needs("keras")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        pytest.skip("Keras runs on another backend; set KERAS_BACKEND=jax")
    holder = {}

    def make():
        L = keras.layers
        m = keras.Sequential([keras.Input((D,)), L.Dense(16, use_bias=False),
                              L.BatchNormalization(momentum=0.5), L.ReLU(), L.Dense(4)])  # fmt: skip
        holder["m"] = m
        return ({v.path: v.value for v in m.trainable_variables},
                {v.path: v.value for v in m.non_trainable_variables})  # fmt: skip

    params, state = jax.eval_shape(make)
    m = holder["m"]
    order = [v.path for v in m.trainable_variables], [v.path for v in m.non_trainable_variables]

    def loss_fn(params, state, batch):
        y, new = m.stateless_call([params[k] for k in order[0]], [state[k] for k in order[1]],
                                  batch["x"], training=True)  # fmt: skip
        return jnp.mean((y - batch["y"]) ** 2), dict(zip(order[1], new, strict=True))

    data = {"x": jax.ShapeDtypeStruct((B, D), jnp.float32),
            "y": jax.ShapeDtypeStruct((B, 4), jnp.float32)}  # fmt: skip
    wl = al.train_workload(loss_fn, optax.adamw(1e-2), params, data, lambda rng: {
        "x": rng.standard_normal((B, D), np.float32) + 1.0,
        "y": rng.standard_normal((B, 4), np.float32)}, state=state)  # fmt: skip
    g = al.trace(wl)
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    bn = f"{m.name}/{m.layers[1].name}"  # Keras numbers names per process: sequential_3
    gamma = dims[f"params/{bn}/gamma"]
    assert dims[f"state/{bn}/moving_mean"] == gamma
    _check_sharded_equals_unsharded(wl, {"batch": "data", gamma[0]: "model"})


def test_state_returned_unchanged_keeps_its_slot_and_the_next_step_runs():
    """Keras' seed generators as a stranger's text model carries them: two state arrays of
    one shape (uint32[2]), the first returned as it is (a layer that draws no numbers in
    training), the second advanced. The new second takes the second's buffer and layout, not
    the first's: laid out apart (the second split), step 2 had been refused ("compiled for
    input shardings that disagree"); three laid-out steps equal three unsharded ones."""
    from autolayout.cost_models.memory import aliased_outputs
    from autolayout.cost_models.plans import donated_inputs

    seed = jax.ShapeDtypeStruct((2,), jnp.uint32)

    def loss_fn(params, state, batch):
        still, drawn = state
        noise = jax.random.uniform(jax.random.wrap_key_data(drawn), batch["x"].shape)
        y = (batch["x"] * noise) @ params["w"]
        new = jax.random.key_data(jax.random.split(jax.random.wrap_key_data(drawn))[0])
        return jnp.mean((y - batch["y"]) ** 2), (still, new)

    data = {"x": jax.ShapeDtypeStruct((B, D), jnp.float32),
            "y": jax.ShapeDtypeStruct((B, 4), jnp.float32)}  # fmt: skip
    wl = al.train_workload(loss_fn, optax.sgd(0.1), {"w": jax.ShapeDtypeStruct((D, 4), jnp.float32)},
                           data, lambda rng: {"x": rng.standard_normal((B, D), np.float32),
                                              "y": rng.standard_normal((B, 4), np.float32)},
                           state=(seed, seed))  # fmt: skip
    g = al.trace(wl)
    by_path = {g.tensors[t].path: t for t in g.inputs}
    aliased = aliased_outputs(g, donated_inputs(wl, g))
    assert by_path["state/0"] not in aliased.values()  # returned as it is
    (new,) = [o for o, i in aliased.items() if i == by_path["state/1"]]
    assert g.tensors[new].role != "input"
    drawn = g.tensors[by_path["state/1"]].dims[0]
    p = al.evaluate(
        wl, "cpu-8", mesh={"data": 4, "model": 2}, rules={"batch": "data", drawn: "model"}
    )
    assert p.layouts[by_path["state/1"]] != p.layouts[by_path["state/0"]]
    assert run(p, wl, steps=3).losses == pytest.approx(reference_losses(wl, steps=3), rel=1e-5)


def test_a_stateful_step_refuses_accumulation_and_a_bare_loss_in_one_line():
    _needs("flax")
    wl = _linen_bn()
    why = al.core.accumulation_refusal(wl)
    assert why is not None and "non-trainable state" in why and "\n" not in why

    def bare(params, state, batch):  # forgot the new state
        return jnp.sum(params["w"]) * jnp.sum(batch["x"])

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    wl = al.train_workload(bare, optax.sgd(0.1), {"w": spec}, {"x": spec},
                           lambda rng: {"x": np.ones(4, np.float32)}, state={"s": spec})  # fmt: skip
    with pytest.raises(al.TraceError, match=r"must return \(loss, new_state\)"):
        al.trace(wl)


@pytest.mark.parametrize("stateful", [False, True])
def test_a_make_batch_that_raises_is_named_in_one_line_with_its_contract(stateful):
    """A stranger wrote ``make_batch(step, seed)``; ``autolayout run`` called it with a numpy
    Generator and printed "an unexpected failure". It names the function and what it takes."""
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)

    def make_batch(step, seed=0):
        return {"x": np.full(4, step + 1000 * seed, np.float32)}

    if stateful:

        def loss(params, state, batch):
            return jnp.sum(params["w"] * batch["x"]), state

        wl = al.train_workload(loss, optax.sgd(0.1), {"w": spec}, {"x": spec}, make_batch,
                               state={"s": spec})  # fmt: skip
    else:
        wl = al.train_workload(lambda p, b: jnp.sum(p["w"] * b["x"]), optax.sgd(0.1),
                               {"w": spec}, {"x": spec}, make_batch)  # fmt: skip
    for call in (lambda: wl.batches(0), lambda: wl.init(0)):
        with pytest.raises(al.WorkloadError) as e:
            call()
        text = str(e.value)
        assert "make_batch(rng) raised TypeError" in text and "numpy Generator" in text, text
        assert "\n" not in text


def _linen_cudnn() -> al.Workload:
    import flax.linen as nn

    class Attn(nn.Module):
        @nn.compact
        def __call__(self, x):
            q, k, v = (
                nn.DenseGeneral((4, 16), dtype=jnp.bfloat16, name=n)(x) for n in ("q", "k", "v")
            )
            y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
            return nn.DenseGeneral(64, axis=(-2, -1), name="o")(y)

    model, S = Attn(), 128
    x = jax.ShapeDtypeStruct((8, S, 64), jnp.bfloat16)

    def loss_fn(params, batch):
        return jnp.mean(model.apply({"params": params}, batch["x"]).astype(jnp.float32) ** 2)

    return al.train_workload(
        loss_fn, optax.adamw(1e-3),
        lambda key: model.init(key, jnp.zeros(x.shape, x.dtype))["params"], {"x": x},
        lambda rng: {"x": rng.standard_normal(x.shape, np.float32).astype(jnp.bfloat16)},
    )  # fmt: skip


def test_a_linen_model_calling_cudnn_attention_loads_and_plans_without_a_gpu():
    """``model.init`` runs the attention too: it goes through the cuDNN stand-in the trace
    uses, so the model loads, plans (for a CPU and for GPUs) and initialises on a machine
    without one."""
    _needs("flax")
    wl = _linen_cudnn()
    g = al.trace(wl)
    assert any("dot_product_attention" in op.primitive or "cudnn" in op.primitive
               for op in g.ops), sorted({op.primitive for op in g.ops})  # fmt: skip
    for hw in ("cpu-8", "h100-8"):
        p = al.plan(wl, hw, time_limit_s=2, deterministic=True, graph=g)
        assert p.status in ("OPTIMAL", "FEASIBLE", "TIMEOUT"), (hw, p.status)
    params = wl.init(0)[0]  # real parameters too: jit drops the attention init computes
    assert jax.tree.map(lambda x: x.shape, params) == jax.tree.map(lambda s: s.shape, wl.args[0])


def test_the_libraries_extra_pins_the_versions_installed_here():
    """The ``libraries`` extra's ranges hold the versions these tests run with (those known
    to work together), each to one minor line."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version
    from pathlib import Path

    from packaging.requirements import Requirement

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    extra = tomllib.loads(text)["project"]["optional-dependencies"]["libraries"]
    for line in extra:
        req = Requirement(line)
        assert any(s.operator == "<" for s in req.specifier), f"{line}: no upper bound"
        try:
            got = version(req.name)
        except PackageNotFoundError:
            continue
        assert req.specifier.contains(got), f"{req.name} {got} installed, the extra says {line}"
