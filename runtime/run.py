"""``autolayout run``: a plan as a training job.

The state (the donated arguments: parameters and optimizer state) is made where it lives:
``jax.jit(workload.init_state, out_shardings=...)`` builds each device's shard on that
device, so nothing is built whole on one device first. Each step's other arguments (the
batch) come from ``workload.batches(step, seed)`` on the host, the same on every process;
``jax.make_array_from_callback`` hands each process only its own shards. The step is the
plan's ``al.apply`` function with the state donated.

On several processes (``jax.distributed``) the mesh spans every process's devices; call
:func:`init_distributed` before anything touches a device.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from autolayout.core import (
    AutolayoutError,
    HardwareError,
    MeshError,
    Plan,
    PlanError,
    Workload,
    WorkloadError,
    accumulation_for_plan,
    hardware,
    mesh_text,
    partition_spec,
    path_str,
    remat_for_plan,
    trace,
)
from autolayout.cost_models import evaluate

from .apply import apply, check_inputs, make_mesh
from .checkpoint import KEEP, Checkpoints
from .metrics import Metrics, step_size

HEARTBEAT_S = 30  # a process silent this long is dead (JAX's default, 100 s, is past a minute)


class PeerError(AutolayoutError, RuntimeError):
    """A step of a multi-process run failed because another process did (its connection
    closed), and the distributed service did not end this process first."""


@dataclass
class RunResult:
    """What a run measured: the loss and wall time of every step, and the prediction."""

    plan: Plan
    losses: list[float]  # every step's, those before a resumed checkpoint included
    step_times_s: list[float]
    compile_s: float
    predicted_s: float | None  # the plan's layout priced on the local hardware profile
    local_hw: str | None
    notes: list[str] = field(default_factory=list)
    start_step: int = 0  # steps done before this run (a resumed checkpoint's)
    stopped: str | None = None  # "SIGTERM" where a preemption notice ended the run early
    checkpoint: str | None = None  # the newest checkpoint this run saved or resumed from

    @property
    def steps_done(self) -> int:
        return len(self.losses)

    @property
    def measured_s(self) -> float:
        """The median step time of this run's steps, its first (a warm-up) left out when
        there are more."""
        mine = self.step_times_s[self.start_step :] or self.step_times_s
        times = mine[1:] or mine
        return float(np.median(times))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.plan.model,
            "mesh": dict(self.plan.mesh),
            "losses": self.losses,
            "step_times_s": self.step_times_s,
            "measured_step_s": self.measured_s,
            "compile_s": self.compile_s,
            "predicted_step_s": self.predicted_s,
            "local_hardware": self.local_hw,
            "processes": jax.process_count(),
            "start_step": self.start_step,
            "stopped": self.stopped,
            "checkpoint": self.checkpoint,
            "notes": self.notes,
        }


def init_distributed(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    local_devices: int | None = None,
    timeout_s: float = 120.0,
    heartbeat_s: float = HEARTBEAT_S,
    cluster: str | None = None,
) -> None:
    """``jax.distributed.initialize`` for a multi-process run; on CPUs, ``local_devices``
    fake devices per process and collectives through gloo. ``coordinator`` None: from the
    environment of ``cluster`` (SLURM, Open MPI, a TPU pod), as ``initialize()`` with no
    arguments. A process silent for ``heartbeat_s`` is taken for dead by the others.

    When the other processes do not join within ``timeout_s``, the process says so in one
    line on stderr and exits with status 2: JAX's own time-out aborts the whole process from
    C++ (a stack trace, no message a user can act on), so a timer ends it first."""

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU backends only
    if local_devices is not None:
        try:
            jax.config.update("jax_num_cpu_devices", int(local_devices))
        except RuntimeError:
            pass  # set already, before jax started

    def give_up() -> None:
        me = f"process {process_id} of {num_processes}" if process_id is not None else "a process"
        who = (
            f"the {cluster} launcher's other processes" if cluster and coordinator is None
            else "the other processes" if process_id == 0
            else f"the coordinator at {coordinator}"
        )  # fmt: skip
        print(
            f"error: {me}: {who} did not join within "
            f"{timeout_s:g} s; start every process with the same --coordinator and "
            f"--num-processes (each its own --process-id), or wait longer with --join-timeout",
            file=sys.stderr,
            flush=True,
        )
        os._exit(2)

    timer = threading.Timer(timeout_s, give_up)
    timer.daemon = True
    timer.start()
    try:
        jax.distributed.initialize(
            coordinator,
            num_processes=num_processes,
            process_id=process_id,
            initialization_timeout=int(timeout_s) + 60,  # ours fires first
            heartbeat_timeout_seconds=max(1, int(heartbeat_s)),
        )
    finally:
        timer.cancel()


def device_memory_bytes(devices: Sequence[Any]) -> float | None:
    """What one of these devices can hold: the runtime's own limit where it reports one
    (GPUs, TPUs), else the local hardware profile's HBM x headroom (CPUs)."""

    try:
        stats = devices[0].memory_stats() or {}
    except Exception:  # backends without memory statistics
        stats = {}
    if stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    local = local_profile(devices)
    return float(hardware(local).hbm_limit_bytes) if local else None


