import jax
import jax.numpy as jnp
import pytest
from jax import lax

import autolayout as al
from conftest import MODEL_NAMES, load_model

GPT_NAMES = {"batch", "seq", "d_model", "heads", "head_dim", "d_ff", "vocab"}


def _dot_dims(g):
    for op in g.ops:
        if op.primitive == "dot_general":
            yield op, [g.tensors[t].dims for t in op.inputs + op.outputs]


def test_gpt_dot_generals_resolve_to_the_input_names(gpt_graph):
    g = gpt_graph
    seen = set()
    for op, dims in _dot_dims(g):
        for tensor_dims in dims:
            for d in tensor_dims:
                assert d is not None, op.name
                assert d in GPT_NAMES or g.dim_info[d].family in GPT_NAMES, (op.name, dims)
                seen.add(d)
    assert GPT_NAMES <= seen
    assert {d: g.dims[d] for d in GPT_NAMES} == {
        "batch": 8, "seq": 32, "d_model": 64, "heads": 4, "head_dim": 16, "d_ff": 256, "vocab": 512,
    }  # fmt: skip


def test_a_weight_its_gradient_and_its_adam_moments_share_dims(gpt_graph):
    g = gpt_graph
    for name in ("wq", "wo", "w1", "w2"):
        w = g.input_tensor(f"params/layers/0/{name}")
        mu = g.input_tensor(f"opt_state/0/mu/layers/0/{name}")
        nu = g.input_tensor(f"opt_state/0/nu/layers/0/{name}")
        assert w.dims == mu.dims == nu.dims
        # the gradient: the dot_general that produces a tensor of the weight's shape
        grads = [
            g.tensors[op.outputs[0]]
            for op, _ in _dot_dims(g)
            if g.tensors[op.outputs[0]].shape == w.shape
        ]
        assert grads and all(t.dims == w.dims for t in grads), name
    # the updated parameters and moments come out with the same dims
    out_dims = {g.tensors[t].dims for t in g.outputs if g.tensors[t].shape == w.shape}
    assert out_dims == {w.dims}


def test_attention_sequence_axes_are_one_family_two_dims(gpt_graph):
    g = gpt_graph
    assert g.families["seq"] == ("seq", "seq#2")
    assert g.dim_info["seq#2"].family == "seq" and not g.dim_info["seq#2"].user
    scores = [t for _, dims in _dot_dims(g) for t in dims if "seq" in t and "seq#2" in t]
    assert scores and all(t == ("batch", "heads", "seq", "seq#2") for t in scores[:1])


def test_scanned_gpt_is_one_layer_body_with_trip_count_layers():
    layers = 3
    g = al.trace(load_model("gpt", scan=True, layers=layers))
    al.check_graph(g)
    scans = [lp for lp in g.loops if lp.kind == "scan"]
    assert len(scans) == 2  # forward, backward
    assert all(lp.length == layers for lp in scans)
    fwd = scans[0]
    body = [g.op(n) for n in fwd.ops]
    dots = [op for op in body if op.primitive == "dot_general"]
    assert len(dots) == 8  # q, k, v, scores, probs@v, out projection, two MLP matmuls
    assert all(op.trip_count == layers for op in body)
    stacked = g.input_tensor("params/layers/wq")
    assert stacked.dims == ("layers", "d_model", "heads", "head_dim") and g.dims["layers"] == layers
    # the scanned and unrolled steps do the same work
    unrolled = al.trace(load_model("gpt", layers=layers))

    def flops(gr):
        return sum(op.flops * op.trip_count for op in gr.ops if op.primitive == "dot_general")

    assert flops(g) == pytest.approx(flops(unrolled))


def test_remat_recomputation_is_traced_as_work():
    plain = al.trace(load_model("gpt", scan=True))
    full = al.trace(load_model("gpt", scan=True, remat="full"))
    assert any(op.remat for op in full.ops) and not any(op.remat for op in plain.ops)
    assert full.total_flops > plain.total_flops


