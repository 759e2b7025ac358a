"""The arb engine: exact attention in ball arithmetic, fast enough for large N.

Every quantity is an arb ball (FLINT's arb through python-flint: Johansson 2017, "Arb:
efficient arbitrary-precision midpoint-radius interval arithmetic") that provably contains
the exact value. Kernelised specs use the linear form phi(Q)(phi(K)^T [V, 1]) (causal: a
state carried between blocks plus a masked block inside), softmax and cheap-feature cases
the quadratic form; in exact arithmetic the forms are equal, and the balls make the choice
harmless. An output element is accepted once its ball determines its float64 rounding
(both ends round to the same double), or is narrower than 2^-62 of its midpoint (so the
midpoint's rounding is within one ulp); rows that are not yet resolved are recomputed at
twice the precision, up to MAX_PREC.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from flint import arb, arb_mat

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec
from .balls import Head, balls, features, kernel_sums, masked, working_precision
from .common import MAX_PREC, ReferenceAccuracyError, refine
from .similarity import Similarity

DEFAULT_PREC = 128
QUADRATIC_ROW_BLOCK = 256  # query rows per block of the quadratic form (bounds memory)
FAITHFUL_RADIUS = 2.0**-62  # a ball this narrow (relative) rounds to within one ulp


def weighted_sums(
    head: Head, spec: Spec, rows: list[int], x: list[list[arb]], linear: bool, sim: Similarity
):
    """sum_j scale w_ij sim(q_i, k_j) x_j for the query rows `rows` (all rows when
    `linear`: the linear form, which the family's sim.linear chose), w_ij sim(q_i, k_j)
    the family's (sim.arb)."""
    if spec.scale != 1.0:
        d = head.q.shape[1]
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        sums = weighted_sums(head, replace(spec, scale=1.0), rows, x, linear, sim)
        return [[c * t for t in r] for r in sums]
    if linear:
        name, nq, nk = spec.feature_map, head.q.shape[0], head.k.shape[0]
        fq = features(head.q, range(nq), head, name)
        fk = features(head.k, range(nk), head, name)
        return kernel_sums(fq, fk, x, spec.causal)
    out: list[list[arb]] = []
    xm = arb_mat(x)
    for start in range(0, len(rows), QUADRATIC_ROW_BLOCK):
        block = rows[start : start + QUADRATIC_ROW_BLOCK]
        sims = sim.arb(head, spec, block)
        out.extend((arb_mat(masked(sims, block, spec.causal)) * xm).tolist())
    return out


def rounded(ball: arb) -> float | None:
    """The float64 that `ball` determines (see module docstring), or None if it does not."""
    lo, hi = float(ball.lower()), float(ball.upper())
    if lo == hi:
        return lo + 0.0  # -0.0 -> 0.0
    mid = ball.mid()
    if ball.rad() <= abs(mid) * FAITHFUL_RADIUS:
        return float(mid)
    return None


def _quotients(num_den: list[list[arb]], spec: Spec) -> list[list[float | None]]:
    """out_ic = num_ic / (eps + den_i), den in the last column; NaN where 0/0 exactly; the
    numerator alone for an unnormalised spec."""
    if not spec.normalize:
        return [[rounded(t) for t in row[:-1]] for row in num_den]
    eps, out = spec.eps, []
    for row in num_den:
        den = row[-1] + eps
        if den.is_zero():
            out.append([float("nan")] * (len(row) - 1))
        else:
            out.append([rounded(t / den) for t in row[:-1]])
    return out


def arb_attention(
    x: AttentionInputs,
    spec: Spec,
    similarity: Similarity,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
    pending: dict[tuple[int, int], list[int]] | None = None,
) -> np.ndarray:
    """Exact attention (B, H, Nq, dv), each element within one ulp of float64 (see module);
    only the rows `pending` of the heads it names, if given (NaN elsewhere); the
    similarities by the family's `similarity`."""
    nq = x.q.shape[2]

    def settle(b: int, h: int, rows: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
        head = Head.of(x, b, h)
        linear = len(rows) == nq and p == prec and similarity.linear(spec, head)
        with working_precision(p):
            vals = balls(np.concatenate([head.v, np.ones((head.v.shape[0], 1))], 1))
            sums = weighted_sums(head, spec, rows, vals, linear, similarity)
            quot = _quotients(sums, spec)
        done = np.array([all(t is not None for t in row) for row in quot])
        values = np.array([[math.nan if t is None else t for t in row] for row in quot])
        return values, done

    return refine(x, settle, prec, max_prec, "arb", pending)


def arb_denominator_signs(
    x: AttentionInputs,
    spec: Spec,
    similarity: Similarity,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
) -> np.ndarray:
    """The sign (-1, 0 or 1) of eps + sum_j sim(q_i, k_j), exactly, (B, H, Nq): 0 only where
    the denominator is exactly zero (relu rows with no positive similarity)."""
    ones = replace(x, v=np.ones((*x.v.shape[:3], 1)))
    nq = x.q.shape[2]

    def settle(b: int, h: int, rows: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
        head = Head.of(ones, b, h)
        linear = len(rows) == nq and p == prec and similarity.linear(spec, head)
        with working_precision(p):
            sums = weighted_sums(head, spec, rows, balls(head.v), linear, similarity)
            dens = [r[0] + spec.eps for r in sums]
            signs = [0 if t.is_zero() else 1 if t > 0 else -1 if t < 0 else None for t in dens]
        done = np.array([s is not None for s in signs])
        return np.array([[math.nan if s is None else s] for s in signs]), done

    return refine(ones, settle, prec, max_prec, "arb")[..., 0]


def arb_decimal(
    x: AttentionInputs, spec: Spec, digits: int, similarity: Similarity, max_prec: int = MAX_PREC
) -> np.ndarray:
    """Exact attention as decimal strings of `digits` significant digits, correctly rounded
    (both ends of each ball round to the same string), (B, H, Nq, dv); "nan" where the value
    is 0/0, "0" where it is exactly 0. Known-answer vectors use 34 digits (112 bits).
    A value that is 0 by cancellation (not exactly) never resolves: ReferenceAccuracyError."""
    b_, h_, nq = x.q.shape[:3]
    out = np.empty((b_, h_, nq, x.v.shape[3]), dtype=object)
    for b in range(b_):
        for h in range(h_):
            head, prec = Head.of(x, b, h), 4 * digits
            while True:
                with working_precision(prec):
                    vals = balls(np.concatenate([head.v, np.ones((head.v.shape[0], 1))], 1))
                    sums = weighted_sums(head, spec, list(range(nq)), vals, False, similarity)
                    rows = [_decimal_row(row, spec, digits) for row in sums]
                if all(r is not None for r in rows) or prec > max_prec:
                    break
                prec *= 2
            if any(r is None for r in rows):
                raise ReferenceAccuracyError(
                    f"arb engine: head ({b}, {h}) not resolved to {digits} digits "
                    f"at {max_prec} bits"
                )
            out[b, h] = rows
    return out


def _decimal_row(row: list[arb], spec: Spec, digits: int) -> list[str] | None:
    """The row's quotients num / (eps + den) (unnormalised: num) as correctly rounded
    decimal strings, or None if some ball's two ends do not yet round to the same string."""
    den = row[-1] + spec.eps if spec.normalize else arb(1)
    if den.is_zero():
        return ["nan"] * (len(row) - 1)
    texts = [decimal_text(t / den, digits) for t in row[:-1]]
    return None if None in texts else texts


def decimal_text(ball: arb, digits: int) -> str | None:
    """The value in `ball` as a decimal string of `digits` significant digits, correctly
    rounded ("0" for an exact 0), or None if the ball's two ends round to different strings
    (or it contains 0 without being 0)."""
    if ball.is_zero():
        return "0"
    if not ball.is_finite() or ball.contains(0):
        return None
    low, high = (e.str(digits, radius=False, more=True) for e in (ball.lower(), ball.upper()))
    return low if low == high else None
