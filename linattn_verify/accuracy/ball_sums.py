"""One head's sums for the a-priori bound (HeadSums) in arb balls, so that they carry no
rounding error of their own: A (|terms| times |v| columns, then 1) and F (the terms'
errors: the family's, Family.sums_bound.balls, e.g. the features' psi and a decay's eta),
both over |eps + D|, at the working precision (bound.py runs them at the lowest that
resolves the denominators; fast_sums.py computes the same in float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flint import arb

from ..families import family_of
from ..reference.balls import Head, balls
from ..specs import RSQRT_D, Spec


@dataclass(frozen=True)
class HeadSums:
    """One head's sums over |eps + D|, as float64 upper bounds (ratios stay in range where
    the sums themselves do not, e^-1e6): A (|terms| with |v| columns, then 1), F (the
    terms' errors, same columns); where D + eps is exactly zero; m (features per term)."""

    a: np.ndarray
    f: np.ndarray
    zero: np.ndarray
    m: int


def _arb_sums(head: Head, spec: Spec, u: float, final: bool) -> HeadSums | None:
    """HeadSums in ball arithmetic; None if some denominator is not resolved away from 0,
    unless `final` (the last precision: then its lower end is taken as it is)."""
    nq, nk = head.q.shape[0], head.k.shape[0]
    x = balls(np.concatenate([np.abs(head.v), np.ones((nk, 1))], 1))
    nd, a_sums, f, m = family_of(spec).sums_bound.balls(head, spec, u, x)
    if spec.scale != 1.0:  # an exact factor, rounded once where a kernel applies it
        d = head.q.shape[1]
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        nd, a_sums = ([[c * t for t in r] for r in rows] for rows in (nd, a_sums))
        f = [  # c F + u A, each sum from arb(0)
            [sum((c * t, u * s), arb(0)) for t, s in zip(r, ra, strict=True)]
            for r, ra in zip(f, a_sums, strict=True)
        ]
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


def _ratios(rows: list[list[arb]], dens: list[arb]) -> np.ndarray:
    """Upper bounds on row / den, element by element (inf where den may be 0)."""
    return np.array([[_upper(t / den) for t in r] for r, den in zip(rows, dens, strict=True)])


def _upper(t: arb) -> float:
    return float(t.upper()) if t.is_finite() else math.inf
