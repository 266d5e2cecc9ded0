"""``al.train_workload``: a loss, an optax optimizer and the argument shapes as a whole,
runnable train step (what ``autolayout plan`` prices and ``autolayout run`` runs)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._errors import WorkloadError
from ._metadata import named_specs, unboxed
from ._remat import remat as remat_workload
from ._trace import gpu_kernels_traceable
from ._workload import Workload, name_dims, spec


def train_workload(
    loss_fn: Callable[[Any, Any], jax.Array],
    optimizer: Any,
    params: Any,
    batch: Any,
    make_batch: Callable[[np.random.Generator], Any],
    *,
    name: str = "",
    options: dict | None = None,
    state: Any = None,
) -> Workload:
    """A whole train step ``(params, opt_state, batch) -> (params, opt_state, loss)``, or
    with non-trainable ``state``, ``(params, opt_state, state, batch) -> (params, opt_state,
    state, loss)``.

    Args:
      loss_fn: ``loss_fn(params, batch) -> scalar loss``.
      optimizer: an optax ``GradientTransformation`` (``optax.adamw(3e-4)``).
      params: the parameters' shapes, a pytree of ``al.spec`` / ``jax.ShapeDtypeStruct``
        (initialised as scaled normals, 1-D scales as ones), or your own jittable
        ``init(key) -> params`` (its shapes are read with ``jax.eval_shape``). Flax linen
        ``nn.with_logical_partitioning`` boxes and NNX variables with sharding metadata are
        unboxed, their names kept as dim names; ``loss_fn`` gets the plain arrays.
      batch: one batch's shapes, a pytree of ``al.spec`` / ``jax.ShapeDtypeStruct``.
      make_batch: ``make_batch(rng) -> one batch`` of host (numpy) arrays of those shapes,
        from a ``numpy.random.Generator`` (``autolayout run`` seeds it per step).
      name: shown in reports.
      options: what the model file's ``workload()`` was called with.
      state: non-trainable state the step updates and the optimizer does not (Flax linen's
        ``batch_stats`` collection, NNX ``BatchStat`` variables, Keras non-trainable
        variables), as ``params`` is given: specs or ``init(key) -> state``. With it,
        ``loss_fn(params, state, batch) -> (loss, new_state)``, the new state of the same
        structure (linen: ``model.apply(..., mutable=["batch_stats"])``'s updates; Keras:
        ``stateless_call``'s non-trainable variables). It is donated and carried from step
        to step like the parameters, and its dims are named like theirs.

    The parameters and the optimizer state are donated (the step updates them in place);
    ``init_state(key)`` builds them where they live, ``batches(step, seed)`` feeds the rest.

    Example:
      >>> import autolayout as al, jax, jax.numpy as jnp, numpy as np, optax
      >>> wl = al.train_workload(
      ...     lambda p, b: jnp.mean((b["x"] @ p["w"] - b["y"]) ** 2),
      ...     optax.adamw(1e-3),
      ...     {"w": jax.ShapeDtypeStruct((16, 4), jnp.float32)},
      ...     {"x": jax.ShapeDtypeStruct((8, 16), jnp.float32),
      ...      "y": jax.ShapeDtypeStruct((8, 4), jnp.float32)},
      ...     lambda rng: {"x": rng.standard_normal((8, 16), np.float32),
      ...                  "y": rng.standard_normal((8, 4), np.float32)},
      ... )
      >>> wl.donate_argnums, len(wl.batches(0, 0))
      ((0, 1), 1)
    """
    if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise WorkloadError(
            f"train_workload: optimizer must be an optax GradientTransformation (with init and "
            f"update), got {type(optimizer).__name__}"
        )
    params, init_params, host_params = _initialiser(params, "init(key)")
    if state is not None:
        state, init_extra, host_extra = _initialiser(state, "state init(key)")
        return _stateful(loss_fn, optimizer, params, state, batch, make_batch,
                         (init_params, host_params, init_extra, host_extra), name, options)  # fmt: skip

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    train_step.train_parts = (loss_fn, optimizer)  # what accumulate() rebuilds the step from

    opt_state = jax.eval_shape(optimizer.init, params)

    def init(seed: int = 0):  # real arguments, on the host
        rng = np.random.default_rng(seed)
        real = host_params(rng)
        return real, optimizer.init(real), _made(make_batch, rng, batch)

    def init_state(key):  # the donated arguments, jittable
        real = init_params(key)
        return real, optimizer.init(real)

    def batches(step: int, seed: int = 0):  # the other arguments of step `step`, on the host
        return (_made(make_batch, np.random.default_rng([seed, step]), batch),)

    makers = (init, init_state, batches)
    return _built(train_step, (params, opt_state, batch), (0, 1), name, loss_fn, makers, options)


def _initialiser(given: Any, what: str) -> tuple[Any, Callable, Callable]:
    """``given`` (specs or a jittable ``init(key)``) as its specs, a jittable ``init(key)``
    of plain arrays and a host ``init(rng)``."""
    if not callable(given):
        specs = named_specs(given)
        return (specs, functools.partial(_from_specs, specs),
                functools.partial(init_from_specs_host, specs))  # fmt: skip
    boxed_init = given
    try:  # names a library attached (Flax logical partitioning, NNX sharding) are kept
        with gpu_kernels_traceable():  # a model calling cuDNN attention inits anywhere
            specs = named_specs(jax.eval_shape(boxed_init, jax.random.key(0)))
    except Exception as e:
        raise WorkloadError(
            f"train_workload: {what} failed under jax.eval_shape: {type(e).__name__}: {e}"
        ) from e

    def user_init(key):  # the cuDNN stand-in: jit drops the dead attention init computes
        with gpu_kernels_traceable():
            return unboxed(boxed_init(key))

    def host(rng: np.random.Generator):
        return jax.jit(user_init)(jax.random.key(int(rng.integers(2**31))))

    return specs, user_init, host


def _from_specs(specs: Any, key: jax.Array) -> Any:
    return init_from_specs(specs, key)


def _stateful(loss_fn, optimizer, params, state, batch, make_batch, inits, name, options):
    """:func:`train_workload`'s step with non-trainable state: ``(params, opt_state, state,
    batch) -> (params, opt_state, state, loss)``, the state donated with the parameters."""
    init_params, host_params, init_extra, host_extra = inits
    want = jax.tree.structure(state)

    def train_step(params, opt_state, state, batch):
        def loss_and_state(params):
            got = loss_fn(params, state, batch)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise WorkloadError(
                    "train_workload: with state=, loss_fn(params, state, batch) must return "
                    f"(loss, new_state), got {type(got).__name__}"
                )
            return got[0], unboxed(got[1])

        (loss, new_state), grads = jax.value_and_grad(loss_and_state, has_aux=True)(params)
        if jax.tree.structure(new_state) != want:
            raise WorkloadError(
                "train_workload: loss_fn's new state has another structure than state= "
                f"({jax.tree.structure(new_state)} vs {want}): return the updated collection "
                "as it was given"
            )
        new_state = jax.tree.map(lambda n, s: n.astype(s.dtype), new_state, state)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, new_state, loss

    train_step.train_state = True  # accumulation_refusal: its state updates once per step
    opt_state = jax.eval_shape(optimizer.init, params)

    def init(seed: int = 0):  # real arguments, on the host
        rng = np.random.default_rng(seed)
        real = host_params(rng)
        return real, optimizer.init(real), host_extra(rng), _made(make_batch, rng, batch)

    def init_state(key):  # the donated arguments, jittable
        k1, k2 = jax.random.split(key)
        real = init_params(k1)
        return real, optimizer.init(real), init_extra(k2)

    def batches(step: int, seed: int = 0):  # the other arguments of step `step`, on the host
        return (_made(make_batch, np.random.default_rng([seed, step]), batch),)

    makers, args = (init, init_state, batches), (params, opt_state, state, batch)
    return _built(train_step, args, (0, 1, 2), name, loss_fn, makers, options)


ACCUMULATION = "accumulation"  # the options' key: the microbatches a step accumulates over


def accumulation_refusal(workload: Workload) -> str | None:
    """Why ``workload``'s step cannot accumulate gradients, in one line (``None`` where it
    can): only a step built by :func:`train_workload` is known as loss, gradient and update."""
    if getattr(workload.fn, "train_state", False):
        return (
            f"{workload.name}: gradient accumulation over a step with non-trainable state "
            "(train_workload's state=, e.g. batch statistics) is not supported: its state "
            "would be updated once per microbatch"
        )
    if getattr(workload.fn, "train_parts", None) is None:
        return (
            f"{workload.name}: gradient accumulation needs the step split into its gradient and "
            "its update, which only a step built by al.train_workload(loss_fn, optimizer, ...) "
            "is known to be (this step is an opaque function)"
        )
    return None


def accumulation_batch(workload: Workload) -> int | None:
    """The batch a step's gradients could be accumulated over (its batch argument's rows along
    the axes named ``batch``, else the leading ones); ``None`` where they disagree."""
    if len(workload.args) != 3:
        return None
    sizes = {s.shape[_batch_axis(s)] for s in jax.tree.leaves(workload.args[2]) if s.shape}
    return next(iter(sizes)) if len(sizes) == 1 else None


def _batch_axis(s: Any) -> int:
    dims = getattr(s, "dims", ()) or ()
    return dims.index("batch") if "batch" in dims else 0


def accumulate(workload: Workload, microbatches: int, remat: Any = None) -> Workload:
    """``workload``'s step with its gradients accumulated over ``microbatches`` microbatches:
    the batch cut into microbatches (microbatch ``m`` is rows ``m, M + m, 2M + m, ...``, so a
    batch split over devices stays split within each), a ``lax.scan`` over them summing the
    loss and the gradients, their mean given to the optimizer once. The same arguments,
    state, data, loss and gradients (for a loss that is a mean over the batch, as the example
    models' are); one microbatch's activations alive at a time.

    ``remat``: a function ``Workload -> Workload`` applied to the gradient of one microbatch
    (``al.remat`` with a policy), so a plan may recompute inside each microbatch too.
    Refused in one line (:class:`WorkloadError`) for a step not built by
    :func:`train_workload`, or a batch the count does not divide."""
    why = accumulation_refusal(workload)
    if why is not None:
        raise WorkloadError(why)
    k = int(microbatches)
    if k < 1:
        raise WorkloadError(f"microbatches must be at least 1, got {microbatches}")
    loss_fn, optimizer = workload.fn.train_parts
    params, opt_state, batch = workload.args
    leaves = jax.tree.leaves(batch)
    sizes = {s.shape[_batch_axis(s)] for s in leaves}
    if len(sizes) != 1 or next(iter(sizes)) % k:
        raise WorkloadError(
            f"{workload.name}: {k} microbatches do not divide the batch "
            f"({', '.join(str(n) for n in sorted(sizes))} along the batch axes)"
        )
    b = next(iter(sizes))

    def cut(s: Any) -> Any:  # [.., B, ..] -> [B/k, .., ..] one microbatch's shape
        a = _batch_axis(s)
        shape = tuple(n // k if i == a else n for i, n in enumerate(s.shape))
        dims = getattr(s, "dims", None)
        return spec(shape, dims, s.dtype) if dims else jax.ShapeDtypeStruct(shape, s.dtype)

    def grad_fn(params, batch):
        return jax.value_and_grad(loss_fn)(params, batch)

    # the parameters are state, not data: al.remat looks for the layers from the data alone
    grad_wl = Workload(
        grad_fn, (params, jax.tree.map(cut, batch)), name=workload.name, donate_argnums=(0,)
    )
    written = getattr(workload.fn, "remat_policy", None)  # a step al.remat rewrote already
    if remat is None and written and written != "as_written":
        remat = functools.partial(remat_workload, policy=written)
    if remat is not None:
        grad_wl = remat(grad_wl)
    one = grad_wl.fn

    def split(x: Any, a: int) -> Any:  # batch axis a -> [k, B/k, ...]: rows m, k + m, ...
        x = jnp.moveaxis(x, a, 0)
        x = jnp.moveaxis(x.reshape(b // k, k, *x.shape[1:]), 1, 0)
        return jnp.moveaxis(x, 1, a + 1)

    def accumulated_step(params, opt_state, batch):
        specs = jax.tree.leaves(workload.args[2])
        flat, tree = jax.tree.flatten(batch)
        mbs = jax.tree.unflatten(
            tree, [_named(split(x, _batch_axis(s)), s) for x, s in zip(flat, specs, strict=True)]
        )

        def body(carry, mb):
            total, acc = carry
            loss, grads = one(params, mb)
            acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)
            return (total + loss.astype(jnp.float32), acc), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype), params)
        (total, acc), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), mbs)
        grads = jax.tree.map(lambda g: (g / k).astype(g.dtype), acc)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, total / k

    accumulated_step.train_parts = (loss_fn, optimizer)
    accumulated_step.accumulation = k
    tag = (grad_wl.options or {}).get("remat_policy")
    if tag:  # the policy is applied inside: al.apply must not apply it to the whole step again
        accumulated_step.remat_policy = tag
    options = dict(workload.options, **{ACCUMULATION: k})
    if tag:
        options["remat_policy"] = tag
    return Workload(
        accumulated_step, workload.args, donate_argnums=workload.donate_argnums,
        name=f"{workload.name}+accumulate({k})", init=workload.init, options=options,
        init_state=workload.init_state, batches=workload.batches,
    )  # fmt: skip


def _named(x: Any, s: Any) -> Any:
    """The microbatches ``x`` ([k, ...one microbatch]) with the batch spec's dim names, so a
    rule for ``batch`` lays out each microbatch's rows as it does the batch's."""
    dims = getattr(s, "dims", None)
    if not dims or "microbatches" in dims:
        return x
    return name_dims(x, ("microbatches", *dims))


def accumulation_for_plan(plan: Any, workload: Workload) -> Workload:
    """``workload`` with its gradients accumulated as ``plan`` was made (its options'
    ``accumulation``, with its ``remat_policy`` inside each microbatch), unless it already is."""
    opts = getattr(plan, "options", None) or {}
    k = opts.get(ACCUMULATION)
    if not k or getattr(workload.fn, "accumulation", None) == k:
        return workload
    tag = opts.get("remat_policy")
    inner = functools.partial(remat_workload, policy=tag) if tag and tag != "as_written" else None
    return accumulate(workload, k, remat=inner)


def _made(make_batch: Callable, rng: np.random.Generator, specs: Any) -> Any:
    """``make_batch(rng)``, checked against the batch specs; a one-line error naming the
    contract where it raises (a stranger's ``make_batch(step, seed)`` met a Generator)."""
    try:
        made = make_batch(rng)
    except Exception as e:
        name = getattr(make_batch, "__name__", "make_batch")
        raise WorkloadError(
            f"train_workload: {name}(rng) raised {type(e).__name__}: {e}; make_batch takes one "
            "numpy Generator and returns one batch of host arrays"
        ) from e
    return _checked(made, specs)


def _checked(made: Any, specs: Any) -> Any:
    """``made``, or a one-line error where ``make_batch`` returns other shapes than the batch
    specs say."""
    got = jax.tree_util.tree_flatten_with_path(made)[0]
    want = jax.tree.leaves(specs)
    if len(got) != len(want):
        raise WorkloadError(
            f"train_workload: make_batch returned {len(got)} arrays, the batch specs have "
            f"{len(want)}"
        )
    for (path, x), s in zip(got, want, strict=True):
        if tuple(np.shape(x)) != tuple(s.shape):
            raise WorkloadError(
                f"train_workload: make_batch's {jax.tree_util.keystr(path)} has shape "
                f"{tuple(np.shape(x))}, the batch spec says {tuple(s.shape)}"
            )
    return made


def _is_scale(s: Any) -> bool:
    dims = getattr(s, "dims", ())
    return len(s.shape) == 1 or (len(s.shape) == 2 and bool(dims) and dims[0] == "layers")


def init_from_specs_host(specs: Any, rng: np.random.Generator, scale: float = 0.02) -> Any:
    """Real arrays for a pytree of specs, on the host: ones for 1-D scales, scaled normals
    elsewhere (numpy: no per-shape compile, so tiny models start in milliseconds)."""

    def one(s):
        if _is_scale(s):
            return jnp.ones(s.shape, s.dtype)
        return jnp.asarray(scale * rng.standard_normal(s.shape, np.float32), s.dtype)

    return jax.tree.map(one, specs)


def init_from_specs(specs: Any, key: jax.Array, scale: float = 0.02) -> Any:
    """``init_from_specs_host`` on the devices, jittable: ``jax.jit(..., out_shardings=...)``
    makes each device's shard where it lives (nothing is built whole first).

    The normals come from a counter hash of (seed, leaf, element index) — elementwise over an
    iota, so every sharding gives the same numbers and XLA compiles it in milliseconds
    (threefry takes 5-15 s to compile per sharding on the CPU)."""
    seed = jax.random.key_data(key).ravel()[-1].astype(jnp.uint32)
    leaves, treedef = jax.tree.flatten(specs)
    out = [
        jnp.ones(s.shape, s.dtype)
        if _is_scale(s)
        else (scale * _hash_normal(s.shape, seed, k)).astype(s.dtype)
        for k, s in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, out)


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash (murmur3's finaliser)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _hash_normal(shape: tuple[int, ...], seed: jax.Array, stream: int) -> jax.Array:
    """Standard normals (Box-Muller over two hashed uniforms) of the element indices."""
    idx = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for ax in range(len(shape) - 1, -1, -1):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, ax) * jnp.uint32(stride % 2**32)
        stride *= shape[ax]
    base = _mix(seed * jnp.uint32(0x9E3779B1) + jnp.uint32(stream * 0x632BE5AB % 2**32))
    u1 = (_mix(idx * jnp.uint32(2) + base) >> 8).astype(jnp.float32) / 2**24
    u2 = (_mix(idx * jnp.uint32(2) + jnp.uint32(1) + base) >> 8).astype(jnp.float32) / 2**24
    return jnp.sqrt(-2.0 * jnp.log1p(-u1)) * jnp.cos(2.0 * jnp.pi * u2)


def _built(step, args, donate, name, loss_fn, makers, options) -> Workload:
    """The train step's workload, named ``name`` or the loss function's (``loss_fn``) and
    then marked so, for ``load_workload`` to name it after its model file (issue 35)."""
    init, init_state, batches = makers
    wl = Workload(step, args, donate_argnums=donate,
                  name=name or getattr(loss_fn, "__name__", "train_step"), init=init,
                  init_state=init_state, batches=batches, options=options)  # fmt: skip
    if not name:
        object.__setattr__(wl, "name_by_default", True)
    return wl
