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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from flint import arb, arb_mat, ctx, fmpq

from ..inputs import AttentionInputs
from ..specs import Spec
from .common import MAX_PREC, ReferenceAccuracyError, refine

DEFAULT_PREC = 128
CAUSAL_BLOCK = 64  # rows per block of the causal linear form: 64x64 arb products are cheap
QUADRATIC_ROW_BLOCK = 256  # query rows per block of the quadratic form (bounds memory)
FAITHFUL_RADIUS = 2.0**-62  # a ball this narrow (relative) rounds to within one ulp


@contextmanager
def working_precision(prec: int) -> Iterator[None]:
    """Set FLINT's global working precision (bits) for the block, then restore it."""
    old = ctx.prec
    ctx.prec = prec
    try:
        yield
    finally:
        ctx.prec = old


def balls(a: np.ndarray) -> list[list[arb]]:
    """Rows of a 2-d float64 array as exact arb balls."""
    return [[arb(t) for t in row] for row in a.tolist()]


@dataclass(frozen=True)
class Head:
    """One (b, h) slice of the inputs, as floats (for branching) and exact balls."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    w: np.ndarray | None
    big_m: int  # cosFormer's M = max(Nq, Nk)

    @classmethod
    def of(cls, x: AttentionInputs, b: int, h: int) -> Head:
        return cls(x.q[b, h], x.k[b, h], x.v[b, h], x.projection, max(x.q.shape[2], x.k.shape[2]))


def scaled_rows(x: np.ndarray) -> arb_mat:
    """x' = x d^(-1/4), the scaling of the Performer and Taylor maps."""
    return arb_mat(balls(x)) * arb(x.shape[1]).rsqrt().sqrt()


def performer_arguments(x: np.ndarray, w: np.ndarray) -> tuple[list[list[arb]], list[arb]]:
    """(W x'_i, |x'_i|^2 / 2) for each row i: the exponents of the Performer maps."""
    scaled = scaled_rows(x)
    half_sq = [sum(t * t for t in row) / 2 for row in scaled.tolist()]
    return (scaled * arb_mat(balls(w)).transpose()).tolist(), half_sq


def features(x: np.ndarray, positions: range, head: Head, name: str) -> list[list[arb]]:
    """phi(x_i) for each row i at the working precision (formulas: specs.FEATURE_MAPS)."""
    if name == "elu":  # elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise
        return [[arb(t) + 1 if t > 0 else arb(t).exp() for t in row] for row in x.tolist()]
    if name == "relu":
        return [[arb(t) if t > 0 else arb(0) for t in row] for row in x.tolist()]
    if name == "cosformer":  # relu(x_i) [cos(pi i / 2M), sin(pi i / 2M)]
        out = []
        for i, row in zip(positions, x.tolist(), strict=True):
            s, c = arb.sin_cos_pi_fmpq(fmpq(i, 2 * head.big_m))
            r = [arb(t) if t > 0 else arb(0) for t in row]
            out.append([t * c for t in r] + [t * s for t in r])
        return out
    if name == "taylor":  # [1, x', vec(x' x'^T) / sqrt(2)]
        r2 = arb(2).rsqrt()
        xs = scaled_rows(x).tolist()
        return [[arb(1), *row] + [a * b * r2 for a in row for b in row] for row in xs]
    proj, half_sq = performer_arguments(x, head.w)
    m = head.w.shape[0]
    if name == "performer-positive":
        rm = arb(m).rsqrt()
        return [[(p - hs).exp() * rm for p in row] for row, hs in zip(proj, half_sq, strict=True)]
    if name == "performer-hyperbolic":
        out = []
        for row, hs in zip(proj, half_sq, strict=True):
            scale = (-hs).exp() * arb(2 * m).rsqrt()
            out.append([p.exp() * scale for p in row] + [(-p).exp() * scale for p in row])
        return out
    if name == "performer-trig":
        out = []
        for row, hs in zip(proj, half_sq, strict=True):
            scale = hs.exp() * arb(m).rsqrt()
            sc = [p.sin_cos() for p in row]
            out.append([s * scale for s, _ in sc] + [c * scale for _, c in sc])
        return out
    raise AssertionError(name)


def direct_sims(head: Head, rows: list[int], name: str) -> list[list[arb]]:
    """sim(q_i, k_j) for softmax and taylor, straight from s = q.k / sqrt(d)."""
    d = head.q.shape[1]
    s = (arb_mat(balls(head.q[rows])) * arb_mat(balls(head.k)).transpose()) * arb(d).rsqrt()
    if name == "softmax":
        return [[t.exp() for t in row] for row in s.tolist()]
    return [[1 + t + t * t / 2 for t in row] for row in s.tolist()]


def masked(sims: list[list[arb]], rows: list[int], causal: bool) -> list[list[arb]]:
    """Zero the weights of keys j > i for causal specs (DESIGN: key j used iff j <= i)."""
    if not causal:
        return sims
    zero = arb(0)
    return [
        [t if j <= i else zero for j, t in enumerate(r)] for i, r in zip(rows, sims, strict=True)
    ]


def kernel_sums(fq: list[list[arb]], fk: list[list[arb]], x: list[list[arb]], causal: bool):
    """Rows sum_j (fq_i . fk_j) x_j over allowed j, in the linear form; a list of arb rows.

    Causal: blocks of CAUSAL_BLOCK rows, each with the state S = sum_{j < block} fk_j x_j^T
    and the masked quadratic product inside the block (queries and keys share positions).
    """
    if not causal:
        return (arb_mat(fq) * (arb_mat(fk).transpose() * arb_mat(x))).tolist()
    out: list[list[arb]] = []
    state = arb_mat(len(fk[0]), len(x[0]))
    for start in range(0, len(fq), CAUSAL_BLOCK):
        end = min(start + CAUSAL_BLOCK, len(fq))
        qb, kb, xb = arb_mat(fq[start:end]), arb_mat(fk[start:end]), arb_mat(x[start:end])
        rows = list(range(end - start))
        inner = arb_mat(masked((qb * kb.transpose()).tolist(), rows, True))
        out.extend((qb * state + inner * xb).tolist())
        state = state + kb.transpose() * xb
    return out


