"""Dims named from the program's structure (issue 35 item 3): every unrolled layer shares its
dims, and no dim is named by an op id or a layer index, over the example, library and corpus
models at their tiny sizes, nor a dim every instance of a repeated module shares by one
instance's automatic name (``MixerBlock_0``). What still is, each model listed with why
(xfail, strict)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import autolayout as al
from autolayout.core import accumulate, op_labels, op_layers
from autolayout.core._ir import name_size
from autolayout.core._roles import instance_free, path_name, resized_name

MODELS = Path(__file__).resolve().parent.parent / "experiments/models"
OP_ID = re.compile(r"\w+\.\d+:\d+|^t\d+:\d+")  # iota.130:2, t66:0
INDEX = re.compile(r"\.\d+$|\.\d+[#(*/+-]|_ax\d")  # w1.0, train.3#5, Dense_0.0#2, conv2d_ax0
NUMBER = re.compile(r"^\d+(?:$|[#(])")  # 0, 1#2: a list's or a tuple's index (batch/0)
LIBRARY = {"hf_": "transformers", "eqx_": "equinox", "keras_": "keras", "nnx_": "flax"}

# what the naming does not yet name from structure, per model (each one fails today)
NOT_YET: dict[str, str] = {}


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


_INSTANCE = re.compile(r"(.+?)_(\d+)")  # a module instance's automatic name: Dense_0


def instance_named(g: al.Graph) -> list[str]:
    """Dims named after one instance ``X_k`` of a repeated module (Flax's and Keras's
    automatic names: ``MixerBlock_0``, ``batch_normalization_74``) whose weights in other
    instances ``X_j`` carry it too: a dim every block shares, named by one block."""
    carriers: dict[str, set[str]] = {}
    for t in g.inputs:
        tt = g.tensors[t]
        for d in tt.dims:
            if d:
                carriers.setdefault(d, set()).add(tt.path or "")
    out = set()
    for d, paths in carriers.items():
        parts = {p: [c for c in re.split(r"[/.\[\]]", p) if c] for p in paths}
        for cs in parts.values():
            for c in cs:
                m = _INSTANCE.fullmatch(c)
                if m and re.search(rf"(?<![A-Za-z0-9]){re.escape(c)}(?![0-9])", d) and any(
                    (m2 := _INSTANCE.fullmatch(c2)) and m2[1] == m[1] and c2 != c
                    for q in parts.values() for c2 in q
                ):  # fmt: skip
                    out.add(d)
    return sorted(out)


def bad_names(g: al.Graph) -> list[str]:
    """Dims named by an op id, a weight's axis index or a layer copy: ``X#k`` is a further
    dim of a family only where ``X`` is a dim of the same family (``seq#2``: the keys), or
    of a name at one of its sizes (``channels(64)#2``)."""
    out = []
    for d, info in g.dim_info.items():
        if OP_ID.search(d) or INDEX.search(d) or NUMBER.search(d):
            out.append(d)
        elif "#" in d:  # (or a further dim of one name and size that a tensor holds with
            # it: a conv's in and out channels of one size, channels(64) and channels(64)#2)
            first = d.split("#", 1)[0]
            base = g.dim_info.get(first)
            if base is None or base.family != info.family and name_size(first) != info.size:
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
    # the corpus's linen Mixer's blocks shared MixerBlock_0_Dense_0 (by block 0's weight)
    assert instance_named(g) == [], f"{rel}: {list(g.dims)}"


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
    assert resized_name("height", 224, 7) == "height_32nd"
    assert resized_name("height", 99, 33) == "height_3rd"
    assert resized_name("seq", 16, 15) == "seq-1"
    assert resized_name("height", 12, 9) == "height-3"  # most of a dim: a valid conv's
    # at most half of it, not a multiple: the fraction (BigBird's 3 of 64 blocks, seq-3904)
    assert resized_name("seq", 4096, 192) == "seq_3_64ths"
    assert resized_name("seq", 32, 12) == "seq_3_8ths"
    assert resized_name("seq", 4096, 448) == "seq_7_64ths"
    assert resized_name("seq", 16, 64) == "seq+48"
    assert resized_name("seq", 16, 16) == "seq_table"
    assert path_name("params/model/layers/17/mlp/down_proj/kernel") == "down_proj"
    assert path_name("params/w1") == "w1"
    assert path_name("batch/0") == "batch_0"  # a tuple's leaf: never a bare number
    assert path_name("params/3/0") == "params_0"  # nor a layer's index


def test_big_birds_pieces_are_named_by_what_they_are_of():
    """BigBird's bands of blocks were named by a raw difference (``seq-20``: 12 of 32
    positions; at 4096, ``seq-3904``, ``seq-3648``), and its middle blocks after the
    positions (``seq-26``, ``seq-4034``): now the fraction of the sequence they are
    (``seq_3_8ths``), and of the blocks, all but the first and the last (``seq_outer-2``)."""
    if any(importlib.util.find_spec(lib) is None for lib in LIBRARY.values()):
        pytest.skip("the libraries extra is not installed (pip install -e '.[libraries]')")
    import os
    import sys

    os.environ.setdefault("KERAS_BACKEND", "jax")
    sys.path.insert(0, str(MODELS))
    import catalogue

    dims = al.trace(catalogue.ENTRIES["hf_big_bird_clm"].build("tiny")).dims
    assert dims["seq_3_8ths"] == 12 and dims["seq_outer-2"] == 6, dims
    assert dims["seq-1"] == 31  # the shifted targets
    assert not [d for d in dims if re.fullmatch(r"seq-\d+", d) and int(d[4:]) > dims[d]], dims


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


def test_experts_are_found_from_the_routing_pattern():
    """Issue 35.3: the corpus Mixtral-style MoE names no dim; a top-k over the router's
    logits whose last axis is the stacked weights' leading one names both ``experts`` (the
    router's was ``router``, the stacked weights' ``w1``), so the search sees expert
    parallelism; the top-k's choices are ``top_k``, each expert's slots ``capacity``."""
    g = al.trace(al.load_workload(MODELS / "corpus/moe_rotary.py"))
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["params/layers/0/router"] == ("d_model", "experts")
    assert dims["params/layers/1/w1"] == ("experts", "d_model", "d_ff")
    assert dims["params/layers/0/w2"] == ("experts", "d_ff", "d_model")
    assert g.dims["experts"] == 4 and g.dims["top_k"] == 2 and g.dims["capacity"] == 10
    assert {"heads", "kv_heads", "q_per_kv"} <= set(g.dims), g.dims  # the grouped queries


@pytest.mark.parametrize("dispatch", ["ragged", "dense"])
def test_experts_are_found_from_a_sorted_dispatch(dispatch):
    """Issue 35.3: an MoE that sorts its tokens by expert (``argsort`` of the top-k's choices,
    a gather of the tokens' rows, ``lax.ragged_dot`` with ``bincount`` group sizes, or a loop
    over the experts' rows; a scatter-add or ``segment_sum`` back) named its experts twice
    (``router``, ``w_in_in``), d_ff ``w_in`` and the rest by op id, a set per layer
    (``top_k.107:1``, ``iota.110:0``, ``reshape.114:0``, ``top_k.259:1``...): now one
    ``experts`` from the routing pattern, ``top_k``, the sorted rows ``batch*seq*top_k``,
    ``d_ff``, whatever the depth."""
    path = MODELS / "corpus/moe_sorted.py"
    g = al.trace(al.load_workload(path, dispatch=dispatch))
    assert not bad_names(g), g.dims
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["params/blocks/1/router"] == ("d_model", "experts")
    assert dims["params/blocks/0/w_in"] == ("experts", "d_model", "d_ff")
    assert dims["params/blocks/1/w_out"] == ("experts", "d_ff", "d_model")
    assert g.dims["experts"] == 4 and g.dims["top_k"] == 2 and g.dims["d_ff"] == 128
    assert g.dims["batch*seq*top_k"] == 16 * 32 * 2
    assert g.dims == al.trace(al.load_workload(path, dispatch=dispatch, layers=3)).dims
    # as many experts as layers: a loop reading a row of each is over the experts
    three = al.trace(al.load_workload(path, dispatch=dispatch, layers=3, experts=3)).dims
    assert three["experts"] == 3 and "layers" not in three, three


def _scanned_moe():
    """A scanned stack of top-1 MoE layers (weights ``[layers, experts, ...]``), no dim
    named."""
    import jax
    import jax.numpy as jnp

    L, B, S, D, E, F, V, C = 3, 8, 16, 32, 4, 64, 128, 10

    def layer(x, p):
        probs = jax.nn.softmax(jnp.einsum("bsd,de->bse", x, p["router"]), -1)
        gates, idx = jax.lax.top_k(probs, 2)
        m = jax.nn.one_hot(idx[..., 0], E)
        slot = jax.nn.one_hot(jnp.sum((jnp.cumsum(m, 1) - m) * m, -1).astype(jnp.int32), C)
        combine = gates[..., 0, None, None] * m[..., None] * slot[:, :, None, :]
        xe = jnp.einsum("bsec,bsd->ebcd", combine, x)
        h = jax.nn.relu(jnp.einsum("ebcd,edf->ebcf", xe, p["w_in"]))
        return x + jnp.einsum(
            "bsec,ebcd->bsd", combine, jnp.einsum("ebcf,efd->ebcd", h, p["w_out"])
        ), None

    def step(p, tokens):
        def loss(p):
            x, _ = jax.lax.scan(layer, p["embed"][tokens], p["layers"])
            return -jnp.mean(jax.nn.log_softmax(x @ p["embed"].T))

        return jax.tree.map(lambda w, d: w - 0.1 * d, p, jax.grad(loss)(p))

    def sd(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    params = {"embed": sd(V, D), "layers": {"router": sd(L, D, E), "w_in": sd(L, E, D, F),
                                            "w_out": sd(L, E, F, D)}}  # fmt: skip
    tokens = jax.ShapeDtypeStruct((B, S), jnp.int32)
    return al.trace(al.Workload(step, (params, tokens), donate_argnums=(0,)))


def test_a_scanned_moe_names_its_experts_inside_the_layers():
    g = _scanned_moe()
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["p/layers/w_in"] == ("layers", "experts", "d_model", "d_ff"), dims
    assert dims["p/layers/router"] == ("layers", "d_model", "experts"), dims
    assert not bad_names(g), g.dims


def test_a_top_k_that_routes_to_no_experts_names_none():
    """A top-k over a weight's logits (the vocabulary's: a sampler's, a top-5 accuracy)
    with no stacked weights of that size is no routing."""
    import jax
    import jax.numpy as jnp

    def step(w, x):
        def loss(w):
            logits = jnp.tanh(x @ w["w1"]) @ w["w2"]
            return jnp.sum(jax.lax.top_k(logits, 5)[0])

        return jax.tree.map(lambda p, d: p - 0.1 * d, w, jax.grad(loss)(w))

    w = {"w1": jax.ShapeDtypeStruct((16, 32), jnp.float32),
         "w2": jax.ShapeDtypeStruct((32, 100), jnp.float32)}  # fmt: skip
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    g = al.trace(al.Workload(step, (w, x), donate_argnums=(0,)))
    assert "experts" not in g.dims and "top_k" not in g.dims, g.dims


def test_convolutions_name_their_planes_windows_and_pieces():
    """A Flax CNN names nothing: its image's planes are height and width, max-pooled to
    height_half, average-pooled to height_4th (named from the image's plane, not
    height_half_half), its kernels' windows kernel_height and kernel_width (were Conv_1_in,
    Conv_1), one dim for every conv, its channels channels(3) (the image's), channels(32)...
    (were Conv_0, Conv_1)."""
    g = al.trace(al.load_workload(MODELS / "corpus/cnn.py"))
    assert {"height", "height_half", "height_4th", "kernel_height", "kernel_width"} <= set(g.dims)
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["params/Conv_0/kernel"][:3] == ("kernel_height", "kernel_width", "channels(3)")
    assert dims["params/Conv_1/kernel"][:2] == ("kernel_height", "kernel_width")
    assert dims["params/Conv_2/kernel"][2:] == ("channels(8)", "channels(16)")
    assert dims["params/BatchNorm_0/scale"] == dims["params/Conv_1/kernel"][3:] == ("channels(8)",)


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


def test_a_name_at_several_sizes_is_a_dim_per_size_and_every_further_dim_has_its_base():
    """A list of convs (32, 64 and 64 channels: the last two of other families) and two
    kernel sizes: each size its own dim named with it (Mesh-TF's name and size), the
    further 64 ``channels(64)#2`` beside ``channels(64)`` (were ``convs(64)#2``, the list's
    name), never a ``#k`` of a name no dim has."""
    import jax
    import jax.numpy as jnp
    import optax

    dn = ("NHWC", "HWIO", "NHWC")

    def loss_fn(p, batch):
        x, y = batch
        for w in p["convs"]:
            x = jax.nn.relu(
                jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
            )
        logits = x.mean(axis=(1, 2)) @ p["out"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    f32 = jnp.float32
    params = {"convs": [jax.ShapeDtypeStruct(s, f32) for s in ((5, 5, 3, 32), (3, 3, 32, 64),
                                                                (3, 3, 64, 64))],
              "out": jax.ShapeDtypeStruct((64, 10), f32)}  # fmt: skip
    batch = (jax.ShapeDtypeStruct((8, 16, 16, 3), f32), jax.ShapeDtypeStruct((8,), jnp.int32))
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), params, batch, lambda rng: None))
    assert {"channels(3)", "channels(32)", "channels(64)", "channels(64)#2", "kernel_height(5)",
            "kernel_height(3)"} <= set(g.dims), list(g.dims)  # fmt: skip
    assert "channels" not in g.dims and "kernel_height" not in g.dims
    assert not any(d.startswith("convs") for d in g.dims) and not bad_names(g), list(g.dims)
    assert set(g.named("kernel_height")) == {"kernel_height(5)", "kernel_height(3)"}
    assert all(d.split("#")[0] in g.dims for d in g.dims if "#" in d), list(g.dims)


def test_a_pooling_window_over_a_padded_1x1_plane_is_a_window():
    """Keras InceptionV3 and NASNet at 75 and 32 pixels: the last planes are 1x1 (no dim);
    the backward of a 3x3 'same' average pooling pads them to 3x3, axes that were named by
    the pad op (``pad.4409:1``): now the window's, ``kernel_height`` (one dim with a conv's
    window of its size, where no tensor holds both)."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(p, batch):
        x, y = batch
        dn = ("NHWC", "HWIO", "NHWC")
        x = jax.lax.conv_general_dilated(x, p["conv"], (4, 4), "VALID", dimension_numbers=dn)
        pad = ((0, 0), (1, 1), (1, 1), (0, 0))
        x = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 1, 1, 1), pad) / 9
        return optax.softmax_cross_entropy_with_integer_labels(x[:, 0, 0] @ p["out"], y).mean()

    f32 = jnp.float32
    params = {"conv": jax.ShapeDtypeStruct((4, 4, 3, 16), f32),
              "out": jax.ShapeDtypeStruct((16, 10), f32)}  # fmt: skip
    batch = (jax.ShapeDtypeStruct((8, 4, 4, 3), f32), jax.ShapeDtypeStruct((8,), jnp.int32))
    g = al.trace(al.train_workload(loss_fn, optax.sgd(0.1), params, batch, lambda rng: None))
    assert not bad_names(g), list(g.dims)
    assert g.dims["kernel_height"] == g.dims["kernel_width"] == 3, g.dims


def test_instances_whose_indices_vary_together_are_one_module():
    """Keras ConvNeXt's downsampling_block_1/downsampling_conv_1 is the second of
    block_0/conv_0: its dims were named by the instance (downsampling_conv_0), now by the
    module, at each size (downsampling_conv(32))."""
    paths = ["params/ds_block_0/ds_conv_0/kernel", "params/ds_block_1/ds_conv_1/kernel"]
    assert set(instance_free(paths).values()) == {"params/ds_block/ds_conv/kernel"}


def _albert(loop="scan", batch="tuple", listed=False, L=4, microbatches=0):
    """A stranger's ALBERT-style stack (one weight set every layer shares, a closure
    constant of ``lax.scan(layer, x, None, length=L)``), float [batch, seq, d_model] input
    mean-pooled over the sequence, nothing named; ``loop``: ``fori`` (a ``fori_loop`` of
    static bounds), ``unrolled``, ``rnn`` (a scan over the sequence instead);
    ``microbatches``: its gradients accumulated over that many."""
    import jax
    import jax.numpy as jnp
    import optax

    B, S, D, F, C = 8, 12, 16, 48, 5

    def loss_fn(p, bt):
        x, y = (bt["x"], bt["y"]) if batch == "dict" else bt
        w1, w2, out = p if listed else (p["w1"], p["w2"], p["out"])

        def layer(h):
            return h + jax.nn.gelu(h @ w1) @ w2

        if loop == "scan":
            h, _ = jax.lax.scan(lambda h, _: (layer(h), None), x, None, length=L)
        elif loop == "fori":
            h = jax.lax.fori_loop(0, L, lambda i, h: layer(h), x)
        elif loop == "unrolled":
            h = x
            for _ in range(L):
                h = layer(h)
        else:  # a scan over the positions, reading them as xs: not a stack of layers

            def cell(c, xt):
                c = jnp.tanh(c @ w2[:D] + xt @ w1[:, :D])
                return c, c

            _, hs = jax.lax.scan(cell, jnp.zeros((B, D)), jnp.swapaxes(x, 0, 1))
            h = jnp.swapaxes(hs, 0, 1)
        logits = h.mean(1) @ out
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    f32 = jnp.float32
    shapes = [(D, F), (F, D), (D, C)]
    ws = [jax.ShapeDtypeStruct(s, f32) for s in shapes]
    params = ws if listed else dict(zip(("w1", "w2", "out"), ws, strict=True))
    x, y = jax.ShapeDtypeStruct((B, S, D), f32), jax.ShapeDtypeStruct((B,), jnp.int32)
    spec = {"x": x, "y": y} if batch == "dict" else (x, y)
    wl = al.train_workload(loss_fn, optax.adam(1e-3), params, spec, lambda rng: None)
    return al.trace(accumulate(wl, microbatches) if microbatches else wl)


STACK = {"batch": 8, "seq": 12, "d_model": 16, "d_ff": 48, "layers": 4, "classes": 5}


@pytest.mark.parametrize(
    "kw",
    [{}, {"loop": "fori"}, {"batch": "dict"}, {"listed": True}, {"loop": "fori", "batch": "dict"}],
    ids=["scan", "fori_loop", "dict_batch", "list_params", "fori_dict"],
)
def test_a_stack_sharing_one_weight_set_names_its_layers_and_its_sequence(kw):
    """A stranger's ALBERT (/tmp/shared/albert.py): its sequence was ``0`` (the tuple batch's
    path ``batch/0``), its layers ``scan.0:0`` (the op that stacked the residuals: a scan
    over no xs), a list's weights' d_ff ``0``. Now the positions of a float input [batch,
    seq, features] are ``seq``, the iteration dim of a scan over nothing (or weights) that
    carries the examples ``layers``, and no name is a bare number."""
    g = _albert(**kw)
    assert g.dims == STACK and not bad_names(g), g.dims


def test_an_unrolled_stack_and_a_scan_over_the_sequence_name_the_sequence_not_layers():
    g = _albert(loop="unrolled")
    assert g.dims == {"features": 16, "batch": 8, "seq": 12, "hidden": 48, "classes": 5}, g.dims
    g = _albert(loop="rnn")  # the iteration is over the positions: seq, no layers
    assert g.dims["seq"] == 12 and "layers" not in g.dims and not bad_names(g), g.dims


@pytest.mark.parametrize("kw", [{}, {"loop": "fori"}, {"loop": "unrolled"}, {"batch": "dict"}],
                         ids=["scan", "fori_loop", "unrolled", "dict_batch"])  # fmt: skip
def test_an_accumulated_step_keeps_the_names_of_the_step(kw):
    """Issue 35.3: gradient accumulation's scan over microbatches hid the roles of a model
    that names nothing (ALBERT's sequence ``batch_0``, its layers ``scan.8:0``, d_model
    ``out_in``, the microbatches ``batch_inner``). Now a microbatch is data as the batch is:
    the step's names, the batch at both its sizes (as a named one's), and ``microbatches``."""
    plain = _albert(**kw).dims
    g = _albert(**kw, microbatches=2)
    want = {k: v for k, v in plain.items() if k != "batch"}
    want.update({"batch(8)": 8, "batch(4)": 4, "microbatches": 2})
    assert g.dims == want and not bad_names(g), g.dims


def test_a_flattened_example_read_by_a_list_of_weights_is_features():
    """eqx.nn.MLP on an image: each example flattened (``jnp.ravel`` under vmap) into the
    features the first of a list of weights reads; they were named after the list,
    ``layers`` (the stacked layers' role name), now ``features``."""
    import jax
    import jax.numpy as jnp
    import optax

    def loss_fn(p, batch):
        x, y = batch

        def mlp(img):
            h = img.ravel()
            for w in p["layers"][:-1]:
                h = jax.nn.relu(w @ h)
            return p["layers"][-1] @ h

        logits = jax.vmap(mlp)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    f32 = jnp.float32
    params = {"layers": [jax.ShapeDtypeStruct(s, f32) for s in ((32, 64), (32, 32), (10, 32))]}
    batch = (jax.ShapeDtypeStruct((8, 8, 8), f32), jax.ShapeDtypeStruct((8,), jnp.int32))
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), params, batch, lambda rng: None))
    assert g.dims["features"] == 64 and "layers" not in g.dims, g.dims
    assert not bad_names(g), g.dims


