"""Power laws fitted on a log-log scale: cost ~ c N^slope."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fit:
    """Least-squares line through (log N, log y): slope, and the largest residual as a
    factor (1.1 = some point lies 10% off the fitted power law)."""

    slope: float
    intercept: float
    worst_factor: float


def larger_half(items: Sequence) -> Sequence:
    """The larger-N half of a curve (at least two points): where the asymptotic order shows
    and lower-order terms have faded."""
    return items[min(len(items) // 2, len(items) - 2) :]


def loglog_fit(ns: Sequence[float], ys: Sequence[float]) -> Fit:
    """Fit log y = slope log N + intercept by least squares (natural logs)."""
    if len(set(ns)) < 2:
        raise ValueError(f"a slope needs at least two distinct N, got {list(ns)}")
    x, y = np.log(np.asarray(ns, float)), np.log(np.asarray(ys, float))
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    return Fit(float(slope), float(intercept), float(np.exp(np.abs(residual).max())))
