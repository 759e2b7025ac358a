"""Wall-clock timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    """Median wall time of `repeats` calls of fn, after one untimed call if `warmup`."""
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
