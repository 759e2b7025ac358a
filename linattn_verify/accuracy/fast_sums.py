"""One head's sums for the a-priori bound (ball_sums.HeadSums) in float64, for long
sequences, where ball arithmetic is too slow: the same quantities as the balls', with the
sums' own rounding bounded a posteriori (the computed sums of n non-negative terms are at
least (1 - gamma_n) the exact ones: Higham, "Accuracy and Stability of Numerical
Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5), unscaled from the family
(Family.sums_bound.fast: kernelised attention's and the decays'), then scaled and over
|eps + c D| (_fast_ratios). bound.py's _fast_sums assembles them per head; within about
1e-9 of the balls', never below.
"""

from __future__ import annotations

import numpy as np

from ..reference.certified import LIB, SAFETY, U64
from ..reference.certified_decay import FEW_ROUNDINGS
from ..specs import RSQRT_D, Spec
from .ball_sums import HeadSums


def _fast_ratios(a, f, den, spec: Spec, d: int, u: float, m: int) -> HeadSums:
    """HeadSums from the unscaled A, F and den = (D^, r) of Family.sums_bound.fast (|eps +
    c D| >= |eps + c D^| - c r), as _arb_sums' end: a scale c (within LIB of
    1/sqrt(d) for RSQRT_D: certified._finish), A and F times it and u c A added to F;
    unnormalised the sums themselves, the last column 0; normalised over a lower bound on
    |eps + c D|: |eps + c^ D^| less c r, |c - c^| |D^| and the two roundings of eps + c^ D^."""
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    if spec.scale != 1.0:
        with np.errstate(invalid="ignore", over="ignore"):
            a = a * (c * (1 + c_rel) * FEW_ROUNDINGS)
            f = (f * (c * (1 + c_rel)) + u * a) * FEW_ROUNDINGS
    if den is None:
        a[:, -1], f[:, -1] = 0.0, 0.0
        return HeadSums(a, f, np.zeros(a.shape[0], dtype=bool), m)
    value, radius = den
    scaled = c * value
    mid = scaled + spec.eps
    with np.errstate(invalid="ignore", over="ignore"):
        slack = c * ((1 + c_rel) * radius + c_rel * np.abs(value))
        low = np.abs(mid) - (slack + 2 * U64 * (np.abs(scaled) + np.abs(mid))) * SAFETY
    zero = (mid == 0) & (a[:, -1] == 0)  # every term exactly 0, and eps
    resolved = (low > 0)[:, None]  # else inf, as arb's quotient by a ball around 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        over = FEW_ROUNDINGS / low[:, None]
        a, f = (np.where(resolved, t * over, np.inf) for t in (a, f))
    return HeadSums(a, f, zero, m)