def weighted_sums(head: Head, spec: Spec, rows: list[int], x: list[list[arb]], linear: bool):
    """sum_j sim(q_i, k_j) x_j for the query rows `rows` (all rows when `linear`)."""
    name = spec.feature_map
    if linear:
        nq, nk = head.q.shape[0], head.k.shape[0]
        fq = features(head.q, range(nq), head, name)
        fk = features(head.k, range(nk), head, name)
        return kernel_sums(fq, fk, x, spec.causal)
    out: list[list[arb]] = []
    xm = arb_mat(x)
    for start in range(0, len(rows), QUADRATIC_ROW_BLOCK):
        block = rows[start : start + QUADRATIC_ROW_BLOCK]
        if spec.info.kernelised and name != "taylor":
            fq = features(head.q[block], block, head, name)
            fk = features(head.k, range(head.k.shape[0]), head, name)
            sims = (arb_mat(fq) * arb_mat(fk).transpose()).tolist()
        else:
            sims = direct_sims(head, block, name)
        out.extend((arb_mat(masked(sims, block, spec.causal)) * xm).tolist())
    return out


def prefers_linear(spec: Spec, head: Head) -> bool:
    """The linear form when the spec has features and they are fewer than the keys."""
    info = spec.info
    if not info.kernelised:
        return False
    m = None if head.w is None else head.w.shape[0]
    return info.feature_dim(head.q.shape[1], m) < head.k.shape[0]


def rounded(ball: arb) -> float | None:
    """The float64 that `ball` determines (see module docstring), or None if it does not."""
    lo, hi = float(ball.lower()), float(ball.upper())
    if lo == hi:
        return lo + 0.0  # -0.0 -> 0.0
    mid = ball.mid()
    if ball.rad() <= abs(mid) * FAITHFUL_RADIUS:
        return float(mid)
    return None


def _quotients(num_den: list[list[arb]], eps: float) -> list[list[float | None]]:
    """out_ic = num_ic / (eps + den_i), den in the last column; NaN where 0/0 exactly."""
    out = []
    for row in num_den:
        den = row[-1] + eps
        if den.is_zero():
            out.append([float("nan")] * (len(row) - 1))
        else:
            out.append([rounded(t / den) for t in row[:-1]])
    return out


def arb_attention(
    x: AttentionInputs, spec: Spec, prec: int = DEFAULT_PREC, max_prec: int = MAX_PREC
) -> np.ndarray:
    """Exact attention (B, H, Nq, dv), each element within one ulp of float64 (see module)."""
    nq = x.q.shape[2]

    def settle(b: int, h: int, rows: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
        head = Head.of(x, b, h)
        linear = len(rows) == nq and p == prec and prefers_linear(spec, head)
        with working_precision(p):
            vals = balls(np.concatenate([head.v, np.ones((head.v.shape[0], 1))], 1))
            quot = _quotients(weighted_sums(head, spec, rows, vals, linear), spec.eps)
        done = np.array([all(t is not None for t in row) for row in quot])
        values = np.array([[math.nan if t is None else t for t in row] for row in quot])
        return values, done

    return refine(x, settle, prec, max_prec, "arb")


def arb_denominator_signs(
    x: AttentionInputs, spec: Spec, prec: int = DEFAULT_PREC, max_prec: int = MAX_PREC
) -> np.ndarray:
    """The sign (-1, 0 or 1) of eps + sum_j sim(q_i, k_j), exactly, (B, H, Nq): 0 only where
    the denominator is exactly zero (relu rows with no positive similarity)."""
    ones = replace(x, v=np.ones((*x.v.shape[:3], 1)))
    nq = x.q.shape[2]

    def settle(b: int, h: int, rows: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
        head = Head.of(ones, b, h)
        linear = len(rows) == nq and p == prec and prefers_linear(spec, head)
        with working_precision(p):
            dens = [r[0] + spec.eps for r in weighted_sums(head, spec, rows, balls(head.v), linear)]
            signs = [0 if t.is_zero() else 1 if t > 0 else -1 if t < 0 else None for t in dens]
        done = np.array([s is not None for s in signs])
        return np.array([[math.nan if s is None else s] for s in signs]), done

    return refine(ones, settle, prec, max_prec, "arb")[..., 0]


def arb_decimal(
    x: AttentionInputs, spec: Spec, digits: int, max_prec: int = MAX_PREC
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
                    sums = weighted_sums(head, spec, list(range(nq)), vals, False)
                    rows = [_decimal_row(row, spec.eps, digits) for row in sums]
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


def _decimal_row(row: list[arb], eps: float, digits: int) -> list[str] | None:
    """The row's quotients num / (eps + den) as correctly rounded decimal strings, or None
    if some ball's two ends do not yet round to the same string."""
    den = row[-1] + eps
    if den.is_zero():
        return ["nan"] * (len(row) - 1)
    texts = []
    for t in row[:-1]:
        q = t / den
        if q.is_zero():
            texts.append("0")
            continue
        if not q.is_finite() or q.contains(0):
            return None
        low, high = (e.str(digits, radius=False, more=True) for e in (q.lower(), q.upper()))
        if low != high:
            return None
        texts.append(low)
    return texts
