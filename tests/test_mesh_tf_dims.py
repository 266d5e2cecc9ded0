"""Mesh-TensorFlow's dims (issue 39): a dim is a name and a size. One name on axes of two
sizes (every kernel's depth ``kd``: 3 and 2) is two dims, ``kd(3)`` and ``kd(2)``; a rule
for ``kd`` lays out every size the mesh axes divide and is refused, naming the sizes, where
they do not divide one. The Mesh-TF-named 3-D U-Net traces, plans, validates and runs."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import autolayout as al
from autolayout.core._ir import base_name, name_size, shown_names
from autolayout.runtime.run import reference_losses, rescale, run
from conftest import MODELS

UNET = MODELS / "unet3d_mtf.py"


@pytest.fixture(scope="module")
def mtf():
    wl = al.load_workload(UNET)
    return wl, al.trace(wl)


@pytest.fixture(scope="module")
def sized():  # the same network, every (name, size) its own name: kd3, kd2, depth16...
    wl = al.load_workload(UNET, names="sized")
    return wl, al.trace(wl)


def test_one_name_of_two_sizes_is_two_dims(mtf):
    wl, g = mtf
    assert g.named("kd") == ("kd(3)", "kd(2)")
    assert g.named("depth") == ("depth(16)", "depth(8)")
    assert {g.dims[d] for d in g.named("c")} == {4, 8}
    stem, up = g.input_tensor("params/stem"), g.input_tensor("params/dec/0/up")
    assert stem.dims[:3] == ("kd(3)", "kh(3)", "kw(3)")
    assert up.dims[:3] == ("kd(2)", "kh(2)", "kw(2)")
    assert g.dim_info["kd(2)"].base == "kd" and g.dim_info["kd(2)"].user
    assert g.named("classes") == ("classes",)  # a name of one size keeps its name
    assert not g.opaque
    # the downsampled volume, named inside the step, is the volume's name at another size
    down = [t for t in g.tensors.values() if "depth(8)" in t.dims and t.role == "intermediate"]
    assert down


def test_the_mesh_tf_names_make_the_graph_the_distinct_names_make(mtf, sized):
    """Same ops, same FLOPs, the same dims one-to-one (name and size -> its own name)."""
    (_, g), (_, h) = mtf, sized
    assert [op.primitive for op in g.ops] == [op.primitive for op in h.ops]
    assert g.total_flops == h.total_flops

    def own(d):  # kd(3) -> kd3; classes -> classes2
        return base_name(d) + str(g.dims[d])

    for t in g.inputs:
        a, b = g.tensors[t], h.tensors[h.inputs[g.inputs.index(t)]]
        assert tuple(d and own(d) for d in a.dims) == b.dims, (a.path, a.dims, b.dims)


def test_a_rule_for_a_name_lays_out_every_size(mtf, sized):
    """``depth -> space`` is ``depth(16) -> space, depth(8) -> space``: the plan priced with
    the distinct names' rules for each size costs the same, collective by collective."""
    (wl, g), (wl2, h) = mtf, sized
    mesh = {"space": 2, "model": 4}
    p = al.evaluate(wl, "cpu-8", mesh=mesh, rules={"depth": "space", "c_out": "model"}, graph=g)
    assert p.rules() == [("depth", ("space",)), ("c_out", ("model",))]
    q = al.evaluate(wl2, "cpu-8", mesh=mesh, graph=h, rules=[
        ("depth16", "space"), ("depth8", "space"), ("c_out8", "model"), ("c_out4", "model")])  # fmt: skip
    assert p.summary()["step_time_s"] == pytest.approx(q.summary()["step_time_s"], rel=1e-12)
    kinds = ["kind", "axes", "bytes"]
    assert p.collectives()[kinds].values.tolist() == q.collectives()[kinds].values.tolist()
    layout = {i["path"]: i["layout"] for i in p.inputs}
    assert layout["batch/image"][1] == ("space",)
    assert layout["params/enc/1/conv"][4] == ("model",)  # c_out(8)
    assert layout["params/enc/0/conv"][4] == ("model",)  # c_out(4)


def test_a_rule_that_cannot_split_every_size_is_refused_naming_them(mtf):
    wl, g = mtf
    with pytest.raises(al.RuleError) as e:
        al.evaluate(wl, "cpu-8", mesh={"space": 2, "data": 4}, rules={"kd": "space"}, graph=g)
    msg = str(e.value)
    assert "\n" not in msg and "sizes 3, 2" in msg and "kd(2)" in msg, msg
    # a rule for one size splits that size alone, before the name's rule for the rest
    p = al.evaluate(wl, "cpu-8", mesh={"space": 2, "data": 4},
                    rules={"kd(2)": "space", "c": "data"}, graph=g)  # fmt: skip
    layout = {i["path"]: i["layout"] for i in p.inputs}
    assert layout["params/dec/0/up"][0] == ("space",)
    assert layout["params/enc/0/conv"][0] == ()
    assert layout["params/enc/0/conv"][3] == ("data",) and layout["params/enc/0/down"][4] == (
        "data",
    )


