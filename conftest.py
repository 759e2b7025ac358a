"""Hypothesis profiles: `ci` (derandomised, no deadline) under CI, `thorough` by hand."""

import os

from hypothesis import settings

# Hypothesis' default example count (100); `thorough` is 10x that with a database on disk.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))