def test_a_shared_weight_stacks_gradients_are_where_their_weights_are():
    """A stranger's ALBERT read ``w1 grad (w2)`` and ``w2 grad ((other))`` in plan reports:
    the gradients its backward scan sums over the layers were placed by the op computed
    before them (or none). Now each is where its weight is, no op in a loop is ``(other)``,
    a layer is never a weight's name (``layers/w1`` is ``layers``) and ``(other)`` is not
    nested in parentheses."""
    g = _albert()
    labels, layers = op_labels(g), op_layers(g)
    grads = {labels[o.name]: layers[o.name] for o in g.ops if labels[o.name].endswith(" grad")}
    assert grads == {"w1 grad": "w1", "w2 grad": "w2", "out grad": "out"}, grads
    looped = [o for o in g.ops if any(s.startswith(("scan.", "while.")) for s in o.scope)]
    assert looped and all(layers[o.name] != "(other)" for o in looped)
    from autolayout._cli import _where
    from autolayout.core._report import _layer_key

    assert _layer_key(["layers", "w1"]) == "layers" and _layer_key(["layers", "3"]) == "layers.3"
    assert _where("w2 grad", "(other)") == "w2 grad (other)"
    assert _where("w2 grad", "layers.3") == "w2 grad (layers.3)"


def _channels(g: al.Graph) -> dict[str, int]:
    return {d: n for d, n in g.dims.items() if d.split("#")[0].split("(")[0] == "channels"}