@pytest.mark.parametrize(
    "name, options",
    [(m, {}) for m in MODEL_NAMES]
    + [
        ("gpt", {"scan": True, "remat": "full"}),
        ("gpt", {"mlp": "swiglu", "remat": "minimal"}),
        ("moe", {"experts": 8}),
    ],
)
def test_every_example_model_traces_with_no_opaque_op(name, options):
    g = al.trace(load_model(name, **options))
    al.check_graph(g)
    assert g.opaque == []
    assert all(d.size > 1 for d in g.dim_info.values())
    # every dim is named by the model (al.spec / al.name_dims) or is a second dim of such a family
    unnamed = [d for d in g.dim_info.values() if not d.user and not g.dim_info[d.family].user]
    assert unnamed == [], unnamed


def test_embedding_gather_and_its_scatter_gradient_carry_vocab(gpt_graph):
    g = gpt_graph
    scatters = [op for op in g.ops if op.primitive == "scatter-add"]
    assert any(g.tensors[op.outputs[0]].dims == ("vocab", "d_model") for op in scatters)
    gathers = [op for op in g.ops if op.primitive == "gather"]
    assert any(g.tensors[op.outputs[0]].dims == ("batch", "seq", "d_model") for op in gathers)


def test_conv_weight_gradient_shares_the_weight_dims():
    g = al.trace(load_model("unet3d"))
    w = g.input_tensor("params/enc/0/conv")
    convs = [op for op in g.ops if op.primitive == "conv_general_dilated"]
    assert any(g.tensors[op.outputs[0]].dims == w.dims for op in convs)
    assert {"depth", "height", "width"} <= set(g.dims)
    assert any(dict(s)["pairing"] == "kernel" for op in convs for s in op.param("spatial"))


def test_moe_has_an_experts_dim_on_its_expert_einsums():
    g = al.trace(load_model("moe"))
    assert g.dims["experts"] == 4
    w1 = g.input_tensor("params/layers/0/w1")
    assert w1.dims == ("experts", "d_model", "d_ff")
    assert any(op.primitive == "top_k" for op in g.ops) and any(
        op.primitive == "cumsum" for op in g.ops
    )


def test_t5_cross_attention_relates_two_sequence_families():
    g = al.trace(load_model("t5"))
    assert {"enc_seq", "dec_seq"} <= set(g.dims)
    assert g.dim_info["enc_seq"].family != g.dim_info["dec_seq"].family
    assert any(("dec_seq" in t.dims and "enc_seq" in t.dims) for t in g.tensors.values())


def test_reshape_merge_is_a_relation_named_after_its_parts():
    def step(x):
        return jnp.sum(jnp.tanh(x.reshape(x.shape[0], -1)))

    g = al.trace(al.Workload(step, (al.spec((4, 6, 8), ("batch", "heads", "head_dim")),)))
    assert "heads*head_dim" in g.dims and g.dims["heads*head_dim"] == 48
    reshape = next(op for op in g.ops if op.primitive == "reshape")
    assert reshape.param("groups") == (((0,), (0,)), ((1, 2), (1,)))


def test_user_names_never_merge_into_each_other():
    def step(a, b):  # a's "rows" meets b's "cols" in the contraction
        return jnp.sum(a @ b)

    g = al.trace(
        al.Workload(step, (al.spec((4, 8), ("m", "rows")), al.spec((8, 5), ("cols", "n"))))
    )
    assert {"rows", "cols"} <= set(g.dims)
    assert g.dim_info["rows"].family == g.dim_info["cols"].family


def test_inferred_names_come_from_the_input_path():
    def step(params, x):
        return jnp.sum(x @ params["w"])

    g = al.trace(
        al.Workload(
            step,
            ({"w": jax.ShapeDtypeStruct((8, 16), jnp.float32)}, al.spec((4, 8), ("batch", None))),
        )
    )
    # the argument's name and generic leaves (kernel, w, bias) are dropped where a name is
    # left; no axis index (issue 35): the last axis is the weight's name, the one before _in
    assert g.input_tensor("params/w").dims == ("w_in", "w")
    assert g.input_tensor("x").dims == ("batch", "w_in")


