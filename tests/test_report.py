"""Reports: the tables, the figures, the HTML page (rendered in headless Chromium), the
terminal report and the diff of two plans."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import matplotlib
import pytest
from click.testing import CliRunner

import autolayout as al
from autolayout._cli import main
from autolayout.core import op_layers
from conftest import MODELS, load_model

MODELS_GPT = MODELS / "gpt.py"

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def gpt():
    wl = load_model("gpt")
    return wl, al.trace(wl)


@pytest.fixture(scope="module")
def plans(gpt):
    wl, g = gpt
    dp = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"}, graph=g)
    mega = al.evaluate(
        wl, "cpu-8", mesh={"data": 2, "model": 4},
        rules={"batch": "data", "heads": "model", "d_ff": "model", "vocab": "model"}, graph=g,
    )  # fmt: skip
    searched = al.plan(wl, "cpu-8", time_limit_s=5, graph=g)
    return dp, mega, searched


def test_report_columns_and_totals_match_the_summary(plans):
    for p in plans:
        r = p.report()
        assert list(r.columns) == [
            "op", "kind", "layer", "scope", "dims", "strategy", "trips", "flops", "bytes",
            "compute_s", "comm_s", "time_s", "collective", "memory",
        ]  # fmt: skip
        s = p.summary()
        assert (r.compute_s * r.trips).sum() == pytest.approx(s["compute_s"])
        assert (r.comm_s * r.trips).sum() == pytest.approx(s["comm_s"])
        assert (r.flops * r.trips).sum() == pytest.approx(s["flops_per_device"])
        for by in ("layer", "kind"):
            gr = p.report(by=by)
            assert list(gr.columns) == ["ops", "flops", "bytes", "compute_s", "comm_s",
                                        "time_s", "share"]  # fmt: skip
            assert gr.compute_s.sum() == pytest.approx(s["compute_s"])
            assert gr.comm_s.sum() == pytest.approx(s["comm_s"])
            assert gr.ops.sum() == len(r)
            assert gr.share.sum() == pytest.approx(1.0)
            assert list(gr.time_s) == sorted(gr.time_s, reverse=True)
        c = p.collectives()
        assert list(c.columns) == ["op", "kind", "axes", "bytes", "time_s", "count", "tensor",
                                   "why", "combined"]  # fmt: skip
        assert (c.time_s * c["count"]).sum() == pytest.approx(s["comm_s"])


def test_report_by_an_unknown_column_names_the_columns(plans):
    with pytest.raises(KeyError, match="layer"):
        plans[0].report(by="layerz")


def test_memory_column_is_the_outputs_bytes_per_device(plans, gpt):
    _, g = gpt
    dp, mega, _ = plans
    for p, split in ((dp, 8), (mega, 2)):
        r = p.report().set_index("op")
        # the logits (batch, seq, vocab): batch on data (8 or 2), vocab on model (4) in mega
        op = next(o for o in g.ops if o.primitive == "dot_general"
                  and "vocab" in g.tensors[o.outputs[0]].dims)  # fmt: skip
        full = g.tensors[op.outputs[0]].nbytes
        assert r.loc[op.name, "memory"] == full // (split if p is dp else split * 4)


def test_layers_follow_named_scopes_through_the_backward_pass(gpt):
    _, g = gpt
    lay = op_layers(g)
    # each layer's forward and backward matmuls: 6 weights x (forward, 2 backward) + attention
    for i in (0, 1):
        dots = [o for o in g.ops if lay[o.name] == f"layers.{i}" and o.primitive == "dot_general"]
        assert len(dots) >= 18
    # the weight gradients of layer 1 are in layer 1: a dot_general whose output is w1's shape
    w1 = next(t for t in g.inputs if g.tensors[t].path == "params/layers/1/w1")
    grads = [o for o in g.ops if o.primitive == "dot_general"
             and g.tensors[o.outputs[0]].shape == g.tensors[w1].shape]  # fmt: skip
    assert {lay[o.name] for o in grads} == {"layers.0", "layers.1"}
    # the embedding: its gather and its gradient's scatter-add; Adam's ops: the optimizer
    assert {lay[o.name] for o in g.ops if o.primitive in ("gather", "scatter-add")
            and g.tensors[o.outputs[0]].shape == (512, 64)} == {"embed"}  # fmt: skip
    reads_state = [o for o in g.ops
                   if any((g.tensors[t].path or "").startswith("opt_state") for t in o.inputs)]  # fmt: skip
    assert reads_state and {lay[o.name] for o in reads_state} == {"optimizer"}


@pytest.mark.parametrize("model,opts", [("gpt", {}), ("gpt", {"scan": True}), ("mlp", {}),
                                        ("my_transformer", {}), ("t5", {})])  # fmt: skip
def test_every_matmul_is_named_by_the_weight_it_reads_or_makes(model, opts):
    """Reports name an op as the model's author does (issue 35.3), not by a primitive's
    counter: the weight a matmul reads (``w1``, ``w1 bwd`` for the backward's read), the weight
    whose gradient it makes (``w1 grad``), or attention's ``scores`` / ``attention``."""
    from autolayout.core import op_labels

    g = al.trace(load_model(model, **opts))
    labels = op_labels(g)
    weights = {t for t in g.inputs if (g.tensors[t].path or "").startswith("params")}
    mms = [op for op in g.ops if op.primitive == "dot_general"]
    assert mms and all(labels[op.name] != "dot_general" for op in mms), {
        op.name: labels[op.name] for op in mms
    }
    assert not any(re.search(r"\.\d", labels[op.name]) for op in g.ops)
    # one forward read, backward reads and a gradient per weight a matmul reads
    read = {g.tensors[t].path.rsplit("/", 1)[-1] for op in mms for t in op.inputs if t in weights}
    for w in read:
        got = {labels[op.name] for op in mms if labels[op.name].split(" ")[0] == w}
        assert {w, f"{w} grad"} <= got, (w, got)


def test_the_cli_names_the_costliest_ops_by_their_weights():
    r = CliRunner().invoke(main, ["plan", str(MODELS_GPT), "--hw", "cpu-8", "--time-limit", "3"])
    assert r.exit_code == 0, r.output
    lines = r.output.split("costliest ops")[1].split("bound:")[0].splitlines()[1:4]
    assert lines and not any(re.search(r"\w\.\d", x.split()[0]) for x in lines), lines


def test_layers_without_scopes_come_from_the_parameters_read(tmp_path):
    import jax.numpy as jnp

    def step(params, x):
        h = jnp.tanh(x @ params["enc"][0]["w"])
        h = jnp.tanh(h @ params["enc"][1]["w"])
        return (h @ params["head"]).sum()

    wl = al.Workload(
        step,
        ({"enc": [{"w": al.spec((8, 8), ("d", "e"))}, {"w": al.spec((8, 8), ("e", "f"))}],
          "head": al.spec((8, 2), ("f", "o"))}, al.spec((4, 8), ("batch", "d"))),
        name="scopeless",
    )  # fmt: skip
    g = al.trace(wl)
    lay = op_layers(g)
    assert [lay[o.name] for o in g.ops if o.primitive == "dot_general"] == [
        "enc.0",
        "enc.1",
        "head",
    ]


def test_ops_in_a_scanned_stack_are_in_the_stack_not_a_module_kinds_scope():
    """Equinox names its modules' scopes by kind (``eqx.nn.Linear``), which places no op. In
    a stack scanned over its stacked weights (the Equinox docs' ``filter_vmap`` + ``scan``),
    every op of both scans, the backward's weight gradients (which read no weight) included,
    is in the stack (``blocks``): before, ``down grad (eqx.nn.Linear)`` and ``(head)``."""
    pytest.importorskip("equinox")
    g = al.trace(al.load_workload(MODELS / "corpus" / "eqx_scan_lm.py"))
    lay = op_layers(g)
    looped = [o.name for o in g.ops if any(s.startswith("scan.") for s in o.scope)]
    assert looped and {lay[o] for o in looped} == {"blocks"}


def _scopeless_mlp():
    import jax
    import jax.numpy as jnp
    import optax

    params = {"layers": [{"w": jax.ShapeDtypeStruct((16, 32), jnp.float32)},
                         {"w": jax.ShapeDtypeStruct((32, 32), jnp.float32)}],
              "out": jax.ShapeDtypeStruct((32, 10), jnp.float32)}  # fmt: skip
    batch = {"x": jax.ShapeDtypeStruct((8, 16), jnp.float32),
             "y": jax.ShapeDtypeStruct((8,), jnp.int32)}  # fmt: skip

    def loss_fn(p, b):
        h = b["x"]
        for layer in p["layers"]:
            h = jax.nn.gelu(h @ layer["w"])
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["out"], b["y"]).mean()

    return al.train_workload(loss_fn, optax.adam(1e-3), params, batch, None, name="mlp")


