"""The definition in ball arithmetic: exact inputs, features, similarities and their sums
as arb balls (FLINT's arb through python-flint: Johansson 2017, "Arb: efficient
arbitrary-precision midpoint-radius interval arithmetic"). Shared on purpose by the arb
engine (arb.py) and the a-priori bound (accuracy/bound.py), which evaluates the same
features rigorously to bound their rounding."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from flint import arb, arb_mat, ctx, fmpq

from ..inputs import AttentionInputs
from .common import head_decay

CAUSAL_BLOCK = 64  # rows per block of the causal linear form: 64x64 arb products are cheap


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
    decay: np.ndarray | None = None  # gamma (0-d) or the head's log-gates g (N,) or (N, d)

    @classmethod
    def of(cls, x: AttentionInputs, b: int, h: int) -> Head:
        decay = head_decay(x, b, h)
        big_m = max(x.q.shape[2], x.k.shape[2])
        return cls(x.q[b, h], x.k[b, h], x.v[b, h], x.projection, big_m, decay)


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
    if name == "identity":
        return balls(x)
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
    """Zero the weights of keys j > i for causal specs (docs/contract.md: key j used iff j <= i)."""
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
