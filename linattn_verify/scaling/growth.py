"""Is the cost of an implementation linear in N? Checks on counted FLOPs and bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .cost import Cost
from .fit import Fit, larger_half, loglog_fit

# Counted costs are exact, so a linear algorithm's FLOP slope is 1 up to lower-order terms
# (a constant-size state, the projection W); over N = 2^8 ... 2^16 those move it by far less
# than 0.05, while N log N would show as about 1.1 and N^2 as 2.
SLOPE_TOLERANCE = 0.05
EXPECTED_SLOPE = {"linear": 1.0, "quadratic": 2.0}


@dataclass(frozen=True)
class GrowthCheck:
    expected: str  # "linear" or "quadratic"
    flops: Fit | None  # None: no operation FlopCounterMode counts (e.g. cumsum only)
    bytes: Fit
    passed: bool
    message: str


def check_growth(curve: Sequence[Cost], expected: str) -> GrowthCheck:
    """Over the larger half of the N measured, FLOPs must grow with slope
    EXPECTED_SLOPE[expected] +- SLOPE_TOLERANCE (a Performer's projection W x costs N m d,
    which still bends the quadratic form's slope to 1.93 over N = 2^8 ... 2^12). The peak
    bytes must grow no faster than that order (slope <= 1 + SLOPE_TOLERANCE for a linear
    form): a form that works in blocks holds a constant working set beside its O(N) output,
    so its slope is below 1, and that is the point of it. FlopCounterMode counts matmul-like
    operations only: an implementation without any (cumsum and elementwise products) is
    judged by its bytes alone, and the message says so."""
    top = larger_half(curve)
    ns = [c.n for c in top]
    counted = all(c.flops > 0 for c in top)
    flops = loglog_fit(ns, [c.flops for c in top]) if counted else None
    memory = loglog_fit(ns, [c.peak_bytes for c in top])
    target = EXPECTED_SLOPE[expected]
    problems = []
    if flops is not None and abs(flops.slope - target) > SLOPE_TOLERANCE:
        problems.append(f"FLOPs grow as N^{flops.slope:.2f}, expected N^{target:g}")
    if memory.slope > target + SLOPE_TOLERANCE:
        problems.append(f"peak bytes grow as N^{memory.slope:.2f}, faster than N^{target:g}")
    counted_flops = "no FLOPs counted (no matmul-like op)"
    if flops is not None:
        counted_flops = f"FLOPs ~ N^{flops.slope:.3f}"
    figures = f"{counted_flops}, peak bytes ~ N^{memory.slope:.3f} over N={ns[0]}..{ns[-1]}"
    message = figures + ("; " + "; ".join(problems) if problems else "")
    return GrowthCheck(expected, flops, memory, not problems, message)
