"""Every primitive has a dim rule or a stated policy (issue 35): JAX's own primitives and
those of the libraries (Flax, Equinox, Optax, Keras), and a corpus of programs written with
each (``experiments/models/corpus/programs.py``) traced with no opaque op. The rules keep
what XLA's SPMD partitioner keeps split: a pooling's, a ``jnp.stack``'s, a dropout's and a
depthwise convolution's batch and channels pass through without a collective."""

import sys

import jax
import jax._src.pallas.mosaic_gpu.lowering  # Pallas' interpreter imports it (splash on CPU)
import jax.experimental.multihost_utils
import jax.experimental.pallas
import jax.experimental.pallas.mosaic_gpu
import jax.experimental.pallas.tpu
import jax.experimental.sparse
import jax.numpy as jnp
import pytest
from jax import lax

import autolayout as al
from autolayout.core._dim_rules import DIM_RULES, POLICY
from autolayout.core._trace import CALL_RULES
from autolayout.cost_models.replicating import opaque_ops
from conftest import MODELS

sys.path.insert(0, str(MODELS / "corpus"))
import programs  # noqa: E402

LIBRARIES = ("jax", "jaxlib", "flax", "equinox", "optax", "keras")
JAX_EXTRAS = (jax.experimental.multihost_utils, jax.experimental.pallas,  # their primitives
              jax.experimental.pallas.tpu, jax.experimental.sparse)  # are JAX's too  # fmt: skip


def _primitives_in_modules() -> dict[str, str]:
    """Every primitive object a loaded module of JAX or a library holds, by name."""
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in LIBRARIES:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, jax.extend.core.Primitive):
                found.setdefault(value.name, name)
    return found


def test_every_primitive_of_jax_and_the_libraries_has_a_rule_or_a_policy():
    programs.programs()  # imports the libraries
    found = _primitives_in_modules()
    assert len(found) > 300  # the walk sees JAX's whole list (354 in jax 0.10.2)
    known = set(DIM_RULES) | set(CALL_RULES)
    missing = sorted(f"{p} ({m})" for p, m in found.items() if p not in known)
    assert not missing, f"primitives with neither a dim rule nor a policy: {missing}"
    assert not set(POLICY) & set(CALL_RULES)  # a policy is for what no walker reads


@pytest.mark.parametrize("group", sorted(programs.GROUPS))
def test_the_corpus_traces_with_no_opaque_op(group):
    for name, (fn, args) in programs.GROUPS[group]().items():
        closed = jax.make_jaxpr(fn)(*args)
        unknown = programs.primitives(closed) - set(DIM_RULES) - set(CALL_RULES)
        assert not unknown, f"{name}: {sorted(unknown)}"
        g = al.trace(al.Workload(fn, args, name=name))
        if all(0 not in t.shape for t in g.tensors.values()):  # (check_graph wants a dim on
            al.check_graph(g)  # a size-0 axis, as cumprod's associative scan slices them)
        opaque = [(op.primitive, op.param("reason")) for op in g.opaque]
        assert opaque == [], f"{name}: {opaque}"


def test_a_policy_is_an_opaque_op_named_with_its_reason_and_share():
    def step(a):  # LAPACK's Cholesky: a custom call XLA cannot split
        return jnp.sum(jnp.linalg.cholesky(a @ a.T + jnp.eye(64)) ** 2)

    wl = al.Workload(step, (al.spec((64, 64), ("n", "m")),))
    plan = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"n": "data"})
    (op,) = plan.graph.opaque
    assert op.primitive == "cholesky" and op.param("reason") == POLICY["cholesky"]
    (row,) = opaque_ops(plan.graph, plan.ops)
    assert row["op"] == op.name and row["reason"].startswith("a custom call")
    assert 0 < row["share"] < 1 and row["time_s"] > 0


def _evaluate_split(fn, args, rules) -> al.Plan:
    return al.evaluate(al.Workload(fn, args), "cpu-8", mesh={"data": 8}, rules=rules)


def _rows(plan, *kinds):
    rows = [r for r in plan.ops if r["kind"] in kinds]
    assert {r["kind"] for r in rows} == set(kinds), f"missing ops of {kinds}"
    return rows


