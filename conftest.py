"""Hypothesis profiles: `ci` (derandomised, no deadline) under CI, `thorough` by hand; one
torch thread per pytest-xdist worker."""

import importlib
import os

import torch
from hypothesis import settings

from linattn_verify.checks.search import import_whole_package

# the --impl options (also an installed pytest11 plugin of the same name, loaded once)
pytest_plugins = ("linattn_verify.pytest_plugin",)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # two workers of two threads each on two cores spend a third of their time switching
    torch.set_num_threads(1)

# Hypothesis' default example count (100); `thorough` is 10x that with a database on disk.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Hypothesis draws from the constants of the local modules loaded: load all of ours now, so
# that what a test draws does not depend on the tests that ran before it in its worker
import_whole_package()


def pytest_collection_finish(session) -> None:
    """Keep Hypothesis to the local modules loaded once every test module is (the same in
    every worker): local modules imported later (the kernel files tests write to tmp_path)
    would otherwise join its pool of constants in one worker and not in another, as
    pytest-xdist hands out tests, and the `ci` profile's draws would differ from run to run
    (stop 41's CI drew a case no local run did). The pool is Hypothesis' private API: where
    it moves, this does nothing."""
    providers = importlib.import_module("hypothesis.internal.conjecture.providers")
    if hasattr(providers, "_get_local_constants"):
        frozen = providers._get_local_constants()
        providers._get_local_constants = lambda: frozen