def test_a_name_written_with_its_size():
    assert al.spec((3, 4), ("kd(3)", "c")).dims == ("kd(3)", "c")
    with pytest.raises(al.WorkloadError, match="names size 2 but its axis has size 3"):
        al.spec((3, 4), ("kd(2)", "c"))
    with pytest.raises(al.WorkloadError, match="distinct names"):
        al.spec((3, 2), ("kd(3)", "kd"))  # Mesh-TF: one name once per shape
    assert (base_name("kd(3)"), name_size("kd(3)"), name_size("depth(8)*height(8)")) == (
        "kd", 3, None,
    )  # fmt: skip

    def step(a, b):
        return jnp.sum(a) + jnp.sum(b)

    # "kd(3)" and "kd" of size 3 are one dim; with a "kd" of size 2 beside them, two
    wl = al.Workload(step, (al.spec((3, 8), ("kd(3)", "d")), al.spec((3, 5), ("kd", "e"))))
    assert al.trace(wl).dims == {"kd": 3, "d": 8, "e": 5}
    wl = al.Workload(step, (al.spec((3, 8), ("kd(3)", "d")), al.spec((2, 5), ("kd", "e"))))
    assert al.trace(wl).dims == {"kd(3)": 3, "d": 8, "kd(2)": 2, "e": 5}


def test_tables_show_the_size_only_where_two_sizes_meet():
    shown = shown_names(["kd(3)", "kd(2)", "depth(16)", "batch", None])
    assert shown == {"kd(3)": "kd(3)", "kd(2)": "kd(2)", "depth(16)": "depth", "batch": "batch"}


def test_the_weight_gradients_spatial_sum_is_its_own_all_reduce():
    """Batch on ``data`` and depth on ``space``: XLA sums a conv's weight gradient over
    ``space`` (its spatial split) and then over ``data``, each of the whole kernel (priced as
    one all-reduce over both it was predicted at 0.51-0.66x of the compiled bytes)."""
    wl = al.load_workload(UNET, batch=2)
    p = al.evaluate(wl, "cpu-8", mesh={"data": 2, "space": 4},
                    rules={"batch": "data", "depth": "space"})  # fmt: skip
    v = al.validate(p).set_index("quantity")
    assert v.loc[v["checked"], "ok"].all(), v
    assert v.loc["all-reduce", "ratio"] == pytest.approx(1, abs=0.01), v
    c = p.collectives()
    grads = c[(c.kind == "all-reduce") & c.op.str.startswith("conv_general_dilated")]
    assert {tuple(a) for a in grads["axes"]} >= {("space",), ("data",)}, grads


def test_the_mesh_tf_unet_plans_validates_and_runs():
    """Planned on tpu-v4-32 with its depth split; its rules on 8 CPU devices compile to the
    collective bytes predicted (within 10%) and run with the unsharded losses."""
    wl = al.load_workload(UNET, volume=32, channels=4, levels=3)
    p = al.plan(wl, "tpu-v4-32", time_limit_s=4, deterministic=True)
    image = next(i for i in p.inputs if i["path"] == "batch/image")
    assert image["dims"][1] == "depth(32)" and image["layout"][1], image
    mesh, _ = rescale(p, 8)
    q = al.evaluate(wl, "cpu-8", mesh=mesh, rules=p.rules(), graph=p.graph)
    v = al.validate(q).set_index("quantity")
    assert v.loc[v["checked"], "ok"].all(), v
    assert "collective-permute" in v.index and v.loc["collective-permute", "ok"], v
    got = run(p, wl, steps=2, rescale_mesh=True).losses
    assert got == pytest.approx(reference_losses(wl, steps=2), rel=1e-5)


def test_a_plan_file_written_before_stays_valid():
    """experiments/results/report_plan.json (written before dims had sizes): every input's
    dims are the ones a trace gives now, and its rules lay the inputs out as it says."""
    import json

    from conftest import ROOT

    path = ROOT / "experiments/results/report_plan.json"
    plan = al.Plan.load(path)
    raw = json.loads(path.read_text())
    keys = ("size", "mlp", "remat", "scan", "dtype", "layers")
    wl = al.load_workload(
        MODELS / "gpt.py", attention="naive", **{k: raw["options"][k] for k in keys}
    )
    g = al.trace(wl)
    for i in plan.inputs:
        assert tuple(i["dims"]) == g.input_tensor(i["path"]).dims, i["path"]
    q = al.evaluate(wl, plan.hardware, mesh=plan.mesh, rules=plan.rules(), graph=g)
    exceptions = {path for path, _ in plan.solver.get("exceptions", [])}
    for a, b in zip(plan.inputs, q.inputs, strict=True):
        if a["path"] not in exceptions:
            assert a["layout"] == b["layout"], a["path"]


def test_a_plan_writes_one_rule_for_a_name_whose_sizes_share_axes(mtf):
    """A searched plan's rules are Mesh-TF's: every size of ``depth`` on ``space`` is the
    rule ``depth -> space``; a size laid out otherwise keeps its own rule."""
    from autolayout.search.final import _merged_sizes

    _, g = mtf
    depths = g.named("depth")
    assert len(depths) > 1
    same = [(d, ("space",)) for d in depths] + [("c(8)", ("data",))]
    assert _merged_sizes(g, same)[0] == ("depth", ("space",))
    split = [(depths[0], ("space",)), (depths[1], ("data",))]
    assert _merged_sizes(g, split) == split


def test_tables_show_kd_alone_and_its_sizes_where_two_meet():
    """Reports show ``kd``, and ``kd(3)`` / ``kd(2)`` where two sizes meet in one table."""
    from autolayout.core import shown_strategies

    one = shown_strategies(["kd(3):space,batch:data", "c(8):model"])
    assert one == {"kd(3):space,batch:data": "kd:space,batch:data", "c(8):model": "c:model"}
    two = shown_strategies(["kd(3):x", "kd(2):y"])
    assert two == {"kd(3):x": "kd(3):x", "kd(2):y": "kd(2):y"}