def check_runnable(plan: Plan, devices: Sequence[Any]) -> None:
    """Refuses a plan that cannot work here, in one line: INFEASIBLE, or predicted to need
    more memory per device than these devices have."""
    gib = 2**30
    need = plan.predicted.get("memory_bytes_per_device", 0.0)
    if plan.status == "INFEASIBLE":
        raise PlanError(
            f"the plan for {plan.model!r} is INFEASIBLE on {plan.hardware}: it needs "
            f"{need / gib:.2f} GiB per device of {plan.predicted.get('memory_limit_bytes', 0) / gib:.2f}"
            " GiB; plan for more devices or a smaller batch, or pass --force to try anyway"
        )
    have = device_memory_bytes(devices)
    if have is not None and need > have:
        raise PlanError(
            f"the plan for {plan.model!r} is predicted to need {need / gib:.2f} GiB per device "
            f"and the devices here hold {have / gib:.2f} GiB; plan for these devices, or pass "
            "--force to try anyway"
        )


def rescale(plan: Plan, n: int) -> tuple[dict[str, int], str]:
    """The plan's mesh shrunk to ``n`` devices, the rules kept: the largest axis divided by
    its smallest prime factor, repeatedly. Returns the mesh and what was done."""
    mesh = dict(plan.mesh)
    total = math.prod(mesh.values())
    if total % n:
        raise MeshError(
            f"--rescale: the plan's {total} devices cannot shrink to {n} ({n} does not divide "
            f"{total})"
        )
    while math.prod(mesh.values()) > n:
        left = math.prod(mesh.values()) // n
        axis = max((a for a in mesh if mesh[a] > 1 and math.gcd(mesh[a], left) > 1),
                   key=lambda a: mesh[a])  # fmt: skip
        g = math.gcd(mesh[axis], left)
        p = next(k for k in range(2, g + 1) if g % k == 0)
        mesh[axis] //= p
    return mesh, (
        f"rescaled the mesh {mesh_text(plan.mesh)} ({total} devices) to {mesh_text(mesh)} "
        f"({n} devices), same rules"
    )


def local_profile(devices: Sequence[Any]) -> str | None:
    """The hardware profile of these devices, if one ships: ``cpu-N``, ``h100-N``, ..."""

    d = devices[0]
    n = len(devices)
    if d.platform == "cpu":
        name = f"cpu-{n}"
    else:
        kind = getattr(d, "device_kind", "").lower()
        fam = next((f for f in ("h200", "h100", "b200", "a100") if f in kind), None)
        if fam is None:
            return None
        name = f"{fam}-80gb-{n}" if fam == "a100" else f"{fam}-{n}"
    try:
        hardware(name)
    except Exception:
        return None
    return name


