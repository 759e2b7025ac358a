"""Statistical decisions with a stated false-failure probability.

Every assertion of the random-feature checks is a test at level ALPHA = 1e-10: a correct
sampler fails it with probability at most ALPHA. A run allows 1e-6 (docs/architecture.md), so it
may make up to 10^4 such assertions (Bonferroni); the CI profile makes a few hundred, the
thorough profile a few thousand.

The tests compare the mean of R independent replicates with its exact expected value through
z = (mean - expected) / sqrt(variance / R), with the replicates' exact variance where it is
known (moments.py: every iid statistic, and the mean of orthogonal rows), else their sample
variance (the orthogonal MSE). The law of z is taken as normal (central limit theorem, R >=
1000 here). With skewed replicates the tail at 6.47 is heavier than normal by about a factor
1 + (g / 6)(z^2 - 1) (Edgeworth; g the skewness of the mean); the regimes next to each check keep
g <= 0.05, a factor below 1.4. A sample variance makes the tail heavier still when the
replicates are skewed (a low mean comes with a low variance), so the orthogonal MSE keeps to
lighter tails (stats/checks.py). tests/test_stats.py checks the calibration at 3 and 4 sd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALPHA = 1e-10
# scipy.stats.norm.isf(ALPHA / 2) and isf(ALPHA), as scipy computes them (tests/test_stats.py
# recomputes them): literals, so that the statistics load scipy only when they run
Z_TWO_SIDED = 6.466951087240516
Z_ONE_SIDED = 6.361340902404056  # "below" tests
ROUNDING = 1e-12  # float64 evaluation of an estimate vs mpmath, when no replicate varies


@dataclass(frozen=True)
class MeanTest:
    """The mean of the replicates against its expected value."""

    mean: float
    expected: float
    se: float  # standard error of the mean
    z: float

    @property
    def consistent(self) -> bool:
        """|z| within the two-sided critical value."""
        return abs(self.z) <= Z_TWO_SIDED

    @property
    def ratio(self) -> float:
        return self.mean / self.expected

    @property
    def relative_se(self) -> float:
        return self.se / abs(self.expected)


def mean_test(samples: np.ndarray, expected: float, variance: float | None = None) -> MeanTest:
    """Test of E[samples] = expected (replicates along the only axis), with the replicates'
    exact variance when given, else their sample variance."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.ndim != 1 or samples.size < 2:
        raise ValueError("mean_test needs a 1-d array of at least two replicates")
    mean = float(samples.mean())
    spread = samples.std(ddof=1) if variance is None else math.sqrt(max(variance, 0.0))
    se = float(spread) / math.sqrt(samples.size)
    if se > 0:
        z = (mean - expected) / se
    else:  # every replicate equal: only float64 rounding may separate mean and expected
        z = 0.0 if abs(mean - expected) <= ROUNDING * abs(expected) else math.inf
    return MeanTest(mean, expected, se, z)


def power(shift: float, se: float, critical: float = Z_TWO_SIDED) -> float:
    """Probability that a mean off by `shift` (standard error `se`) is rejected."""
    import scipy.stats  # deferred: 0.6 s to import, for every vet run

    return float(scipy.stats.norm.sf(critical - abs(shift) / se))


def binomial_critical(trials: int, probability: float) -> int:
    """The smallest count c with P(Binomial(trials, probability) > c) <= ALPHA: more than c
    exceedances is a failure."""
    import scipy.stats  # deferred: 0.6 s to import, for every vet run

    return int(scipy.stats.binom.isf(ALPHA, trials, probability))
