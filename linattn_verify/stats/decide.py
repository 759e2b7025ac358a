"""Statistical decisions with a stated false-failure probability.

Every assertion of the random-feature checks is a test at level ALPHA = 1e-10: a correct
sampler fails it with probability at most ALPHA. DESIGN asks for at most 1e-6 per run, so a run
may make up to 10^4 such assertions (Bonferroni); the CI profile makes a few hundred, the
thorough profile a few thousand.

The tests compare the mean of R independent replicates with its exact expected value through
the studentised statistic z = (mean - expected) / (sd / sqrt R). Its law is taken as normal
(central limit theorem, R >= 1000 here); the checks keep to a regime where the replicates'
tails are light enough for that (documented next to each check), and tests/test_stats.py checks
the calibration: under the null, z over many seeds is standard normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

ALPHA = 1e-10
Z_TWO_SIDED = float(scipy.stats.norm.isf(ALPHA / 2))  # 6.47
Z_ONE_SIDED = float(scipy.stats.norm.isf(ALPHA))  # 6.36
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


def mean_test(samples: np.ndarray, expected: float) -> MeanTest:
    """Studentised test of E[samples] = expected (replicates along the only axis)."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.ndim != 1 or samples.size < 2:
        raise ValueError("mean_test needs a 1-d array of at least two replicates")
    mean = float(samples.mean())
    se = float(samples.std(ddof=1)) / math.sqrt(samples.size)
    if se > 0:
        z = (mean - expected) / se
    else:  # every replicate equal: only float64 rounding may separate mean and expected
        z = 0.0 if abs(mean - expected) <= ROUNDING * abs(expected) else math.inf
    return MeanTest(mean, expected, se, z)


def power(shift: float, se: float, critical: float = Z_TWO_SIDED) -> float:
    """Probability that a mean off by `shift` (standard error `se`) is rejected."""
    return float(scipy.stats.norm.sf(critical - abs(shift) / se))


def binomial_critical(trials: int, probability: float) -> int:
    """The smallest count c with P(Binomial(trials, probability) > c) <= ALPHA: more than c
    exceedances is a failure."""
    return int(scipy.stats.binom.isf(ALPHA, trials, probability))