def test_stack_and_unstack_keep_the_batch_split():
    """Mixtral's rotary embedding (``jnp.stack`` of interleaved pairs) under data parallelism:
    ``stack`` and its gradient ``unstack`` run on each device's batch, no collective (as an
    opaque op each gathered its whole activation: issue 35's MFU 0.036)."""
    q = al.spec((16, 8, 4, 16), ("batch", "seq", "heads", "head_dim"))
    plan = _evaluate_split(jax.grad(lambda q: jnp.sum(programs._rotary(q) ** 2)), (q,),
                           {"batch": "data"})  # fmt: skip
    for r in _rows(plan, "stack", "unstack"):
        assert "batch:data" in r["strategy"] and r["comm_s"] == 0, r


@pytest.mark.parametrize("split", ["batch", "channels"])
def test_pooling_and_its_gradient_keep_batch_and_channels_split(split):
    """Max and average pooling and max pooling's gradient (``select_and_scatter_add``) pass
    the batch and the channels through: a split of either needs no collective there."""
    x = al.spec((16, 8, 8, 8), ("batch", "h", "w", "channels"))

    def step(x):
        def pooled(x):
            m = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
            return m + lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")

        return jax.grad(lambda x: jnp.sum(pooled(x) ** 2))(x)

    plan = _evaluate_split(step, (x,), {split: "data"})
    rows = _rows(plan, "reduce_window_max", "reduce_window_sum", "select_and_scatter_add")
    for r in rows:
        assert f"{split}:data" in r["strategy"] and r["comm_s"] == 0, r
    pool = next(op for op in plan.graph.ops if op.primitive == "reduce_window_max")
    dims = plan.graph.tensors[pool.outputs[0]].dims
    assert dims[0] == "batch" and dims[3] == "channels"
    assert dims[1] != "h" and dims[2] != "w"  # strided windows: relations, not the same dim


def test_depthwise_convolution_splits_its_channels_a_grouped_one_does_not():
    """A depthwise convolution (a group per channel) and its gradients keep channels split
    (XLA:CPU: no collective); other groupings XLA gathers, so their channels stay apart."""
    dn = ("NHWC", "HWIO", "NHWC")
    x = al.spec((8, 8, 8, 8), ("batch", "h", "w", "channels"))

    def step(w, x, groups):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn,
                                     feature_group_count=groups)  # fmt: skip
        return jnp.sum(y**2)

    depthwise = jax.ShapeDtypeStruct((3, 3, 1, 8), jnp.float32)
    plan = _evaluate_split(jax.grad(lambda w, x: step(w, x, 8), argnums=(0, 1)),
                           (depthwise, x), {"channels": "data"})  # fmt: skip
    for r in _rows(plan, "conv_general_dilated"):
        assert "channels:data" in r["strategy"] and r["comm_s"] == 0, r
    g = al.trace(al.Workload(lambda w, x: step(w, x, 2), (jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32), x)))  # fmt: skip
    (conv,) = [op for op in g.ops if op.primitive == "conv_general_dilated"]
    assert g.tensors[conv.inputs[0]].dims[3] != g.tensors[conv.outputs[0]].dims[3]


def test_dropout_draws_each_devices_block_of_random_bits():
    """Flax-style dropout (a typed key, ``random_bits``, ``bitcast_convert_type``): the bits
    split with the batch, no collective; a key prices as its data's bytes."""
    x = al.spec((16, 32), ("batch", "d"))

    def step(x, seed):
        keep = jax.random.bernoulli(jax.random.key(seed), 0.9, x.shape)
        return jax.grad(lambda x: jnp.sum(jnp.where(keep, x, 0.0) ** 2))(x)

    plan = _evaluate_split(step, (x, jax.ShapeDtypeStruct((), jnp.int32)), {"batch": "data"})
    for r in _rows(plan, "random_bits", "bitcast_convert_type"):
        assert "batch:data" in r["strategy"] and r["comm_s"] == 0, r
    seed = next(op for op in plan.graph.ops if op.primitive == "random_seed")
    assert plan.graph.tensors[seed.outputs[0]].nbytes == 8  # two uint32 words