def test_a_keras_style_cnns_channels_are_channels_not_its_batchnorms_weights():
    """Issue 35.3: Keras ResNet's channels were named by a BatchNorm's parameter with its
    block's indices (``conv2_block1_1_bn_beta``, ``beta``). A conv's feature axes (its
    kernel's in and out, and the scales, biases and residual adds linked to them) are
    ``channels``, with their size where there are several (``channels(8)``; a 3x3 conv of 8
    into 8: ``channels(8)#2``), the image's too (``channels(3)``)."""
    import jax
    import jax.numpy as jnp
    import optax

    dn = ("NHWC", "HWIO", "NHWC")

    def conv_bn(p, name, x, stride=1):
        x = jax.lax.conv_general_dilated(x, p[f"{name}_conv"]["kernel"], (stride, stride),
                                         "SAME", dimension_numbers=dn)  # fmt: skip
        mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
        bn = p[f"{name}_bn"]
        return (x - mean) * jax.lax.rsqrt(var + 1e-3) * bn["gamma"] + bn["beta"]

    def loss_fn(p, batch):
        x, y = batch
        x = jax.nn.relu(conv_bn(p, "conv1", x, 2))
        h = jax.nn.relu(conv_bn(p, "conv2_block1_1", x))
        h = jax.nn.relu(conv_bn(p, "conv2_block1_2", h))
        x = jax.nn.relu(conv_bn(p, "conv2_block1_0", x) + conv_bn(p, "conv2_block1_3", h))
        logits = x.mean((1, 2)) @ p["predictions"]["kernel"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    f32 = jnp.float32
    shapes = {"conv1": (7, 7, 3, 16), "conv2_block1_1": (1, 1, 16, 8),
              "conv2_block1_2": (3, 3, 8, 8), "conv2_block1_0": (1, 1, 16, 32),
              "conv2_block1_3": (1, 1, 8, 32)}  # fmt: skip
    params = {"predictions": {"kernel": jax.ShapeDtypeStruct((32, 10), f32)}}
    for name, s in shapes.items():
        params[f"{name}_conv"] = {"kernel": jax.ShapeDtypeStruct(s, f32)}
        params[f"{name}_bn"] = {k: jax.ShapeDtypeStruct(s[-1:], f32) for k in ("gamma", "beta")}
    batch = (jax.ShapeDtypeStruct((8, 16, 16, 3), f32), jax.ShapeDtypeStruct((8,), jnp.int32))
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), params, batch, lambda rng: None))
    assert _channels(g) == {"channels(3)": 3, "channels(16)": 16, "channels(8)": 8,
                            "channels(8)#2": 8, "channels(32)": 32}, g.dims  # fmt: skip
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    assert dims["params/conv2_block1_2_conv/kernel"][2:] == ("channels(8)", "channels(8)#2")
    assert dims["params/conv2_block1_3_bn/beta"] == ("channels(32)",)
    assert not any("beta" in d or "block" in d or "conv" in d for d in g.dims), g.dims
    assert not bad_names(g), g.dims