def _require_init(workload: Workload) -> None:
    if workload.init_state is None or workload.batches is None:
        raise WorkloadError(
            f"workload {workload.name!r} has no init_state/batches: `autolayout run` needs "
            "init_state(key) -> donated arguments and batches(step, seed) -> the others"
        )


def _args_from_state(workload: Workload, state) -> tuple[list[Any], tuple[int, ...]]:
    """The step's argument list with the donated positions filled from ``state``, and the
    other (per-step data) positions."""
    donated = tuple(workload.donate_argnums)
    args: list[Any] = [None] * len(workload.args)
    for i, s in zip(donated, state, strict=True):
        args[i] = s
    return args, tuple(i for i in range(len(workload.args)) if i not in donated)


def _global_array(x: Any, sharding) -> jax.Array:
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def _state_meta(workload: Workload, plan: Plan, seed: int, losses, times) -> dict[str, Any]:
    """What a checkpoint says beside the state: what it is of, and the steps so far."""
    return json.loads(json.dumps({
        "step": len(losses), "model": workload.name, "options": workload.options, "seed": seed,
        "hardware": plan.hardware, "mesh": dict(plan.mesh), "rules": plan.rules(),
        "losses": losses, "step_times_s": times,
    }, default=str))  # fmt: skip


def _check_resumable(meta: dict[str, Any], workload: Workload, seed: int, where: str) -> None:
    """A checkpoint of another model, other options or another seed would train on as if it
    were this run's: refused in one line."""
    options = json.loads(json.dumps(workload.options, default=str))
    if meta.get("model") != workload.name or meta.get("options", options) != options:
        raise PlanError(
            f"checkpoint {where} is of {meta.get('model')!r} with options "
            f"{meta.get('options')}, this run of {workload.name!r} with {options}: resume with "
            "the model and options it was saved with, or give another --checkpoint-dir"
        )
    if meta.get("seed", seed) != seed:
        raise PlanError(
            f"checkpoint {where} was saved by a run with --seed {meta['seed']} (its batches); "
            f"resume with --seed {meta['seed']}"
        )