def test_control_flow_and_custom_derivatives_are_walked():
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))

    def step(w, x):
        def loss(w):
            y = f(x @ w)
            y = lax.cond(jnp.sum(y) > 0, lambda q: q * 2.0, lambda q: q + 1.0, y)
            y = lax.fori_loop(0, 3, lambda i, c: c * 1.1, y)
            return jnp.sum(jax.nn.relu(y))

        g = jax.grad(loss)(w)
        z = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2.0), (0, g))[1]
        return w - 0.1 * z

    g = al.trace(
        al.Workload(step, (al.spec((8, 16), ("d_in", "d_out")), al.spec((4, 8), ("batch", "d_in"))))
    )
    al.check_graph(g)
    assert g.opaque == []
    assert {lp.kind for lp in g.loops} == {"scan", "while"}
    assert any(op.primitive == "cond" for op in g.ops)
    assert any(op.scope and op.scope[0].startswith("cond.") for op in g.ops)
    assert g.tensors[g.outputs[0]].dims == ("d_in", "d_out")


def test_a_primitive_without_a_rule_is_an_opaque_op_not_a_crash():
    unknown = jax.extend.core.Primitive("a_users_own_primitive")  # no dim rule, no policy
    unknown.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape[:1], x.dtype))

    def step(x):
        return jnp.sum(unknown.bind(x) * 2.0)

    g = al.trace(al.Workload(step, (al.spec((4, 8), ("batch", "d")),)))
    al.check_graph(g)
    assert [op.primitive for op in g.opaque] == ["a_users_own_primitive"]
    assert "no dim rule" in g.opaque[0].param("reason")
    assert g.opaque[0].opaque and g.dims["batch"] == 4


def test_a_step_that_does_not_trace_is_a_trace_error():
    wl = al.Workload(lambda x: x @ x, (al.spec((4, 8), ("a", "b")),), name="broken")
    with pytest.raises(
        al.TraceError, match="jax.make_jaxpr of workload 'broken' failed: TypeError"
    ):
        al.trace(wl)


@pytest.mark.parametrize(
    "shape, dims, message",
    [
        ((4, 8), ("a",), r"has 2 axes but 1 dim names"),
        ((4, 8), ("a", "a"), r"names dim 'a' on two axes"),
        ((4, 8), ("a", ""), r"non-empty strings or None"),
    ],
)
def test_bad_specs_are_errors(shape, dims, message):
    with pytest.raises(al.WorkloadError, match=message):
        al.spec(shape, dims)


def test_tracing_allocates_nothing():
    before = len(jax.live_arrays())
    al.trace(load_model("gpt", size="gpt3-xl", layers=2))
    assert len(jax.live_arrays()) == before


def test_name_dims_names_an_intermediate():
    def step(x):
        oh = al.name_dims(jax.nn.one_hot(jnp.argmax(x, axis=-1), 6), ("batch", "slots"))
        return jnp.sum(oh * jnp.cumsum(oh, axis=1))

    g = al.trace(al.Workload(step, (al.spec((4, 8), ("batch", "d")),)))
    assert g.dims == {"batch": 4, "d": 8, "slots": 6} and g.dim_info["slots"].user


@pytest.mark.parametrize(
    "dims, message",
    [
        (("a",), "has 2 axes but 1 names"),
        (("a", "a"), "names one dim twice"),
        (("a", "b,c"), "without commas"),
    ],
)
def test_name_dims_errors(dims, message):
    with pytest.raises(al.WorkloadError, match=message):
        al.name_dims(jnp.zeros((2, 3)), dims)


