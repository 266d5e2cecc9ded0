"""Dims named from the program's structure (issue 35 item 3): every unrolled layer shares its
dims, and no dim is named by an op id or a layer index, over the example, library and corpus
models at their tiny sizes. What still is, each model listed with why (xfail, strict)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import autolayout as al
from autolayout.core._roles import path_name, resized_name

MODELS = Path(__file__).resolve().parent.parent / "experiments/models"
OP_ID = re.compile(r"\w+\.\d+:\d+|^t\d+:\d+")  # iota.130:2, t66:0
INDEX = re.compile(r"\.\d+$|\.\d+[#(*/+-]")  # w1.0, train.3#5, Dense_0.0#2
LIBRARY = {"hf_": "transformers", "eqx_": "equinox", "keras_": "keras", "nnx_": "flax"}

# what the naming does not yet name from structure, per model (each one fails today)
NOT_YET = {
    "corpus/moe_rotary.py": "jnp.stack's new axis, iota-built rotary tables and the experts' "
    "reshapes have no role",
    "libraries/hf_bert.py": "the head mask [layers, heads] is built by broadcast, no role",
    "libraries/hf_t5.py": "encoder and decoder sequences and relative-position buckets meet "
    "in one family: seq#2, seq#4, seq#5 of other families than seq",
    "t5.py": "the decoder's self-attention keys (seq#2) are of another family than seq",
}


def _files() -> list[str]:
    out = []
    for pattern in ("*.py", "libraries/*.py", "corpus/*.py"):
        for p in sorted(MODELS.glob(pattern)):
            if not p.name.startswith("_") and "def workload" in p.read_text():
                out.append(str(p.relative_to(MODELS)))
    return out


def _needs(rel: str) -> None:
    for prefix, lib in LIBRARY.items():
        if Path(rel).name.startswith(prefix) and importlib.util.find_spec(lib) is None:
            pytest.skip(f"{lib} is not installed (pip install -e '.[libraries]')")


def bad_names(g: al.Graph) -> list[str]:
    """Dims named by an op id, a weight's axis index or a layer copy: ``X#k`` is a further
    dim of a family only where ``X`` is a dim of the same family (``seq#2``: the keys)."""
    out = []
    for d, info in g.dim_info.items():
        if OP_ID.search(d) or INDEX.search(d):
            out.append(d)
        elif "#" in d:
            base = g.dim_info.get(d.split("#", 1)[0])
            if base is None or base.family != info.family:
                out.append(d)
    return out


@pytest.mark.parametrize(
    "rel",
    [
        pytest.param(f, marks=pytest.mark.xfail(reason=NOT_YET[f], strict=True))
        if f in NOT_YET else f
        for f in _files()
    ],
)  # fmt: skip
def test_no_dim_named_by_an_op_id_or_a_layer_index(rel):
    _needs(rel)
    g = al.trace(al.load_workload(MODELS / rel))
    assert bad_names(g) == [], f"{rel}: {list(g.dims)}"


def test_the_list_of_exceptions_names_only_models_that_exist():
    assert set(NOT_YET) <= set(_files())


@pytest.mark.parametrize("name", ["hf_llama", "hf_mistral"])
def test_unrolled_layers_share_their_dims(name):
    """HF Flax Llama/Mistral unroll their layers; each layer's RoPE halves (slices of
    head_dim), its causal mask and its backward's splits were a dim per layer (Mistral-7B:
    335 dims): now one set, whatever the depth."""
    _needs(f"libraries/{name}.py")
    path = MODELS / "libraries" / f"{name}.py"
    two = al.trace(al.load_workload(path, layers=2)).dims
    four = al.trace(al.load_workload(path, layers=4)).dims
    assert two == four
    assert len(four) <= 20
    assert four["head_dim_half"] == four["head_dim"] // 2  # RoPE's halves, of every layer
    assert {"kv_heads", "q_per_kv", "heads", "head_dim", "d_ff", "vocab"} <= set(four)


def test_resized_and_weight_names():
    assert resized_name("head_dim", 128, 64) == "head_dim_half"
    assert resized_name("height", 32, 8) == "height_4th"
    assert resized_name("seq", 16, 15) == "seq-1"
    assert resized_name("seq", 16, 64) == "seq+48"
    assert resized_name("seq", 16, 16) == "seq_table"
    assert path_name("params/model/layers/17/mlp/down_proj/kernel") == "down_proj"
    assert path_name("params/w1") == "w1"


def test_a_weight_is_named_without_its_axis_index():
    """A weight's axes no role names: its last is the weight's name, the one before
    ``_in``."""
    import jax
    import jax.numpy as jnp

    def step(params, x):
        def loss(p):
            h = jnp.tanh(x @ p["w1"])
            return jnp.sum(h @ p["w2"])

        return jax.tree.map(lambda w, d: w - 0.1 * d, params, jax.grad(loss)(params))

    params = {"w1": al.spec((12, 24), (None, None)), "w2": al.spec((24, 20), (None, None))}
    g = al.trace(al.Workload(step, (params, al.spec((8, 12), (None, None)))))
    assert set(g.dims) >= {"w1", "w2"} and not bad_names(g), g.dims
    assert g.dims["w1"] == 24 and g.dims["w2"] == 20


def test_a_model_is_named_after_its_file_unless_it_says_otherwise(tmp_path):
    """Issue 35: models built with ``al.train_workload`` were named ``loss_fn``; a model
    file's workload is named after the file unless ``name=`` gives one."""
    import autolayout as al
    from conftest import MODELS

    assert al.load_workload(MODELS / "tagged_mlp.py").name == "tagged_mlp"
    src = (
        "import jax, jax.numpy as jnp, optax\nimport autolayout as al\n\n\n"
        "def workload(name=None):\n"
        "    def loss_fn(p, b):\n"
        "        return jnp.mean((b['x'] @ p['w']) ** 2)\n\n"
        "    params = {'w': jax.ShapeDtypeStruct((8, 8), jnp.float32)}\n"
        "    batch = {'x': jax.ShapeDtypeStruct((4, 8), jnp.float32)}\n"
        "    make = lambda rng: {'x': rng.standard_normal((4, 8), 'float32')}\n"
        "    return al.train_workload(loss_fn, optax.sgd(0.1), params, batch, make, name=name)\n"
    )
    (tmp_path / "my_model.py").write_text(src)
    assert al.load_workload(tmp_path / "my_model.py").name == "my_model"
    assert al.load_workload(tmp_path / "my_model.py", name="mine").name == "mine"
