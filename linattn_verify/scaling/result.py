"""One scaling result per implementation, as the report and vet consume it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .cost import Cost, Implementation, cost_curve
from .growth import GrowthCheck, check_growth
from .timing import TimingCurve, crossover, sdpa, time_curve

SDPA_MAX_N = 16384  # SDPA is O(N^2): beyond this one call takes many seconds on one core


@dataclass
class ScalingResult:
    name: str
    costs: list[Cost]
    growth: GrowthCheck
    timing: TimingCurve | None = None
    sdpa_timing: TimingCurve | None = None
    crossover_vs_sdpa: int | None = None
    figures: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """Plain numbers for JSON."""
        out = {
            "name": self.name,
            "expected": self.growth.expected,
            "flops_slope": self.growth.flops and self.growth.flops.slope,
            "bytes_slope": self.growth.bytes.slope,
            "cost_passed": self.growth.passed,
            "cost_message": self.growth.message,
        }
        if self.timing is not None:
            out.update(
                time_slope=self.timing.fit.slope,
                time_status=self.timing.status,
                time_noise={
                    "max_spread": max(self.timing.spreads),
                    "worst_factor_off_fit": self.timing.fit.worst_factor,
                    "reason": self.timing.reason,
                },
                seconds=dict(zip(self.timing.ns, self.timing.seconds, strict=True)),
                crossover_vs_sdpa=self.crossover_vs_sdpa,
            )
        return out


def scaling_result(
    name: str,
    impl: Implementation,
    expected: str,
    cost_ns: Sequence[int],
    time_ns: Sequence[int] | None = None,
    causal: bool = False,
    repeats: int = 5,
    **inputs,
) -> ScalingResult:
    """Counted cost growth over cost_ns; with time_ns (increasing), timings, their noise
    gate and the crossover N against torch's SDPA of the same causality (timed up to
    SDPA_MAX_N, when at least two of time_ns are that small)."""
    costs = cost_curve(impl, cost_ns, **inputs)
    result = ScalingResult(name, costs, check_growth(costs, expected))
    if time_ns:
        result.timing = time_curve(impl, time_ns, repeats, **inputs)
        common = [n for n in time_ns if n <= SDPA_MAX_N]
        if len(common) >= 2:  # else SDPA is too slow to time at these N: no crossover
            result.sdpa_timing = time_curve(sdpa(causal), common, repeats, **inputs)
            ours = result.timing.seconds[: len(common)]
            result.crossover_vs_sdpa = crossover(common, ours, result.sdpa_timing.seconds)
    return result