def test_ragged_dot_links_tokens_and_names_the_experts():
    """``lax.ragged_dot`` (an MoE's grouped matmul) and its gradients: the rows are the
    tokens', and the weight gradient's group axis is the weight's experts."""
    w = al.spec((4, 16, 32), ("experts", "d_model", "d_ff"))
    x = al.spec((64, 16), ("tokens", "d_model"))

    def step(w, x, sizes):
        return jax.grad(lambda w, x: jnp.sum(lax.ragged_dot(x, w, sizes) ** 2), (0, 1))(w, x)

    g = al.trace(al.Workload(step, (w, x, jax.ShapeDtypeStruct((4,), jnp.int32))))
    ops = [op for op in g.ops if op.primitive == "ragged_dot_general"]
    dims = [tuple(g.tensors[op.outputs[0]].dims) for op in ops]
    assert ("tokens", "d_ff") in dims and ("experts", "d_model", "d_ff") in dims
    assert sum(op.flops for op in ops) == 3 * 2 * 64 * 16 * 32  # each row meets one expert


@pytest.mark.parametrize("model", ["cnn", "resnet", "moe_rotary", "moe_sorted", "eqx_scan_lm",
                                   "loop_shared"])  # fmt: skip
def test_corpus_models_trace_clean_and_plan_with_the_batch_split(model):
    wl = al.load_workload(MODELS / "corpus" / f"{model}.py")
    plan = al.plan(wl, "cpu-8", time_limit_s=3)
    assert plan.graph.opaque == []
    assert ("batch", ("data",)) in plan.rules() or any(
        d == "batch" and a for d, a in plan.rules()
    ), plan.rules()


def test_the_flax_cnn_validates_against_xla():
    """The Flax CNN (BatchNorm, max and average pooling, a depthwise conv, dropout) under data
    parallelism: the all-reduces XLA compiles are the ones predicted."""
    wl = al.load_workload(MODELS / "corpus" / "cnn.py")
    plan = al.evaluate(wl, "cpu-8", mesh={"data": 8}, rules={"batch": "data"})
    df = al.validate(plan, wl).set_index("quantity")
    colls = [q for q in df.index if "-" in q]  # all-reduce, all-gather, ...
    assert colls == ["all-reduce"], df
    assert abs(df.loc["all-reduce", "ratio"] - 1) <= 0.1, df


def test_a_plan_names_each_opaque_op_and_its_share(tmp_path):
    """Issue 35, item 2: the plan (and the CLI) names each op it runs whole on every device,
    why, and its share of the step."""
    from click.testing import CliRunner

    from autolayout._cli import main

    model = tmp_path / "chol.py"
    model.write_text(
        "import jax.numpy as jnp\nimport autolayout as al\n\n\n"
        "def workload():\n"
        "    def step(a):\n"
        "        return jnp.sum(jnp.linalg.cholesky(a @ a.T + jnp.eye(8)))\n\n"
        '    return al.Workload(step, (al.spec((8, 8), ("n", "m")),), name="chol")\n'
    )
    r = CliRunner().invoke(
        main, ["evaluate", str(model), "--hw", "cpu-8", "--mesh", "data=8", "--out",
               str(tmp_path / "p.json")], env={"COLUMNS": "80"},
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    opaque = al.Plan.load(tmp_path / "p.json").solver["opaque"]
    assert [o["primitive"] for o in opaque] == ["cholesky"] and 0 < opaque[0]["share"] < 1
    assert "opaque ops: 1, " in r.output and "cholesky" in r.output and "custom call" in r.output


@pytest.mark.xfail(strict=True, reason="found, not fixed: the moments' dims come out swapped")
def test_a_shared_weight_loops_moments_carry_their_weights_dims():
    """``loop_shared.py``: Adam's moments of the square weight a ``fori_loop``'s layers share
    carry the weight's dims in its order, and the bias's moment the bias's dim. Traced, the
    two hidden dims (``d_model``, ``b_res``) come out swapped in the optimizer state
    (``mu/w_res`` is ``(b_res, d_model)`` beside ``w_res``'s ``(d_model, b_res)``), so a
    plan lays the moments out otherwise than their weights (exceptions, resharding)."""
    g = al.trace(al.load_workload(MODELS / "corpus" / "loop_shared.py"))
    dims = {g.tensors[t].path: g.tensors[t].dims for t in g.inputs}
    for name in ("w_res", "b_res", "w_in"):
        for moment in ("mu", "nu"):
            assert dims[f"opt_state/0/{moment}/{name}"] == dims[f"params/{name}"], dims
