"""Repo-wide pytest set-up: JAX gets 8 CPU devices before anything imports it (the tests
and the doctests in autolayout/ both run under it)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# plans are budgeted in work (the same plan at any load); their wall-clock safety stop waits
# ten time limits here, so that a busy CI machine does not cut a plan a test checks
# (tests/test_clock.py checks the stop at its default)
os.environ.setdefault("AUTOLAYOUT_WALL_SLACK", "10")

# pytest-xdist's workers (.ci/run: -n 2) start with SIGINT ignored, and every process they
# start inherits that: the interrupt tests need a process as a user's shell starts it
import signal  # noqa: E402

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
