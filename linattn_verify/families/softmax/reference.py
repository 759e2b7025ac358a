"""Softmax attention's part of the shared exact engines (reference/similarity.py): sim(q,
k) = exp(q . k / sqrt(d)) (Vaswani et al. 2017, eq. 1) times the scale, no weights, no
state: mpmath's rows (mp_sims, times the scale by mp.scaled), arb's from the logits
(balls.direct_sims), never the linear form, the certified engine's quadratic sums, and the
exact gradients' similarities and derivatives (logits) with grad_terms.plain_rows. None
imports an implementation.
"""

from __future__ import annotations

import mpmath
import numpy as np

from ...reference.balls import Head, direct_sims
from ...reference.certified import LIB, SAFETY, U64, UNDERFLOW, gamma64
from ...reference.certified_engine import plain_head
from ...reference.grad_terms import plain_rows
from ...reference.mp import abs_logits, abs_rows, scaled
from ...reference.similarity import Gradients, Similarity
from ...specs import Spec


def mp_sims(qi: list, keys: list, abs_keys: list) -> tuple[list, list]:
    """(exp(s_ij), s_ij = q_i . k_j / sqrt(d), and exp(s_ij) (1 + |q_i|.|k_j| / sqrt(d)),
    a bound on it and on what its evaluation cancels: an error in the logit s is a relative
    error of exp(s)) for every key j at the working precision (abs_keys: mp.abs_rows)."""
    mp = mpmath.mp
    d = len(qi)
    sims = [mp.exp(mp.fdot(qi, kj) / mp.sqrt(d)) for kj in keys]
    return sims, [a * (1 + t) for a, t in zip(sims, abs_logits(qi, abs_keys), strict=True)]


def mp_rows(x, spec: Spec, b: int, h: int, keys: list, w: list | None):
    """Similarity.mp: mp_sims times the scale c (mp.scaled)."""
    abs_keys = abs_rows(keys)
    return scaled(lambda i, qi: mp_sims(qi, keys, abs_keys))


def logits(qi: list, keys: list, abs_keys: list) -> tuple[list, list, list, list]:
    """Gradients.logits: (a_ij, M(a_ij), da_ij/ds_ij, its M) for every key j, mp_sims' with
    da/ds = a for a = exp(s)."""
    sims, mags = mp_sims(qi, keys, abs_keys)
    return sims, mags, sims, mags


def arb_sims(head: Head, spec: Spec, rows: list[int]):
    """sim(q_i, k_j) for the query rows `rows` and every key (balls.direct_sims)."""
    return direct_sims(head, rows, spec.feature_map)


def certified_head(q, k, v, w, decay, spec: Spec, outs, at) -> None:
    """Similarity.certified: certified_engine.plain_head with softmax's sums."""
    plain_head(q, k, v, w, spec, outs, at, _sums)


def _sums(q, k, v, w, spec: Spec, relative: bool, lost: list[bool]):
    """plain_head's sums: _softmax_sums' blocks (exact features: never lost)."""
    yield from _softmax_sums(q, k, v, spec.causal, spec.eps)


SOFTMAX = Similarity(
    mp=mp_rows,
    arb=arb_sims,
    linear=lambda spec, head: False,
    certified=certified_head,
    gradients=Gradients(rows=plain_rows, logits=logits),
)


def _softmax_sums(q, k, v, causal: bool, eps: float):
    """The quadratic form of softmax, exp(q.k / sqrt(d) - row max), in blocks of rows; the
    max shifts eps too (exp(-max) eps, within LIB + u of its value)."""
    nq, nk, d = q.shape[0], k.shape[0], q.shape[1]
    cols = np.concatenate([v, np.abs(v), np.ones((nk, 1))], 1)
    dv = v.shape[1]
    c = d**-0.5
    for start in range(0, nq, 256):
        rows = np.arange(start, min(start + 256, nq))
        logits = (q[rows] @ k.T) * c
        err = (gamma64(d + 1) + LIB + U64) * (np.abs(q[rows]) @ np.abs(k).T) * c * SAFETY
        if causal:
            logits = np.where(np.arange(nk) <= rows[:, None], logits, -np.inf)
        top = logits.max(axis=1, keepdims=True)
        arg = logits - top
        weights = np.exp(arg)
        rel = np.expm1(err + U64 * np.abs(np.where(weights > 0, arg, 0.0)))
        rel = (rel * (1 + U64) + LIB) * SAFETY
        both = weights @ cols
        errors = (rel * weights + UNDERFLOW) @ cols[:, dv:]
        value, magnitude = both[:, [*range(dv), 2 * dv]], both[:, dv:]
        shifted_eps = eps * np.exp(-top)  # the exponential and the product
        sums = (value, magnitude, errors, nk + 2, nk + 2, shifted_eps, LIB + U64, 1.0)
        yield start, rows[-1] + 1, sums
