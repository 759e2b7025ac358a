"""Statistical checks of random-feature estimators: each takes projections drawn by the sampler
under test (R replicates of an (m, d) matrix) and returns a CheckResult whose figures carry the
measured ratio to theory, the z statistic and the false-failure probability (decide.py).

Regimes (where the statements hold and the normal approximation of decide.py is good):
|x + y| <= 1.5 for the positive and hyperbolic estimators (one row's term is log-normal with
log-sd |x + y|), |x - y| <= 2 and |x|, |y| <= 1.5 for trig (bounded terms), R >= 1000.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats

from ..checks.core import CheckResult
from .decide import ALPHA, Z_TWO_SIDED, MeanTest, mean_test
from .estimators import kernel_estimates
from .moments import mse_iid, mse_orthogonal, softmax_kernel


@dataclass(frozen=True)
class Pair:
    """The two inputs of a kernel estimate, already scaled (x' = x d^(-1/4)); label names a
    designed pair in messages instead of its entries."""

    x: np.ndarray
    y: np.ndarray
    label: str = ""

    def __str__(self) -> str:
        if self.label:
            plus, minus = np.linalg.norm(self.x + self.y), np.linalg.norm(self.x - self.y)
            return f"{self.label} (d={len(self.x)}, |x+y|={plus:.3g}, |x-y|={minus:.3g})"
        fmt = {"float_kind": lambda t: f"{t:.4g}"}
        x, y = (np.array2string(a, formatter=fmt, max_line_width=10**6) for a in (self.x, self.y))
        return f"x={x}, y={y}"


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


def unbiasedness(kind: str, pair: Pair, w: np.ndarray) -> CheckResult:
    """E K_hat(x, y) = exp(x.y): the mean over replicates within Z_TWO_SIDED standard errors
    of the exact value (mpmath). A sampler whose rows are not N(0, I_d) shifts the mean."""
    test = mean_test(kernel_estimates(kind, pair.x, pair.y, w), softmax_kernel(pair.x, pair.y))
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
    (as derived in moments.py): consistent within Z_TWO_SIDED standard errors."""
    m = w.shape[1]
    test = mean_test(_squared_errors(kind, pair, w), mse_iid(kind, pair.x, pair.y, m))
    return CheckResult(
        "mse-formula",
        test.consistent,
        f"{kind}: empirical MSE / Lemma 2 = {test.ratio:.4f} (z = {test.z:+.2f}, allowed "
        f"|z| <= {Z_TWO_SIDED:.2f}) over {w.shape[0]} replicates of m = {m} at {pair}",
        figures=_figures(test, w, theory=test.expected),
    )


def orthogonal_mse(kind: str, pair: Pair, w: np.ndarray) -> CheckResult:
    """Orthogonal rows with chi(d) norms: the empirical MSE matches the exact orthogonal MSE
    (moments.py) and lies below the iid formula. The second part fails a correct sampler
    with probability false_failure = P(N(0,1) > (iid - orthogonal) / se), in the figures;
    the regime of the properties keeps it below ALPHA."""
    m = w.shape[1]
    theory = mse_orthogonal(kind, pair.x, pair.y, m)
    iid = mse_iid(kind, pair.x, pair.y, m)
    test = mean_test(_squared_errors(kind, pair, w), theory)
    below = test.mean < iid
    gap = (iid - theory) / test.se
    verdict = "below" if below else "NOT below"
    return CheckResult(
        "orthogonal-mse",
        test.consistent and below,
        f"{kind}: empirical MSE / orthogonal theory = {test.ratio:.4f} (z = {test.z:+.2f}, "
        f"allowed |z| <= {Z_TWO_SIDED:.2f}); {verdict} the iid MSE (ratio "
        f"{test.mean / iid:.4f}, theory {theory / iid:.4f}) over {w.shape[0]} replicates of "
        f"m = {m} at {pair}",
        figures=_figures(
            test,
            w,
            theory=theory,
            iid=iid,
            ratio_to_iid=test.mean / iid,
            false_failure=float(scipy.stats.norm.sf(gap)) if math.isfinite(gap) else 0.0,
        ),
    )
