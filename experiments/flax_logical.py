"""A Flax model trained with the planner's rules through Flax's own logical partitioning.

    python experiments/flax_logical.py          # on 8 (fake, on a CPU) devices

The model's parameters carry logical axis names (``nn.with_logical_partitioning``), the
names MaxText uses (``embed``, ``mlp``, ``batch``). The step is planned on ``cpu-8`` with the
parameters' logical names as their dim names; ``plan.logical_axis_rules()`` then goes to
``nn.logical_to_mesh_sharding`` unchanged, and the model trains for a few steps with those
shardings. The parameters' shardings are checked against the plan's partition specs. Where
the plan lays some inputs out otherwise than its rules (exceptions, which one rule per
logical name cannot say), the rules alone are trained and their price printed.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

import autolayout as al  # noqa: E402

BATCH, EMBED, MLP = 64, 128, 512


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        w1 = self.param("w1", nn.with_logical_partitioning(init, ("embed", "mlp")), (EMBED, MLP))
        w2 = self.param("w2", nn.with_logical_partitioning(init, ("mlp", "embed")), (MLP, EMBED))
        return x + jax.nn.relu(x @ w1) @ w2


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        for i in range(2):
            x = Block(name=f"block{i}")(x)
        return x


def main(steps: int = 5, time_limit_s: float = 10.0):
    model = Model()
    opt = optax.adam(1e-3)
    x0 = jax.ShapeDtypeStruct((BATCH, EMBED), jnp.float32)
    boxed = jax.eval_shape(model.init, jax.random.key(0), x0)["params"]
    logical = nn.get_partition_spec(boxed)  # PartitionSpec of logical names per parameter

    def loss_fn(params, batch):
        y = model.apply({"params": params}, batch["x"])
        return jnp.mean((y - batch["y"]) ** 2)

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # the workload: the parameters' logical names are their dim names
    params = jax.tree.map(
        lambda b, spec: al.spec(b.value.shape, tuple(spec), b.value.dtype),
        boxed, logical, is_leaf=lambda v: isinstance(v, nn.Partitioned),
    )  # fmt: skip
    batch = {
        "x": al.spec((BATCH, EMBED), ("batch", "embed")),
        "y": al.spec((BATCH, EMBED), ("batch", "embed")),
    }
    wl = al.Workload(train_step, (params, jax.eval_shape(opt.init, params), batch),
                     donate_argnums=(0, 1), name="flax-mlp")  # fmt: skip
    plan = al.plan(wl, "cpu-8", time_limit_s=time_limit_s)
    if plan.solver["exceptions"]:
        # Flax's logical partitioning gives every parameter of a logical name one layout: a
        # plan whose inputs are laid out otherwise than its rules ("exceptions") cannot be
        # said in it, so this trains the rules alone, priced as such (al.evaluate)
        searched = plan.predicted["step_time_s"]
        plan = al.evaluate(wl, "cpu-8", mesh=plan.mesh, rules=plan.rules())
        print(f"the plan's {len(plan.inputs)} inputs need exceptions to its rules; its rules "
              f"alone: {plan.predicted['step_time_s'] * 1e3:.3f} ms against "
              f"{searched * 1e3:.3f} ms")  # fmt: skip
    rules = plan.logical_axis_rules()

    # Flax's own logical partitioning, with the plan's rules unchanged
    devices = np.array(jax.devices()[: plan.devices]).reshape(tuple(plan.mesh.values()))
    mesh = Mesh(devices, tuple(plan.mesh))
    param_sh = nn.logical_to_mesh_sharding(logical, mesh, rules)
    batch_sh = nn.logical_to_mesh_sharding(
        {"x": PartitionSpec("batch", "embed"), "y": PartitionSpec("batch", "embed")}, mesh, rules
    )

    def init(key):
        p = nn.unbox(model.init(key, jnp.zeros((BATCH, EMBED)))["params"])
        return p, opt.init(p)

    opt_sh = jax.tree.map(lambda _: None, jax.eval_shape(opt.init, params))
    state_sh = (param_sh, _like(opt_sh, param_sh, mesh))
    p, o = jax.jit(init, out_shardings=state_sh)(jax.random.key(0))
    step = jax.jit(train_step, in_shardings=(*state_sh, batch_sh),
                   out_shardings=(*state_sh, None), donate_argnums=(0, 1))  # fmt: skip
    rng = np.random.default_rng(0)
    target = rng.standard_normal((EMBED, EMBED)).astype(np.float32) / np.sqrt(EMBED)
    losses = []
    for _ in range(steps):
        xb = rng.standard_normal((BATCH, EMBED)).astype(np.float32)
        b = jax.device_put({"x": xb, "y": xb @ target}, batch_sh)
        p, o, loss = step(p, o, b)
        losses.append(float(loss))
    specs = {i["path"]: tuple(i["layout"]) for i in plan.inputs}
    got = {
        "params/" + "/".join(str(k.key) for k in path): leaf.sharding.spec
        for path, leaf in jax.tree_util.tree_flatten_with_path(p)[0]
    }
    return plan, rules, losses, specs, got


def _like(opt_sh, param_sh, mesh):
    """Adam's state: the moments laid out as the parameters, the step count replicated."""
    from jax.sharding import NamedSharding

    def fill(node):
        if isinstance(node, optax.ScaleByAdamState):
            return optax.ScaleByAdamState(NamedSharding(mesh, PartitionSpec()), param_sh, param_sh)
        return node

    return jax.tree.map(fill, opt_sh, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))


if __name__ == "__main__":
    plan, rules, losses, specs, got = main()
    print(plan)
    print("logical_axis_rules:", rules)
    for path, spec in got.items():
        print(f"  {path:<24} {spec}   (plan: {specs[path]})")
    print("losses:", " ".join(f"{x:.5f}" for x in losses))