class _Preemption:
    """Whether a preemption notice (SIGTERM) came: on one process a signal handler; on
    several JAX's preemption service, which tells every process the same step to stop at."""

    def __init__(self) -> None:
        self.signalled = False
        self._old = None
        self.multi = jax.process_count() > 1
        if not self.multi and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signalled = True

    def reached(self, step: int) -> bool:
        """Called by every process after each step (``step`` steps done)."""
        if self.multi:
            try:
                return multihost_utils.reached_preemption_sync_point(step)
            except RuntimeError:  # the preemption service is off (jax config)
                return False
        return self.signalled

    def close(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def _step_failed(e: Exception, heartbeat_s: float) -> PeerError:
    """A step that raised on several processes: most likely a peer died (its connection
    closed). The distributed service ends this process within the heartbeat time-out, and
    its supervisor names the peer; where it does not, this error says what is known."""
    time.sleep(heartbeat_s + 10)
    text = " ".join(str(e).split())[:300]
    return PeerError(
        f"process {jax.process_index()} of {jax.process_count()}: a step failed ({text}); "
        "another process died? restart every process with --resume"
    )


def run(
    plan: Plan,
    workload: Workload,
    *,
    steps: int,
    devices: Sequence[Any] | None = None,
    seed: int = 0,
    rescale_mesh: bool = False,
    on_step: Callable[[int, float, float], None] | None = None,
    force: bool = False,
    checkpoint_dir: str | None = None,
    save_every: int | None = None,
    keep: int = KEEP,
    resume: bool = False,
    metrics: str | None = None,
    tensorboard: str | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> RunResult:
    """Runs ``workload`` laid out as ``plan`` on ``devices`` (default: every device of every
    process) until ``steps`` steps are done. A plan that is INFEASIBLE or predicted not to fit
    in the devices' memory is refused (:class:`PlanError`) unless ``force``.

    ``checkpoint_dir``: the state is saved there (Orbax, each process its shards, in the
    background) every ``save_every`` steps, after the last step, and when a preemption
    notice (SIGTERM) comes, the ``keep`` newest kept; ``resume`` starts from the newest
    checkpoint there (in this plan's layout, whichever plan saved it), else from step 0.
    After a preemption notice every process stops at the same step and the result says
    ``stopped``. ``metrics``: a JSONL file, one line per finished step; ``tensorboard``: a
    folder for TensorBoard's event files (``runtime/metrics.py``)."""

    if steps < 1:
        raise WorkloadError(f"--steps must be at least 1, got {steps}")
    if save_every is not None and save_every < 1:
        raise WorkloadError(f"--save-every must be at least 1, got {save_every}")
    if resume and not checkpoint_dir:
        raise WorkloadError("--resume needs --checkpoint-dir: where the checkpoints are")
    _require_init(workload)
    workload = remat_for_plan(plan, accumulation_for_plan(plan, workload))
    graphs: list[Any] = [plan.graph] if plan.graph is not None else []

    def graph():  # traced once, when first needed
        if not graphs:
            graphs.append(trace(workload))
        return graphs[0]

    devices = list(jax.devices() if devices is None else devices)
    notes: list[str] = []
    flat, treedef = jax.tree_util.tree_flatten_with_path(workload.args)
    paths = [path_str(p, workload.argnames) for p, _ in flat]
    check_inputs(plan, [leaf for _, leaf in flat], paths)
    local = local_profile(devices)
    if plan.devices != len(devices):
        if not rescale_mesh:
            raise MeshError(
                f"the plan was made for {plan.devices} devices ({plan.hardware}) and "
                f"{len(devices)} are here; plan for this machine, or pass --rescale to keep the "
                f"rules and shrink the mesh axes to {len(devices)} devices"
            )
        mesh, note = rescale(plan, len(devices))
        notes.append(note)
        if local is None:
            raise MeshError("--rescale needs a hardware profile for these devices; none ships")
        plan = evaluate(workload, hardware(local), mesh=mesh, rules=plan.rules(), graph=graph())
    if not force:
        check_runnable(plan, devices)
    lead = jax.process_index() == 0  # writes the metrics
    sink = Metrics(metrics if lead else None, tensorboard if lead else None)
    ckpt = Checkpoints(checkpoint_dir, save_every=save_every, keep=keep) if checkpoint_dir else None
    step_fn = apply(plan, workload.fn, devices, workload=workload)
    notes.extend(step_fn.notes)
    mesh = make_mesh(plan, devices)
    shardings = [NamedSharding(mesh, partition_spec(i["layout"])) for i in plan.inputs]
    tree = jax.tree_util.tree_unflatten(treedef, shardings)
    donated = tuple(workload.donate_argnums)
    state_out = tuple(tree[i] for i in donated)
    losses: list[float] = []
    times: list[float] = []
    start = ckpt.latest() if ckpt is not None and resume else None
    if start is not None:
        assert ckpt is not None
        meta = ckpt.meta(start)
        _check_resumable(meta, workload, seed, ckpt.path(start))
        target = tuple(
            jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                         workload.args[i], tree[i])
            for i in donated
        )  # fmt: skip
        state = ckpt.restore(start, target)
        losses, times = list(meta["losses"])[:start], list(meta["step_times_s"])[:start]
        same = meta.get("mesh") == dict(plan.mesh) and meta.get("rules") == json.loads(
            json.dumps(plan.rules())
        )
        moved = (
            ""
            if same
            else (
                f", saved with mesh {mesh_text(meta.get('mesh', {}))} on {meta.get('hardware')}, "
                f"restored into mesh {mesh_text(plan.mesh)} and this plan's layout"
            )
        )
        notes.append(f"resumed from {ckpt.path(start)} (step {start}{moved})")
    else:
        if resume:
            notes.append(f"no checkpoint in {checkpoint_dir} yet: started at step 0")
        state = jax.jit(workload.init_state, out_shardings=state_out)(jax.random.key(seed))
        start = 0
    if start >= steps:
        raise WorkloadError(
            f"the checkpoint is at step {start} and --steps is {steps}: nothing to run; give "
            f"--steps above {start} to train on"
        )
    args, others = _args_from_state(workload, state)

    def feed(step: int) -> None:
        data = workload.batches(step, seed)
        for i, x in zip(others, data, strict=True):
            args[i] = jax.tree.map(_global_array, x, tree[i])
        return data

    predicted, predicted_mfu = None, None
    if local is not None:
        if local == plan.hardware:
            predicted, predicted_mfu = plan.predicted["step_time_s"], plan.predicted.get("mfu")
        else:
            try:
                here = evaluate(workload, hardware(local), mesh=plan.mesh, rules=plan.rules(),
                                graph=graph())  # fmt: skip
            except HardwareError as e:  # a step the local profile cannot price (host moves)
                notes.append(f"not predicted on {local}: {e}")
            else:
                predicted, predicted_mfu = here.predicted["step_time_s"], here.predicted.get("mfu")
                notes.append(
                    f"predicted on {local} for the plan's rules (the plan is for {plan.hardware})"
                )
    unit, per_step = step_size(feed(start))
    t0 = time.perf_counter()
    compiled = step_fn.lower(*args).compile()
    compile_s = time.perf_counter() - t0
    sink.start(start)
    preempt = _Preemption()
    stopped = None
    try:
        for step in range(start, steps):
            if step > start:
                feed(step)
            t = time.perf_counter()
            out = compiled(*args)
            loss_leaf = out[-1] if isinstance(out, (tuple, list)) else out
            loss = float(np.asarray(loss_leaf.addressable_shards[0].data))
            dt = time.perf_counter() - t
            for i, s in zip(donated, out, strict=False):
                args[i] = s
            losses.append(loss)
            times.append(dt)
            done = step + 1
            sink.write({
                "step": done, "loss": loss, "step_time_s": dt, f"{unit}_per_s": per_step / dt,
                "mfu": predicted_mfu * predicted / dt if predicted_mfu and predicted else None,
                "predicted_mfu": predicted_mfu, "predicted_step_time_s": predicted,
                "time": time.time(),
            })  # fmt: skip
            if on_step:
                on_step(step, loss, dt)
            last = done == steps
            if preempt.reached(done) and not last:
                stopped = "SIGTERM"
            if ckpt is not None and (last or stopped or ckpt.due(done)):
                state_now = tuple(args[i] for i in donated)
                ckpt.save(done, state_now, _state_meta(workload, plan, seed, losses, times))
            if stopped:
                break
    except Exception as e:  # on several processes: a step or a save that a dead peer failed
        if jax.process_count() > 1 and not isinstance(e, AutolayoutError):
            raise _step_failed(e, heartbeat_s) from None
        raise
    finally:
        preempt.close()
        sink.close()
        if ckpt is not None:
            ckpt.close()  # every save written
    return RunResult(
        plan, losses, times, compile_s, predicted, local, notes, start_step=start,
        stopped=stopped, checkpoint=ckpt.path(ckpt.last_saved) if ckpt else None,
    )  # fmt: skip


def reference_losses(workload: Workload, *, steps: int, seed: int = 0) -> list[float]:
    """The same steps through plain ``jax.jit(workload.fn)`` on one device: the losses a
    laid-out run must reproduce."""
    _require_init(workload)
    dev = jax.local_devices()[0]
    state = jax.jit(workload.init_state)(jax.random.key(seed))
    donated = tuple(workload.donate_argnums)
    fn = jax.jit(workload.fn, donate_argnums=donated)
    args, others = _args_from_state(workload, state)
    losses = []
    for step in range(steps):
        data = workload.batches(step, seed)
        for i, x in zip(others, data, strict=True):
            args[i] = jax.device_put(jax.tree.map(np.asarray, x), dev)
        out = fn(*args)
        for i, s in zip(donated, out, strict=False):
            args[i] = s
        losses.append(float(out[-1]))
    return losses
