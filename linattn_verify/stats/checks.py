"""Statistical checks of random-feature estimators: each takes projections drawn by the sampler
under test (R replicates of an (m, d) matrix) and returns a CheckResult whose figures carry the
measured ratio to theory, the z statistic and the false-failure probability (decide.py).

Regimes (where the statements hold and the normal approximation of decide.py is good, R >=
1000): for the positive and hyperbolic estimators one row's term is log-normal with log-sd
|x + y|; |x + y| <= 1 with m >= 16 keeps the skewness of a mean of 2048 replicates below 0.05.
The trig terms are bounded (|x - y| <= 2). The orthogonal MSE keeps to |x + y| <= 0.9, m >= 2d
>= 32 (positive) and |x + y| <= 0.8, m = 2d >= 32 (hyperbolic; at d = m = 8, |x + y| = 1 its
mean squared error had a right tail of 7 sd in 600 runs, against 0.8 sd here).
"""

from __future__ import annotations

import math

import numpy as np

from ..cases import Pair
from ..results import CheckResult
from .decide import ALPHA, Z_ONE_SIDED, Z_TWO_SIDED, MeanTest, mean_test
from .estimators import kernel_estimates
from .moments import mse_iid, mse_orthogonal, softmax_kernel, squared_error_variance


def _figures(test: MeanTest, w: np.ndarray, **extra: float) -> dict[str, float]:
    replicates, m, _ = w.shape
    return {
        "ratio": test.ratio,
        "z": test.z,
        "relative_se": test.relative_se,
        "replicates": replicates,
        "m": m,
        "alpha": ALPHA,
        **extra,
    }


def unbiasedness(kind: str, pair: Pair, w: np.ndarray, claim: str = "iid") -> CheckResult:
    """E K_hat(x, y) = exp(x.y): the mean over replicates within Z_TWO_SIDED standard errors
    of the exact value (mpmath), the variance that of the claimed rows (iid or orthogonal).
    A sampler whose rows are not N(0, I_d) shifts the mean."""
    m = w.shape[1]
    mse = mse_orthogonal if claim == "orthogonal" else mse_iid
    expected = softmax_kernel(pair.x, pair.y)
    variance = mse(kind, pair.x, pair.y, m)
    test = mean_test(kernel_estimates(kind, pair.x, pair.y, w), expected, variance)
    return CheckResult(
        "unbiasedness",
        test.consistent,
        f"{kind}: mean K_hat / exp(x.y) = {test.ratio:.5f} (z = {test.z:+.2f}, allowed "
        f"|z| <= {Z_TWO_SIDED:.2f}) over {w.shape[0]} replicates of m = {w.shape[1]} at {pair}",
        figures=_figures(test, w),
    )


def _squared_errors(kind: str, pair: Pair, w: np.ndarray) -> np.ndarray:
    return (kernel_estimates(kind, pair.x, pair.y, w) - softmax_kernel(pair.x, pair.y)) ** 2


def mse_formula(kind: str, pair: Pair, w: np.ndarray) -> CheckResult:
    """The empirical MSE of K_hat with iid rows against Lemma 2 of Choromanski et al. 2021
    (as derived in moments.py): consistent within Z_TWO_SIDED standard errors, the exact
    variance of the squared error from the first four moments."""
    m = w.shape[1]
    variance = squared_error_variance(kind, pair.x, pair.y, m)
    test = mean_test(_squared_errors(kind, pair, w), mse_iid(kind, pair.x, pair.y, m), variance)
    return CheckResult(
        "mse-formula",
        test.consistent,
        f"{kind}: empirical MSE / Lemma 2 = {test.ratio:.4f} (z = {test.z:+.2f}, allowed "
        f"|z| <= {Z_TWO_SIDED:.2f}) over {w.shape[0]} replicates of m = {m} at {pair}",
        figures=_figures(test, w, theory=test.expected),
    )


# The standard error of the orthogonal squared error over the iid one: at most 1.06 in our
# measurements (positive, d = m = 4, |x + y| = 1; below 1 for d >= 8 and for hyperbolic and
# trig), bounded here with a margin.
SE_RATIO_BOUND = 1.25


def below_iid_applies(kind: str, pair: Pair, m: int, replicates: int) -> bool:
    """Whether "below the iid MSE" is asserted: the exact gap is at least Z_ONE_SIDED
    standard errors of the orthogonal rows, taken as SE_RATIO_BOUND times the exact iid
    ones, so that a correct sampler lands above with probability <= ALPHA. Without it (d = 1,
    m = 1, small gains) a correct sampler would land above the iid MSE by chance."""
    gap = mse_iid(kind, pair.x, pair.y, m) - mse_orthogonal(kind, pair.x, pair.y, m)
    se = math.sqrt(squared_error_variance(kind, pair.x, pair.y, m) / replicates)
    return gap >= Z_ONE_SIDED * SE_RATIO_BOUND * se


def orthogonal_mse(kind: str, pair: Pair, w: np.ndarray) -> CheckResult:
    """Orthogonal rows with chi(d) norms: where below_iid_applies, the empirical MSE lies
    below the iid MSE; for trig it also matches the exact orthogonal MSE (moments.py), the
    variance of the squared error taken as SE_RATIO_BOUND^2 times the exact iid one. For the
    log-normal kinds the match is reported, not asserted: their squared errors leave the
    mean a right tail several times heavier than normal at 3-5 sd (measured over 300-600
    runs), so a level of 1e-10 is not established there."""
    replicates, m, _ = w.shape
    theory = mse_orthogonal(kind, pair.x, pair.y, m)
    iid = mse_iid(kind, pair.x, pair.y, m)
    variance = SE_RATIO_BOUND**2 * squared_error_variance(kind, pair.x, pair.y, m)
    test = mean_test(_squared_errors(kind, pair, w), theory, variance)
    applies = below_iid_applies(kind, pair, m, replicates)
    below = test.mean < iid
    if applies:
        verdict = "below" if below else "NOT below"
    else:
        verdict = "not asserted (gain too small for the replicates) against"
    matches = test.consistent or kind != "performer-trig"
    return CheckResult(
        "orthogonal-mse",
        matches and (below or not applies),
        f"{kind}: empirical MSE / orthogonal theory = {test.ratio:.4f} (z = {test.z:+.2f}, "
        f"allowed |z| <= {Z_TWO_SIDED:.2f}); {verdict} the iid MSE (ratio "
        f"{test.mean / iid:.4f}, theory {theory / iid:.4f}) over {replicates} replicates of "
        f"m = {m} at {pair}",
        figures=_figures(test, w, theory=theory, iid=iid, ratio_to_iid=test.mean / iid),
    )
