"""Hypothesis profiles: `ci` (derandomised, no deadline) under CI, `thorough` by hand; one
torch thread per pytest-xdist worker."""

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
