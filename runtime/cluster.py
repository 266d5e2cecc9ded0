"""A multi-process run on a cluster: started from the cluster's environment, and watched.

**Start-up.** On SLURM (``srun``), Open MPI (``mpirun``) and a Cloud TPU pod, every process
learns the coordinator, the process count and its own index from its environment, as
``jax.distributed.initialize()`` with no arguments does; :func:`detect_cluster` says which
cluster launched this process (None for a lone process, which needs no start-up).

**Failures.** JAX's distributed service ends every process when one stops answering: a C++
abort (SIGABRT, a stack of frames and no line a user can act on), right away when the
coordinator (process 0) dies, after the heartbeat time-out when another one does. Nothing in
the process itself can catch that abort, so :func:`supervise` runs the process as a child,
passes its output through, forwards the signals a scheduler sends (SIGTERM for a preemption
notice, which JAX's preemption service then announces to every process), and where the child
ends by that abort, says in one line which process stopped answering and where the last
checkpoint is, and exits 1, the service's log lines and frames left out."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

SUPERVISED = "AUTOLAYOUT_SUPERVISED"  # set in the child: it runs the job, not another child
FATAL = "JAX distributed service detected fatal errors"
# the distributed runtime's own log lines: 'E1206 05:33:59.822925   30201 file.cc:1549] ...'
_CPP_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ (\S+):\d+\]")
_RUNTIME_FILES = ("coordination", "client.h", "preemption", "distributed")
_OURS = ("error:", "note:", "warning:", "autolayout", "[process", "step ")


def detect_cluster(env: dict[str, str] | None = None) -> str | None:
    """The cluster whose launcher started this process with others (``"SLURM"``, ``"Open
    MPI"``, ``"TPU pod"``), as ``jax.distributed.initialize()`` detects it; None when it
    runs alone (one SLURM task, a plain shell).

    Example:
      >>> detect_cluster({"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "2",
      ...                 "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
      'SLURM'
    """
    env = os.environ if env is None else env

    def many(key: str) -> bool:
        try:
            return int(env.get(key, "1")) > 1
        except ValueError:
            return False

    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
             "SLURM_LOCALID")  # fmt: skip
    if all(k in env for k in slurm) and many("SLURM_NTASKS"):
        return "SLURM"
    if "OMPI_MCA_orte_hnp_uri" in env and many("OMPI_COMM_WORLD_SIZE"):
        return "Open MPI"
    hosts = env.get("TPU_WORKER_HOSTNAMES") or env.get("TPU_PROCESS_ADDRESSES") or ""
    if len([h for h in hosts.split(",") if h]) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
        return "TPU pod"
    return None


def cluster_identity(env: dict[str, str] | None = None) -> tuple[int | None, int | None]:
    """(this process's index, the process count) as the launcher's environment states them,
    None where it does not (a TPU pod's come from its metadata server)."""
    env = os.environ if env is None else env
    for index, count in (("SLURM_PROCID", "SLURM_NTASKS"),
                         ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                         ("TPU_WORKER_ID", None)):  # fmt: skip
        if index in env:
            try:
                return int(env[index]), (int(env[count]) if count and count in env else None)
            except ValueError:
                return None, None
    return None, None


def latest_checkpoint(directory: str | Path | None) -> str:
    """The newest complete checkpoint in ``directory`` (Orbax names them by step and writes
    into a temporary name first), or ``"none"``."""
    if not directory or not Path(directory).is_dir():
        return "none"
    steps = [int(p.name) for p in Path(directory).iterdir() if p.is_dir() and p.name.isdigit()]
    return str(Path(directory).absolute() / str(max(steps))) if steps else "none"


def dead_peers(log: Sequence[str]) -> tuple[list[int], bool]:
    """From the distributed service's fatal log lines: the processes that stopped sending
    heartbeats, and whether the coordinator (process 0) itself was lost."""
    text = "\n".join(log)
    peers: list[int] = []
    m = re.search(r"stopped sending heartbeats\):\s*\n?([\d,\s]+)", text)
    if m:
        peers = sorted({int(x) for x in re.findall(r"\d+", m.group(1).split("\n")[0])})
    leader = "leader task" in text or "Failed to send RPC to coordination service" in text
    return peers, leader


def failure_line(log: Sequence[str], me: int | None, count: int | None,
                 checkpoint_dir: str | Path | None, heartbeat_s: float) -> str:  # fmt: skip
    """The one line a process prints where the distributed service ended it."""
    peers, leader = dead_peers(log)
    who = f"process {me} of {count}" if me is not None and count else "this process"
    if leader and not peers:
        what = "process 0 (the coordinator) stopped answering"
    elif peers:
        names = ", ".join(map(str, peers))
        what = (f"process {names} stopped answering (no heartbeat for {heartbeat_s:g} s)"
                if len(peers) == 1 else f"processes {names} stopped answering")  # fmt: skip
    else:
        what = "the JAX distributed service ended the job (another process failed)"
    return (
        f"error: {who}: {what}; last checkpoint: {latest_checkpoint(checkpoint_dir)}; "
        "restart every process with --resume"
    )


def _die_with_parent() -> None:
    """In the child, before it starts: killed (SIGKILL) when its supervisor dies, so a
    process killed by a scheduler or by hand takes its job with it (Linux's prctl)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def supervise(argv: Sequence[str], *, checkpoint_dir: str | Path | None, heartbeat_s: float,
              identity: tuple[int | None, int | None]) -> int:  # fmt: skip
    """Runs ``python -m autolayout._cli ARGV`` as a child and returns its exit status; see the
    module's text. ``identity``: (this process's index, the process count) for the line."""
    env = dict(os.environ, **{SUPERVISED: "1"})
    child = subprocess.Popen(
        [sys.executable, "-m", "autolayout._cli", *argv],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        bufsize=1,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads run yet in this process
    )
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    old = {}
    for sig in forwarded:
        try:
            old[sig] = signal.signal(sig, lambda s, _f: child.send_signal(s))
        except (ValueError, OSError):  # not the main thread, or a signal this OS lacks
            pass
    held: list[str] = []  # the service's fatal lines: read, never shown

    def pump() -> None:
        noise = False
        assert child.stderr is not None
        for line in child.stderr:
            m = _CPP_LOG.match(line)
            if m:
                noise = any(f in m.group(1) for f in _RUNTIME_FILES)
            elif noise and line.startswith(_OURS):
                noise = False
            frame = re.match(r"\s+@\s+0x", line) or "Check failure stack trace" in line
            if noise or frame or FATAL in line:
                held.append(line.rstrip("\n"))
                continue
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    reader.join(timeout=5)
    if rc < 0 and any(FATAL in line for line in held):
        print(failure_line(held, *identity, checkpoint_dir, heartbeat_s), file=sys.stderr,
              flush=True)  # fmt: skip
        return 1
    if rc < 0:
        name = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        tail = " ".join(held[-3:])[:300]
        print(f"error: the run ended by {name}{': ' + tail if tail else ''}; last checkpoint: "
              f"{latest_checkpoint(checkpoint_dir)}", file=sys.stderr, flush=True)  # fmt: skip
        return 128 - rc
    return rc