def _scopeless_cnn():
    import jax
    import jax.numpy as jnp
    import optax

    params = {"c1": jax.ShapeDtypeStruct((3, 3, 3, 8), jnp.float32),
              "c2": jax.ShapeDtypeStruct((3, 3, 8, 16), jnp.float32),
              "fc": jax.ShapeDtypeStruct((16, 10), jnp.float32)}  # fmt: skip
    batch = (jax.ShapeDtypeStruct((4, 8, 8, 3), jnp.float32),
             jax.ShapeDtypeStruct((4,), jnp.int32))  # fmt: skip
    dn = ("NHWC", "HWIO", "NHWC")

    def loss_fn(p, b):
        x, y = b
        h = jax.nn.relu(jax.lax.conv_general_dilated(x, p["c1"], (1, 1), "SAME",
                                                     dimension_numbers=dn))  # fmt: skip
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(jax.lax.conv_general_dilated(h, p["c2"], (1, 1), "SAME",
                                                     dimension_numbers=dn))  # fmt: skip
        logits = h.mean(axis=(1, 2)) @ p["fc"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    return al.train_workload(loss_fn, optax.adam(1e-3), params, batch, None, name="cnn")


def _scopeless_moe():  # einsums (each in a scope of its spec), two layers of alike weights
    return al.load_workload(MODELS / "corpus" / "moe_rotary.py")


@pytest.mark.parametrize("make", [_scopeless_mlp, _scopeless_cnn, _scopeless_moe])
def test_every_contraction_is_in_the_layer_of_the_weight_it_reads_or_makes(make):
    """A model without scopes, as a stranger writes it: each matmul and conv, forward,
    backward and weight gradient, is in the layer of its weight (``w1 grad`` in ``w1``), not
    the optimizer's (Adam reads every gradient: the backward pass only feeds it)."""
    from autolayout.core import op_labels

    g = al.trace(make())
    lay, labels = op_layers(g), op_labels(g)
    layer_of: dict[str, set[str]] = {}  # a weight's label -> the layers of its paths
    for t in g.inputs:
        path = g.tensors[t].path or ""
        if path.startswith("params/"):
            parts = path.split("/")[1:]
            for part in parts:
                layer_of.setdefault(part, set()).add(".".join(parts[:-1]) or parts[-1])
    ops = [o for o in g.ops if o.primitive in ("dot_general", "conv_general_dilated")]
    kinds = {labels[o.name].split(" ")[-1] for o in ops}
    assert {"grad", "bwd"} <= kinds, kinds  # the backward pass is there, and named
    grads: dict[str, list[str]] = {}
    for o in ops:
        weight = labels[o.name].split(" ")[0]
        if weight not in layer_of:  # attention's and the experts' dispatch: no weight
            continue
        assert lay[o.name] in layer_of[weight], (o.name, labels[o.name], lay[o.name])
        if labels[o.name].endswith(" grad"):
            grads.setdefault(weight, []).append(lay[o.name])
    for weight, layers in grads.items():  # each layer's gradient in that layer
        assert sorted(layers) == sorted(layer_of[weight]), (weight, layers)
    assert "optimizer" in set(lay.values())  # Adam's own arithmetic stays the optimizer's


def test_figures_without_a_display(plans, tmp_path):
    for p in plans:
        figs = p.figures()
        assert set(figs) == {"step_time", "mesh_shapes", "memory", "roofline"}
        for name, fig in figs.items():
            for ax in fig.axes:
                assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
            fig.savefig(tmp_path / f"{name}.png")
            assert (tmp_path / f"{name}.png").stat().st_size > 5000
    searched = plans[2]
    ax = searched.figures()["mesh_shapes"].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(searched.solver["mesh_shapes_tried"])
    assert sum("(chosen)" in x for x in labels) == 1
    ax = searched.figures()["memory"].axes[0]
    assert any("limit" in t.get_text() for t in ax.get_legend().get_texts())


def test_repr_html_has_the_summary_and_top_ops(plans):
    h = plans[1]._repr_html_()
    assert "<table" in h and "step time" in h and "dot_general" in h
    assert "data=2 x model=4" in h


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_page_renders_in_headless_chromium(plans, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed")
    page = plans[2].to_html(tmp_path / "plan.html")
    assert "http://" not in page and "https://" not in page  # self-contained
    # a script that records what the browser decoded: each image's size, the tables' rows
    probe = (
        "<script>window.addEventListener('load',()=>{document.body.dataset.images="
        "[...document.images].map(i=>i.naturalWidth+'x'+i.naturalHeight).join(';');"
        "document.body.dataset.rows=[...document.tables||document.querySelectorAll('table')]"
        ".map(t=>t.rows.length).join(';');});</script>"
    )
    (tmp_path / "probe.html").write_text(page.replace("</body>", probe + "</body>"))
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
         "--dump-dom", (tmp_path / "probe.html").as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dom = out.stdout
    images = re.search(r'data-images="([^"]*)"', dom).group(1).split(";")
    assert len(images) == 4
    for size in images:
        w, h = map(int, size.split("x"))
        assert w > 300 and h > 200  # decoded PNGs, not broken images
    rows = [int(x) for x in re.search(r'data-rows="([^"]*)"', dom).group(1).split(";")]
    assert len(rows) >= 5 and all(r >= 2 for r in rows)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
         "--window-size=1200,2000", (tmp_path / "plan.html").as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    assert shot.stat().st_size > 20000  # a page with figures, not a blank one


def test_report_cli_prints_the_summary_and_writes_html(plans, tmp_path):
    path = tmp_path / "plan.json"
    plans[1].to_json(path)
    r = CliRunner().invoke(main, ["report", str(path), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    for text in ("step time", "data=2 x model=4", "costliest", "layers.0", "all-reduce"):
        assert text in r.output
    assert "data:image/png;base64," in (tmp_path / "r.html").read_text()
    r = CliRunner().invoke(main, ["report", str(path), "--by", "nope"])
    assert r.exit_code == 2 and "nope" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(main, ["report", str(bad)])
    assert r.exit_code == 2 and "corrupted plan file" in r.output


def test_diff_shows_where_two_plans_split_differently(plans, tmp_path):
    dp, mega, _ = plans
    d = al.diff(dp, mega)
    s = d.summary.set_index("quantity")
    assert s.loc["step_time_s", "a"] == pytest.approx(dp.predicted["step_time_s"])
    assert s.loc["step_time_s", "b"] == pytest.approx(mega.predicted["step_time_s"])
    assert s.loc["step_time_s", "delta"] == pytest.approx(
        mega.predicted["step_time_s"] - dp.predicted["step_time_s"]
    )
    # the weights Megatron splits; the batch is split in both (on other axes: listed too)
    paths = set(d.inputs.path)
    assert "params/layers/0/w1" in paths and "params/layers/1/wq" in paths
    w1 = d.inputs.set_index("path").loc["params/layers/0/w1"]
    assert w1.layout_a == "replicated" and w1.layout_b == "d_ff:model(4)"
    assert w1.bytes_a == 4 * w1.bytes_b
    assert "params/ln_f" not in paths  # replicated in both
    assert len(d.ops) and (d.ops.strategy_a != d.ops.strategy_b).all()
    assert list(d.ops.delta_s.abs()) == sorted(d.ops.delta_s.abs(), reverse=True)
    assert d.layers.delta_s.sum() == pytest.approx(
        mega.report().time_s.sum() - dp.report().time_s.sum()
    )
    same = al.diff(dp, dp)
    assert same.inputs.empty and same.ops.empty
    assert "PlanDiff" in repr(d) and "<table" in d._repr_html_()


def test_diff_refuses_plans_of_different_programs(plans):
    other = al.evaluate(load_model("mlp"), "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    with pytest.raises(al.PlanError, match="different programs"):
        al.diff(plans[0], other)


def test_diff_cli(plans, tmp_path):
    plans[0].to_json(tmp_path / "a.json")
    plans[1].to_json(tmp_path / "b.json")
    r = CliRunner().invoke(
        main, ["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")], env={"COLUMNS": "80"}
    )
    assert r.exit_code == 0, r.output
    assert "params/layers/0/w1" in r.output and "step_time_s" in r.output
    assert max(map(len, r.output.splitlines())) <= 80 and "…" not in r.output


def test_loaded_plan_reports_like_the_fresh_one(plans, tmp_path):
    p = plans[2]
    p.to_json(tmp_path / "p.json")
    q = al.Plan.load(tmp_path / "p.json")
    assert q.report().equals(p.report())
    assert q.report(by="layer").equals(p.report(by="layer"))
    assert set(q.figures()) == set(p.figures())
    assert json.loads((tmp_path / "p.json").read_text())["ops"][0]["layer"]


@pytest.fixture(scope="module")
def scanned():
    """A scanned 4-layer GPT under Megatron: its layer ops run 4 times a step."""
    wl = load_model("gpt", scan=True, layers=4)
    return al.evaluate(
        wl, "cpu-8", mesh={"data": 2, "model": 4},
        rules={"batch": "data", "heads": "model", "d_ff": "model", "vocab": "model"},
    )  # fmt: skip


def test_report_text_fits_80_columns_and_labels_looped_rows(scanned, plans):
    """Issue 38: `autolayout report`'s tables at 80 columns: no line past 80, no header or
    cell cut (a long strategy wraps onto the next line at a comma), a scanned layer's rows
    say they sum its runs, numbers to three significant digits."""
    from autolayout.core._report import report_text

    for p in (scanned, *plans):
        text = report_text(p, width=80, title="plan p.json")
        lines = text.splitlines()
        assert max(map(len, lines)) <= 80, "\n".join(x for x in lines if len(x) > 80)
        assert "…" not in text and "..." not in text
        for header in ("op", "layer", "runs", "collective", "strategy", "share", "kind"):
            assert re.search(rf"(^|  ){header}(  |$)", text, re.M), header
        # every strategy of the costliest ops is there whole, perhaps over several lines
        flat = re.sub(r"\s+", "", text)
        for s in al.core.top_ops(p, 10).strategy:
            assert re.sub(r"\s+", "", s) in flat, s
        for num in re.findall(r"(?<![\w.:=-])\d+\.\d+(?![\w.%])", text.split("\n\n", 1)[1]):
            assert len(num.replace(".", "").lstrip("0")) <= 3, num
    text = report_text(scanned, width=80)
    assert "summed over its runs" in text
    # the stack's row: 4 runs a step (with the stacked ln1's 9 ops, a row `layers/ln1` before)
    assert re.search(r"^layers x4 +153 ", text, re.M)
    assert re.search(r"^\w+( bwd| grad)? +layers +\d+ +4 ", text, re.M)  # w1 bwd: op labels
    narrow = report_text(scanned, width=60)
    assert max(map(len, narrow.splitlines())) <= 60
    assert "batch:data," in narrow and "d_ff:model" in narrow  # wrapped at the comma


def test_report_cli_fits_80_columns(plans, tmp_path):
    path = tmp_path / ("a-long-folder-name-" * 4) / "plan.json"  # its title wraps (xdist's 87)
    path.parent.mkdir()
    plans[1].to_json(path)
    r = CliRunner().invoke(main, ["report", str(path)], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert max(map(len, r.output.splitlines())) <= 80
    assert "…" not in r.output and "runs" in r.output


def test_mesh_axes_named_with_an_x_are_read_back_whole():
    """Strategies join mesh axes with ``x`` (``batch:dataxexpert``): read back by the mesh's
    names, ``expert`` stays one axis (it had become ``e`` and ``pert``: the rules' split
    listed again as a split "inside the step", and ``expert`` as splitting nothing)."""
    from autolayout.core._report import axes_in_use, axes_of_text, inner_splits

    assert axes_of_text("dataxexpert", {"data", "expert"}) == ("data", "expert")
    assert axes_of_text("expertxx", {"expert", "x"}) == ("expert", "x")
    assert axes_of_text("axb", {"a", "b"}) == ("a", "b")
    p = al.evaluate(load_model("mlp"), "cpu-8", mesh={"data": 2, "expert": 4},
                    rules={"batch": ("data", "expert")})  # fmt: skip
    assert axes_in_use(p) == {"data", "expert"}
    assert not any(x.startswith("batch -> dataxexpert") for x in inner_splits(p)), inner_splits(p)


def test_a_sort_across_the_split_batch_is_explained():
    """A sorted dispatch (corpus/moe_sorted.py: argsort of every token's expert choices, in
    both its forms) under a batch split: XLA sorts the axis whole on every device, and the
    plan says so with the share of the step over it and what to write instead; not where the
    batch is whole, nor in a step that sorts nothing."""
    from autolayout.core import whole_sorts

    for dispatch in ("ragged", "dense"):
        wl = al.load_workload(MODELS / "corpus" / "moe_sorted.py", dispatch=dispatch)
        (note,) = whole_sorts(al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"}))
        assert note.startswith("2 sorts order batch*seq*top_k across the whole batch")
        assert "shard_map" in note
        whole = al.evaluate(wl, "cpu-8", mesh={"tensor": 8}, rules={"d_ff": "tensor"})
        assert whole_sorts(whole) == []
    gpt = al.evaluate(load_model("gpt"), "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    assert whole_sorts(gpt) == []
