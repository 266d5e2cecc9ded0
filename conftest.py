"""Repo-wide pytest set-up: JAX gets 8 CPU devices before anything imports it (the tests
and the doctests in autolayout/ both run under it)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