def test_the_listed_primitives_all_have_rules():
    def step(x, w, v):
        def loss(x):
            a = jnp.concatenate([x, x], axis=1)[:, :8]
            a = jnp.pad(a, ((0, 0), (1, 1)))[:, 1:-1]
            a = lax.dynamic_update_slice(a, lax.dynamic_slice(a, (0, 0), (4, 2)), (0, 2))
            a = jnp.flip(a, 0) + jnp.cumsum(a, axis=1) + jnp.sort(a, axis=1)
            top, _ = lax.top_k(a, 3)
            b = jnp.expand_dims(a, 1).squeeze(1) * jnp.argmax(a, axis=1)[:, None]
            c = lax.conv_general_dilated(
                v * jnp.sum(x), w, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")
            )
            i = jnp.arange(8)[None, :] < 4
            return (
                jnp.sum(jnp.where(i, b, 0.0) ** 2)
                + jnp.max(top)
                + jnp.min(a)
                + jnp.sum(c.astype(jnp.float32))
            )

        return x - 0.1 * jax.grad(loss)(x)  # as an optimizer step would

    g = al.trace(
        al.Workload(
            step,
            (
                al.spec((4, 8), ("batch", "d")),
                al.spec((3, 2, 5), ("k", "c_in", "c_out")),
                al.spec((4, 16, 2), ("batch", "w", "c_in")),
            ),
        )
    )
    al.check_graph(g)
    assert g.opaque == []
    prims = {op.primitive for op in g.ops}
    for p in ("concatenate", "slice", "pad", "dynamic_slice", "dynamic_update_slice", "rev", "cumsum", "sort",
              "top_k", "argmax", "reduce_max", "reduce_min", "iota", "select_n", "conv_general_dilated", "broadcast_in_dim"):  # fmt: skip
        assert p in prims, p
    assert g.tensors[g.outputs[0]].dims == ("batch", "d")


@pytest.mark.parametrize("which", ["split", "concatenate", "sort", "while", "scan", "cond"])
def test_a_live_op_keeps_its_dead_results(which):
    """A multi-result op one of whose results nothing reads (split's second half, a loop's
    unused carry) stays in the graph with all its results: pricing it used to raise a
    KeyError on the dropped tensor."""
    bodies = {
        "split": lambda w, x: jnp.sum(jnp.split(x @ w, 2, axis=1)[0] ** 2),
        "concatenate": lambda w, x: jnp.sum(jnp.concatenate([x @ w, x], axis=1) ** 2),
        "sort": lambda w, x: jnp.sum(jnp.sort(x @ w, axis=1)[:, :4]),
        "while": lambda w, x: jnp.sum(lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x)),
        "scan": lambda w, x: jnp.sum(
            lax.scan(lambda h, _: (jnp.tanh(h @ w), None), x, None, length=3)[0]
        ),
        "cond": lambda w, x: jnp.sum(lax.cond(jnp.sum(x) > 0, lambda: x @ w, lambda: x @ w.T)),
    }
    f = bodies[which]
    wl = al.Workload(
        lambda w, x: jax.grad(f)(w, x),
        (al.spec((32, 32), ("d", "e")), al.spec((8, 32), ("batch", "d"))),
    )
    g = al.trace(wl)
    al.check_graph(g)
    p = al.evaluate(wl, "cpu-8", mesh={"data": 2, "model": 4}, rules={"batch": "data"}, graph=g)
    assert p.predicted["step_time_s"] > 0


@pytest.mark.parametrize(
    "opts", [{"layers": 4, "remat": "full"}, {"layers": 3, "remat": "minimal"}, {"scan": True}]
)
def test_stamped_calls_equal_walked_ones(opts, monkeypatch):
    """A call of a jaxpr walked before (each remat layer) is stamped from that walk's record;
    the graph, its dims and the runtime's visits equal walking every call."""
    from autolayout.core import _trace

    wl = load_model("gpt", **opts)
    stamps = []
    stamp = _trace._Template.stamp
    monkeypatch.setattr(
        _trace._Template, "stamp", lambda self, *a: stamps.append(1) or stamp(self, *a)
    )
    g1, _, visits1 = _trace.trace_with_jaxpr(wl)
    monkeypatch.setattr(_trace._Template, "record", classmethod(lambda cls, *a: None))
    g2, _, visits2 = _trace.trace_with_jaxpr(wl)
    if opts.get("remat", "none") != "none":
        assert stamps  # the layers after the first were stamped
    assert g1.ops == g2.ops
    assert g1.tensors == g2.tensors
    assert g1.dim_info == g2.dim_info
    assert (g1.inputs, g1.outputs, g1.loops) == (g2.inputs, g2.outputs, g2.loops)
    assert visits1 == visits2