def test_an_equinox_sequential_cnn_is_named_by_roles_and_module_kinds_not_its_container():
    """Issue 35.3: Equinox keeps layers in a list (``eqx.nn.Sequential.layers``); its
    weights' paths (``layers/4/weight``) named their dims after the container, ``layers``
    (the stacked layers' role: ``layers(3)``, ``layers(192)``, ``layers_in``, ``layers(64)``)
    and its ops ``layers``. Now the conv's outputs are ``channels``, its flattened output
    ``features``, the dense head's widths ``hidden``, ``hidden2``, and each op is its
    module's kind (``Linear``, ``Linear grad``, ``Conv``)."""
    eqx = pytest.importorskip("equinox")
    import jax
    import jax.numpy as jnp
    import optax

    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    model = eqx.nn.Sequential([
        eqx.nn.Conv2d(1, 3, kernel_size=4, key=keys[0]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Lambda(jnp.ravel),
        eqx.nn.Linear(3 * 9 * 9, 32, key=keys[1]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Linear(32, 24, key=keys[2]),
        eqx.nn.Lambda(jax.nn.relu),
        eqx.nn.Linear(24, 10, key=keys[3]),
    ])  # fmt: skip
    arrays, static = eqx.partition(model.layers, eqx.is_array)  # params/layers/4/weight
    params = {"layers": jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), arrays)}

    def loss_fn(p, batch):
        x, y = batch
        m = eqx.nn.Sequential(list(eqx.combine(p["layers"], static)))
        logits = jax.vmap(m)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    batch = (jax.ShapeDtypeStruct((8, 1, 12, 12), jnp.float32),
             jax.ShapeDtypeStruct((8,), jnp.int32))  # fmt: skip
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), params, batch, lambda rng: None))
    assert g.dims == {"batch": 8, "height": 12, "width": 12, "channels": 3, "height-3": 9,
                      "width-3": 9, "features": 243, "hidden": 32, "hidden2": 24,
                      "classes": 10, "kernel_height": 4, "kernel_width": 4}, g.dims  # fmt: skip
    labels = set(op_labels(g).values())
    assert {"Conv", "Linear", "Linear bwd", "Linear grad"} <= labels, labels
    assert not any(lab.split()[0] == "layers" for lab in labels), labels
    assert not bad_names(g), g.dims


