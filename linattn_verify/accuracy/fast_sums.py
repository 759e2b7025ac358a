"""One head's sums for the a-priori bound (ball_sums.HeadSums) in float64, for long
sequences of kernelised specs, where ball arithmetic is too slow: the same quantities as the
balls', with the sums' own rounding bounded a posteriori (the computed sums of n
non-negative terms are at least (1 - gamma_n) the exact ones: Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5): without a decay from
certified.streamed_sums (_fast_plain), with one from certified_decay.one_sided_sums and
decayed_sums (_fast_decayed); then scaled and over |eps + c D| (_fast_ratios). bound.py's
_fast_sums assembles them per head; within about 1e-9 of the balls', never below.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from ..reference.balls import Head
from ..reference.certified import LIB, SAFETY, U64, depth, gamma64, streamed_sums
from ..reference.certified_decay import FEW_ROUNDINGS, decayed_sums, log_decays, one_sided_sums
from ..specs import RSQRT_D, Spec
from .ball_sums import HeadSums


def _fast_plain(head: Head, spec: Spec, features):
    """(A, F, (D^, a bound on |D^ - D|) or None unnormalised) of a head without a decay,
    unscaled, from certified.streamed_sums: the computed sums of n non-negative terms are
    at least (1 - gamma_n) the exact ones (Higham 2002, Lemma 3.1 and eq. 3.5), n the
    summation depth; D^ errs by its rounding, gamma_n sum |phi^(q)|.|phi^(k)| <= gamma_n A,
    and by the features' errors, sum err_q.(|phi^(k)| + err_k) + |phi(q)|.err_k."""
    q, k, v = head.q, head.k, head.v
    nq, nk = q.shape[0], k.shape[0]
    normalize = spec.normalize

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        f, a, psi = features(q, start, stop)
        both = [f.phi, np.concatenate([f.err, a], 1)] if normalize else []
        return [a, np.concatenate([psi, a], 1), *both]

    def rights(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        f, a, psi = features(k, start, stop)
        ones = np.ones((stop - start, 1))
        mags = np.concatenate([np.abs(v[start:stop]), ones], 1)
        grown = (a + psi) * FEW_ROUNDINGS
        both = [(f.phi, ones), (np.concatenate([a + f.err, f.err], 1), ones)] if normalize else []
        return [(a, mags), (np.concatenate([grown, psi], 1), mags), *both]

    blocks = list(streamed_sums(lefts, rights, nq, nk, spec.causal))
    sums = [np.concatenate([b[2][i] for b in blocks]) for i in range(len(blocks[0][2]))]
    m = spec.info.feature_dim(q.shape[1], None if head.w is None else head.w.shape[0])
    g64 = gamma64(depth(2 * m, nk))
    a, f = (t / (1 - g64) * FEW_ROUNDINGS for t in sums[:2])
    if not normalize:
        return a, f, None
    value, errs = sums[2][:, 0], sums[3][:, 0]
    return a, f, (value, (g64 * a[:, -1] + errs / (1 - g64)) * SAFETY)


def _fast_decayed(head: Head, spec: Spec, features):
    """_fast_plain's (A, F, den) of a decayed head: A and F upper bounds from
    certified_decay.one_sided_sums (F as psi_q.(|phi(k)| + psi_k) + |phi(q)|.psi_k: chains
    of m features, the decay's channels). The denominator: for non-negative features a
    lower bound on D from the same sums of lower bounds on the features, max(phi^ - err,
    0) (radius 0: eps + c D >= eps + c D_low), within about 1e-12 of D however small the
    weights make it; for signed ones D^ and the bound on |D^ - D| of
    certified_decay.decayed_sums (an interval for the exact D, which cancels)."""
    q, k, v = head.q, head.k, head.v
    n = k.shape[0]
    logs, gamma_e = log_decays(head.decay, spec, n)

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        _, a, psi = features(q, start, stop)
        return [a, psi, a]

    def rights(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        _, a, psi = features(k, start, stop)
        mags = np.concatenate([np.abs(v[start:stop]), np.ones((stop - start, 1))], 1)
        return [(a, mags), ((a + psi) * FEW_ROUNDINGS, mags), (psi, mags)]

    def lows(x: np.ndarray, start: int, stop: int) -> np.ndarray:
        f = features(x, start, stop)[0]  # phi^ - err rounded up by at most u: divided
        return np.maximum(f.phi - f.err, 0.0) / FEW_ROUNDINGS

    with threadpool_limits(1, user_api="blas"):  # small matmuls: as streamed_sums
        blocks = list(one_sided_sums(lefts, rights, logs, gamma_e))
        a, f1, f2 = (np.concatenate([b[2][i] for b in blocks]) for i in range(3))
        f = (f1 + f2) * FEW_ROUNDINGS
        if not spec.normalize:
            return a, f, None
        if spec.info.nonnegative_features:
            low = one_sided_sums(
                lambda start, stop: [lows(q, start, stop)],
                lambda start, stop: [(lows(k, start, stop), np.ones((stop - start, 1)))],
                logs,
                gamma_e,
                upper=False,
            )
            value = np.concatenate([sums[0][:, 0] for _, _, sums in low])
            return a, f, (value, np.zeros_like(value))
        parts = list(decayed_sums(q, k, v[:, :0], head.w, head.decay, spec))
    value, radius = (np.concatenate([p[i][:, -1] for p in parts]) for i in (2, 3))
    return a, f, (value, radius)


def _fast_ratios(a, f, den, spec: Spec, d: int, u: float, m: int) -> HeadSums:
    """HeadSums from the unscaled A, F and den = (D^, r) of _fast_plain or _fast_decayed
    (|eps + c D| >= |eps + c D^| - c r), as _arb_sums' end: a scale c (within LIB of
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