def test_a_scanned_mlp_without_names_gets_its_roles():
    """No embedding, no attention, no names: the stacked axis a scan runs the weights over is
    ``layers``, the per-example carry's features ``d_model``, the hidden width ``d_ff``."""
    import numpy as np
    import optax

    L, W, H, B = 3, 32, 96, 16

    def init(key):
        k1, k2 = jax.random.split(key)
        return {"up": jax.random.normal(k1, (L, W, H)) * 0.1,
                "down": jax.random.normal(k2, (L, H, W)) * 0.1}  # fmt: skip

    def loss_fn(params, batch):
        def block(h, p):
            return h + jax.nn.relu(h @ p["up"]) @ p["down"], None

        h, _ = jax.lax.scan(block, batch["x"], params)
        return jnp.mean((h - batch["y"]) ** 2)

    def make_batch(rng):
        return {k: rng.standard_normal((B, W)).astype(np.float32) for k in ("x", "y")}

    specs = {k: jax.ShapeDtypeStruct((B, W), jnp.float32) for k in ("x", "y")}
    g = al.trace(al.train_workload(loss_fn, optax.adam(1e-3), init, specs, make_batch))
    assert {"layers": L, "batch": B, "d_model": W, "d_ff": H}.items() <= g.dims.items(), g.dims


def test_a_step_carrying_its_jaxpr_is_walked_not_traced_again():
    """A step function that interprets a jaxpr (a rewrite of another step's) may carry it as
    ``fn.closed_jaxpr``: the tracer walks it instead of tracing the Python again (the same
    graph), unless the workload's arguments have other shapes (one pipeline stage's)."""
    from autolayout.core._trace import trace_with_jaxpr

    wl = load_model("gpt", remat="full")
    calls = []

    def step(params, opt_state, batch):
        calls.append(1)
        return wl.fn(params, opt_state, batch)

    step.closed_jaxpr = jax.make_jaxpr(wl.fn)(*wl.args)
    carried = al.Workload(step, wl.args, donate_argnums=wl.donate_argnums, name=wl.name)
    g1, _, visits1 = trace_with_jaxpr(wl)
    g2, closed, visits2 = trace_with_jaxpr(carried)
    assert not calls and closed is step.closed_jaxpr
    assert (g1.ops, g1.tensors, g1.dim_info) == (g2.ops, g2.tensors, g2.dim_info)
    assert (g1.inputs, g1.outputs, g1.loops, visits1) == (g2.inputs, g2.outputs, g2.loops, visits2)
    half = jax.tree.map(lambda s: al.spec((s.shape[0] // 2, *s.shape[1:]), s.dims, s.dtype),
                        wl.args[2])  # fmt: skip
    g3 = al.trace(al.Workload(step, (*wl.args[:2], half), donate_argnums=(0, 1)))
    assert calls and g3.dims["batch"] == g1.dims["batch"] // 2


def _digest(g) -> str:
    """A hash of everything a graph holds, in order."""
    import hashlib

    h = hashlib.sha256()
    for op in g.ops:
        h.update(repr((op.name, op.primitive, op.inputs, op.outputs, op.links, op.params, op.flops,
                       op.scope, op.trip_count, op.opaque, op.name_stack)).encode())  # fmt: skip
    for t in sorted(g.tensors):
        h.update(repr(g.tensors[t]).encode())
    h.update(repr(sorted(g.dim_info.items())).encode())
    h.update(repr((g.inputs, g.outputs, g.loops)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize(
    "name, ops, digest",
    # not Keras: it names variables by a process-wide counter, so its graph's paths depend on
    # the models made before it in the process (the suite's order changed this digest)
    [("hf_t5", 1839, "3c150a101d88fc0f"), ("hf_mistral", 906, "5d23a68149903526")],
)  # fmt: skip
def test_library_graphs_are_those_before_the_speed_work(name, ops, digest):
    """Issue 34's speed work (the naming's program facts found once, the WL colours over
    precomputed references) left every graph as it was: these digests are the tiny models'
    graphs at the commit before it (transformers 4.57, keras 3.15, jax 0.10). A change of
    the tracer's output, or of those libraries, changes them: update them where meant."""
    import importlib.util
    from pathlib import Path

    library = "transformers" if name.startswith("hf_") else "keras"
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed (pip install -e '.[libraries]')")

    path = Path(__file__).resolve().parent.parent / "experiments/models/libraries" / f"{name}.py"
    g = al.trace(al.load_workload(path))
    assert (len(g.ops), _digest(g)) == (ops, digest)
