"""One head's sums for the a-priori bound (HeadSums) in arb balls, so that they carry no
rounding error of their own: A (|terms| times |v| columns, then 1) and F (the terms'
errors: the features' psi, feature_errors.py, the decay's eta, decay_errors.py, softmax's
exponent), both over |eps + D|, at the working precision (bound.py runs them at the lowest
that resolves the denominators; fast_sums.py computes the same in float64).

Softmax is a single exponential (m = 1): a_ij = exp(s_ij), s = q.k / sqrt(d), with |ds| <=
gamma_{d + C_LIB + 2} sum_l |q_l k_l| / sqrt(d) + u (|s_ij| + max_j |s_ij|) (the last term:
a stabilising max subtraction), so |da_ij| <= a_ij (e^{|ds|}(1 + gamma_{C_LIB}) - 1)
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flint import arb, arb_mat

from ..families.channel_gates.reference import channel_gated
from ..families.decayed.reference import decay_weights
from ..reference.balls import Head, balls, direct_sims, features, kernel_sums, masked
from ..rounding import C_LIB, gamma
from ..specs import RSQRT_D, Spec
from .decay_errors import _decay_errors
from .feature_errors import _features, _grow, _stabiliser


def _abs(rows: list[list[arb]]) -> list[list[arb]]:
    return [[abs(t) for t in r] for r in rows]


def _add(*mats: list[list[arb]]) -> list[list[arb]]:
    return [[sum(ts, arb(0)) for ts in zip(*rows, strict=True)] for rows in zip(*mats, strict=True)]


@dataclass(frozen=True)
class HeadSums:
    """One head's sums over |eps + D|, as float64 upper bounds (ratios stay in range where
    the sums themselves do not, e^-1e6): A (|terms| with |v| columns, then 1), F (the
    features' errors, same columns); where D + eps is exactly zero; m (features per term)."""

    a: np.ndarray
    f: np.ndarray
    zero: np.ndarray
    m: int


def _arb_sums(head: Head, spec: Spec, u: float, final: bool) -> HeadSums | None:
    """HeadSums in ball arithmetic; None if some denominator is not resolved away from 0,
    unless `final` (the last precision: then its lower end is taken as it is)."""
    name, causal = spec.feature_map, spec.causal
    nq, nk = head.q.shape[0], head.k.shape[0]
    x = balls(np.concatenate([np.abs(head.v), np.ones((nk, 1))], 1))
    if name == "softmax":
        rows = list(range(nq))
        sims = masked(direct_sims(head, rows, name), rows, causal)
        d = head.q.shape[1]
        absdot = arb_mat(balls(np.abs(head.q))) * arb_mat(balls(np.abs(head.k))).transpose()
        s = (arb_mat(balls(head.q)) * arb_mat(balls(head.k)).transpose()) * arb(d).rsqrt()
        g_dot, g_lib = gamma(d + C_LIB + 2, u), gamma(C_LIB, u)
        rel = []
        for i, (ar, sr) in enumerate(zip(absdot.tolist(), s.tolist(), strict=True)):
            big = max(abs(t).upper() for t in (sr[: i + 1] if causal else sr))
            ds = [
                g_dot * a * arb(d).rsqrt() + u * (abs(t) + big) for a, t in zip(ar, sr, strict=True)
            ]
            rel.append([_grow(e.exp() - 1, g_lib) for e in ds])
        f = [[a * r for a, r in zip(ar, rr, strict=True)] for ar, rr in zip(sims, rel, strict=True)]
        xm = arb_mat(x)
        a_sums = (arb_mat(sims) * xm).tolist()
        nd, f, m = a_sums, (arb_mat(f) * xm).tolist(), 1
    else:
        big_m = max(nq, nk)
        stab = _stabiliser(head.q, head.k, head.w, name)
        pq, pk = (features(t, range(len(t)), head, name) for t in (head.q, head.k))
        sq, sk = (
            balls(_features(t, np.arange(len(t)), big_m, head.w, name, u, stab)[2])
            for t in (head.q, head.k)
        )
        aq, ak = _abs(pq), _abs(pk)
        ones = balls(np.ones((nk, 1)))
        sums = kernel_sums if spec.decay is None else _decayed_sums(head, spec)
        nd = sums(pq, pk, ones, causal)
        a_sums = sums(aq, ak, x, causal)
        f = _add(sums(sq, ak, x, causal), sums(aq, sk, x, causal), sums(sq, sk, x, causal))
        if spec.decay is not None:  # each weight's own decay error, relative: (A + F) eta
            f = _add(f, _scaled_rows(_add(a_sums, f), _decay_errors(head, spec, u)))
        m = len(pq[0])
    if spec.scale != 1.0:  # an exact factor, rounded once where a kernel applies it
        d = head.q.shape[1]
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        nd, a_sums = ([[c * t for t in r] for r in rows] for rows in (nd, a_sums))
        f = _add([[c * t for t in r] for r in f], [[u * t for t in r] for r in a_sums])
    if not spec.normalize:  # no denominator: the sums themselves, and no error in a quotient
        zero = np.zeros(nq, dtype=bool)
        a, fs = (_ratios(rows, [arb(1)] * nq) for rows in (a_sums, f))
        a[:, -1], fs[:, -1] = 0.0, 0.0
        return HeadSums(a, fs, zero, m)
    dens = [abs(r[-1] + spec.eps) for r in nd]
    zero = np.array([t.is_zero() for t in dens])
    if not final and not all(z or t > 0 for z, t in zip(zero, dens, strict=True)):
        return None
    return HeadSums(_ratios(a_sums, dens), _ratios(f, dens), zero, m)


def _decayed_sums(head: Head, spec: Spec):
    """kernel_sums with the decay: rows sum_j w_ij (fq_i . fk_j) x_j in the quadratic form,
    w_ij exact (balls.decay_weights)."""
    rows = list(range(head.q.shape[0]))
    if spec.decay == "channel-gates":  # (fq . B)(fk / B)^T, masked (balls.channel_gated)

        def gated(fq, fk, x, causal: bool) -> list[list[arb]]:
            up, down = channel_gated(fq, fk, head)
            sims = masked((arb_mat(up) * arb_mat(down).transpose()).tolist(), rows, True)
            return (arb_mat(sims) * arb_mat(x)).tolist()

        return gated
    weights = decay_weights(head, rows, spec.decay)

    def sums(fq, fk, x, causal: bool) -> list[list[arb]]:
        sims = (arb_mat(fq) * arb_mat(fk).transpose()).tolist()
        decayed = [[s * w for s, w in zip(r, wr, strict=True)] for r, wr in zip(sims, weights)]
        return (arb_mat(decayed) * arb_mat(x)).tolist()

    return sums


def _scaled_rows(rows: list[list[arb]], factors: np.ndarray) -> list[list[arb]]:
    """Each row times its factor (an upper bound, as a ball)."""
    return [[t * arb(float(c)) for t in r] for r, c in zip(rows, factors, strict=True)]


def _ratios(rows: list[list[arb]], dens: list[arb]) -> np.ndarray:
    """Upper bounds on row / den, element by element (inf where den may be 0)."""
    return np.array([[_upper(t / den) for t in r] for r, den in zip(rows, dens, strict=True)])


def _upper(t: arb) -> float:
    return float(t.upper()) if t.is_finite() else math.inf