def test_a_container_of_modules_never_names_a_dim_layers():
    """A path that names only a container (a list's or ``eqx.nn.Sequential``'s attribute, a
    linen ``nn.Sequential``'s ``layers_0``) is named by its module's kind where a scope shows
    it, else by its leaf or the list's own name, never ``layers``; a module's name after
    the container still names it."""
    from autolayout.core._roles import module_kind

    assert path_name("params/layers/4/weight", "Linear") == "Linear"
    assert path_name("params/layers/4/weight") == "weight"
    assert path_name("opt_state/0/mu/layers/4/weight") == "weight"
    assert path_name("params/layers_0/kernel") == "kernel"
    assert path_name("params/convs/0") == "convs"
    assert path_name("params/model/layers/17/mlp/down_proj/kernel", "Linear") == "down_proj"
    assert module_kind("eqx.nn.Linear") == "Linear" and module_kind("Dense_0") == "Dense"
    assert module_kind("layers.3") is None and module_kind("") is None


def test_a_linen_cnn_without_logical_names_names_its_channels_and_features():
    """A Flax linen CNN with no logical names (Flax's MNIST tutorial's): its channels were
    its convs' instance names (``Conv_0``, ``Conv_1``) and the flattened conv output the
    dense layer's (``Dense_0_in``); now ``channels(32)``, ``channels(64)``, ``features``
    (the dense layer's width ``hidden``)."""
    nn = pytest.importorskip("flax.linen")
    import jax
    import jax.numpy as jnp
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.relu(nn.Dense(48)(x.reshape(x.shape[0], -1)))
            return nn.Dense(10)(x)

    model = CNN()
    x = jax.ShapeDtypeStruct((8, 8, 8, 1), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0), x)["params"]

    def loss_fn(p, batch):
        logits = model.apply({"params": p}, batch[0])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()

    batch = (x, jax.ShapeDtypeStruct((8,), jnp.int32))
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), params, batch, lambda rng: None))
    assert _channels(g) == {"channels(32)": 32, "channels(64)": 64}, g.dims
    assert g.dims["features"] == 2 * 2 * 64 and g.dims["hidden"] == 48, g.dims
    assert not any(d.startswith(("Conv", "Dense")) for d in g.dims), g.dims
    assert not bad_names(g), g.dims
