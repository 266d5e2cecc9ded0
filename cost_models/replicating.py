"""Which reshardings XLA's SPMD partitioner can only do by replicating the tensor.

Where ``PartitionedHlo::ReshardNoCache`` finds no targeted way from one sharding to another,
it all-gathers the whole tensor on every device and slices the target's block out of it,
logging ``Involuntary full rematerialization. The compiler was not able to go from sharding
{...} to {...}``: every device then holds the whole tensor for a moment, and the step moves
``(devices - 1) / devices`` of it per device instead of a share. Issue 34's user met it on an
MLP weight stored FSDP-style, ``{devices=[1,8]}`` (d_model on all eight devices), read by the
plan with d_ff on one mesh axis of ``fsdp=4 x fsdp2=2`` and d_model whole.

Measured on 8 CPU devices (every pair of 2-D layouts on 2x4, 4x2, 2x2x2 and 8, every pair of
3-D layouts on 2x4 and 4x2, 2,000 of 3-D on 2x2x2; ``tests/test_memory_strangers.py``
compiles a share of them), whether XLA replicates depends on each tensor axis's tile count
in the two layouts alone, never on which mesh axes or in which order. It does not replicate
where the counts are equal (a collective-permute), swap between pairs of axes with equal
replicas (all-to-all), grow by multiples from a partly replicated layout (a local slice),
shrink by divisors into a partly replicated one (gathers within groups), merge or split
between two axes, or agree on some axis (it regroups the devices there). It replicates
otherwise; for two tensor axes, exactly (counts ``[rows, cols]``, 8 devices):

* a split moving wholly to the other axis with another count, the target partly
  replicated: ``[1, k] -> [j, 1]`` with ``j != k`` and ``j < 8`` (and transposed):
  ``{devices=[1,8]}`` to ``[[a], []]`` or ``[[a, b], []]`` of 2x2x2, ``[1, 2]`` to
  ``[4, 1]`` on 2x4: the issue's weight;
* ``[1, 8]`` or ``[8, 1]`` to ``[2, 2]``, and ``[2, 2]`` to ``[1, 8]`` or ``[8, 1]``;

and for three, besides those, a split spread over two other axes or two splits merged into a
third: ``[1, 1, 8] -> [2, 4, 1]``, ``[1, 2, 4] -> [8, 1, 1]``. A tiny reproducer::

    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    f = jax.jit(lambda x: jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P("b"))),
                in_shardings=NamedSharding(mesh, P(None, "a")))
    f.lower(jax.ShapeDtypeStruct((32, 64), jnp.float32)).compile()  # logs the warning

:func:`autolayout.cost_models.xla_reshard.xla_reshard` replays ``ReshardNoCache`` (and
prices the fallback as all-gathers of the whole tensor, then a free slice);
:func:`replicates` asks it the one question.

An *opaque op* (an equation no dim rule reads: a custom call XLA cannot split, a user's
own primitive) is run the same way, whole on every device with its operands gathered;
:func:`opaque_ops` names each with its reason and its share of a priced step, so a plan
says what it spends there (``plan.solver["opaque"]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autolayout.core import Graph, Layout

from .xla_reshard import xla_reshard


def replicates(machine: Any, tensor: Any, src: Layout, dst: Layout) -> bool:
    """Whether XLA's SPMD partitioner moves ``tensor`` from layout ``src`` to ``dst`` only by
    gathering it whole on every device and slicing (its "involuntary full
    rematerialization"). ``machine``: a :class:`~autolayout.cost_models.Machine` or a mesh
    ``{axis: size}``; ``tensor``: a :class:`~autolayout.core.Tensor` or a shape. A target
    that is the whole tensor is an ordinary gather, not this.

    Example:
      >>> replicates({"a": 2, "b": 4}, (32, 64), ((), ("a",)), (("b",), ()))
      True
      >>> replicates({"a": 2, "b": 4}, (32, 64), ((), ("a",)), (("a",), ()))  # all-to-all
      False
    """
    mesh: Mapping[str, int] = getattr(machine, "mesh", machine)
    shape: Sequence[int] = getattr(tensor, "shape", tensor)
    src, dst = tuple(map(tuple, src)), tuple(map(tuple, dst))
    if src == dst or not any(dst) or not any(src):
        return False
    return xla_reshard(tuple(mesh.items()), tuple(shape), src, dst)[1]


def opaque_ops(g: Graph, rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The graph's opaque ops as a priced step runs them, costliest first: ``op``,
    ``primitive``, ``layer``, ``reason`` (``op.param("reason")``), ``time_s`` (compute and
    collectives, every trip of a step) and ``share`` of the step's summed op time. ``rows``:
    the plan's per-op rows (``plan.ops``: ``op``, ``compute_s``, ``comm_s``, ``trips``).

    Example:
      >>> import autolayout as al, jax, jax.numpy as jnp
      >>> def step(a):
      ...     return jnp.sum(jnp.linalg.cholesky(a @ a.T + jnp.eye(8)))
      >>> wl = al.Workload(step, (al.spec((8, 8), ("n", "m")),))
      >>> plan = al.evaluate(wl, "cpu-8", mesh={"data": 8})
      >>> [(r["primitive"], r["share"] > 0) for r in opaque_ops(plan.graph, plan.ops)]
      [('cholesky', True)]
    """
    opaque = {op.name: op for op in g.ops if op.opaque}
    rows = list(rows)

    def time_s(r: Mapping[str, Any]) -> float:
        return (r["compute_s"] + r["comm_s"]) * r.get("trips", 1)

    total = sum(time_s(r) for r in rows)
    out = []
    for r in rows:
        op = opaque.get(r["op"])
        if op is None:
            continue
        t = time_s(r)
        out.append({"op": op.name, "primitive": op.primitive, "layer": r.get("layer", ""),
                    "reason": str(op.param("reason", "")), "time_s": t,
                    "share": t / total if total > 0 else 0.0})  # fmt: skip
    return sorted(out, key=lambda x: -x["time_s"])
