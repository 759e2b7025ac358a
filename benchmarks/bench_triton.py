"""Time and memory to a verdict on fla's Triton kernels in Triton's interpreter (no GPU):
vet's default plan (every check, the envelope) of each Triton adapter, as bench_vet.py
measures it (a fresh process each, wall clock, peak resident memory of its tree). Goal: at
most 5 minutes a kernel (the Triton issue), 4 GiB. A verdict either way is a finished run.

    python benchmarks/bench_triton.py [--only NAME ...] [--json PATH]

Some 40 minutes on the 2-core machine: run it with nothing else running.
"""

from __future__ import annotations

import sys

import bench_vet

from linattn_verify.adapters import ADAPTERS

GOAL_SECONDS = 300
RUNS = tuple(
    (name, [*bench_vet.VET, name], GOAL_SECONDS, None)
    for name, adapter in ADAPTERS.items()
    if adapter.triton
)

if __name__ == "__main__":
    sys.exit(bench_vet.main(RUNS, __doc__))
