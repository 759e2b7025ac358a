"""Cost growth: counted FLOPs and bytes (exact), wall time with a noise gate, plots."""

from .cost import Cost, PeakLiveBytes, attention_inputs, cost_curve, measure_cost
from .fit import Fit, loglog_fit
from .growth import SLOPE_TOLERANCE, GrowthCheck, check_growth
from .plot import plot_scaling
from .result import ScalingResult, scaling_result
from .timing import (
    RESIDUAL_LIMIT,
    SPREAD_LIMIT,
    TimingCurve,
    crossover,
    judge_timings,
    sdpa,
    time_curve,
)

__all__ = [
    "RESIDUAL_LIMIT",
    "SLOPE_TOLERANCE",
    "SPREAD_LIMIT",
    "Cost",
    "Fit",
    "GrowthCheck",
    "PeakLiveBytes",
    "ScalingResult",
    "TimingCurve",
    "attention_inputs",
    "check_growth",
    "cost_curve",
    "crossover",
    "judge_timings",
    "loglog_fit",
    "measure_cost",
    "plot_scaling",
    "scaling_result",
    "sdpa",
    "time_curve",
]
