"""The scalar decays' terms of the shared a-priori bound (accuracy/bound.py), built on
kernelised attention's (families/kernelised/bound.py: the features and their errors psi),
which they pass their weights w_ij into: gamma^(i-j) for a constant gamma, exp(G_i - G_j)
for log-gates (G their prefix sums). Channel gates (families/channel_gates/bound.py) build on
these too: the log-gates' code takes gates per token and key channel as well.

The decay's error model and its weights in float64 (each within SAFETY): eta_i, a bound on
the relative error of any sane evaluation of the decay w_ij in precision u (_decay_errors;
Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 3.5), and the weights
the state bounds take: w_(N-1, j) from each key to the last, W_i from before the first
token, and w_ij, 0 above the diagonal. Each weight's own error adds (A + F) eta to F.
"""

from __future__ import annotations

import math

import numpy as np
from flint import arb, arb_mat
from threadpoolctl import threadpool_limits

from ...inputs import AttentionInputs
from ...reference.balls import Head
from ...reference.certified import SAFETY
from ...reference.certified_decay import FEW_ROUNDINGS, decayed_sums, log_decays, one_sided_sums
from ...rounding import C_LIB, gamma, grow
from ...specs import Spec
from ..kernelised import bound as kernelised
from ..kernelised.bound import DecayWeights, _add
from ..kernelised.gradient_bound import state_gradient_bound as kernelised_state_gradient_bound
from .reference import decay_weights


def _decay_errors(head: Head, spec: Spec, u: float) -> np.ndarray:
    """eta_i: a bound on the relative error of any sane evaluation of the decay w_ij, j <= i,
    in precision u. The exponent ln w_ij = G_i - G_j (G the prefix sums of the log-gates;
    (i - j) ln gamma) comes from sums of at most N terms, directly or as a difference of
    prefix sums from the sequence's start (chunked kernels): error <= gamma_(N+1) (2 L_i),
    L_i = sum_(t<=i) |g_t| (Higham 2002, eq. 3.5), the 1 of (2 L_i + 1) covering a power
    gamma^(i-j) by repeated products; then up to two exponentials and their product (a
    decay split at a chunk boundary), 2 C_LIB + 2 roundings, or, in a recurrence, one
    exponential and one product a token, (C_LIB + 1) N roundings (the state times each
    token's rounded exp(g_t)). In float64, inflated by SAFETY."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        logs = np.arange(1, n + 1) * abs(math.log(float(head.decay)))
    else:  # log-gates; channel gates: the largest channel's
        logs = np.cumsum(np.abs(head.decay), axis=0).reshape(n, -1).max(axis=1)
    with np.errstate(over="ignore"):
        rounds = gamma((C_LIB + 1) * n + 2 * C_LIB + 2, u)
        rel = grow(np.expm1(gamma(n + 1, u) * (2 * logs + 1)), rounds)
    return np.where(np.isfinite(rel), rel * SAFETY, np.inf)


def _last_weights(head: Head, spec: Spec) -> np.ndarray:
    """w_(N-1, j) for every key j in float64 (within SAFETY): gamma^(N-1-j) or
    exp(G_(N-1) - G_j), the suffix sums of the log-gates; (N, 1), or (N, d) per channel."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        return np.exp((n - 1 - np.arange(n)) * math.log(float(head.decay)))[:, None]
    gates = head.decay.reshape(n, -1)
    suffix = np.concatenate([np.cumsum(gates[::-1], axis=0)[::-1][1:], gates[:1] * 0])
    return np.exp(suffix)


def _causal_weight_matrix(head: Head, spec: Spec) -> np.ndarray:
    """w_ij (N, N, 1), or w_ijm (N, N, d) for channel gates, in float64 (within SAFETY), 0
    for j > i: gamma^(i-j) or exp(G_i - G_j)."""
    n = head.q.shape[0]
    gaps = (np.arange(n)[:, None] - np.arange(n)[None, :])[..., None]
    if spec.decay == "constant":
        logs = gaps * math.log(float(head.decay))
    else:
        prefix = np.cumsum(head.decay.reshape(n, -1), axis=0)
        logs = prefix[:, None, :] - prefix[None, :, :]
    with np.errstate(over="ignore"):
        return np.where(gaps >= 0, np.exp(np.where(gaps >= 0, logs, 0.0)), 0.0)


def _from_start_weights(head: Head, spec: Spec) -> np.ndarray:
    """W_i, the decay from before the first token to token i, in float64 (within SAFETY):
    (N, 1), or (N, d) per channel."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        return np.exp(np.arange(1, n + 1) * math.log(float(head.decay)))[:, None]
    return np.exp(np.cumsum(head.decay.reshape(n, -1), axis=0))


DECAY = DecayWeights(_decay_errors, _last_weights, _from_start_weights, _causal_weight_matrix)


def _scaled_rows(rows: list[list[arb]], factors: np.ndarray) -> list[list[arb]]:
    """Each row times its factor (an upper bound, as a ball)."""
    return [[t * arb(float(c)) for t in r] for r, c in zip(rows, factors, strict=True)]


def decayed_ball_sums(head: Head, spec: Spec, u: float, x: list[list[arb]], sums):
    """kernelised.ball_sums with the decay's sums (rows sum_j w_ij (fq_i . fk_j) x_j) and
    each weight's own decay error, relative: (A + F) eta."""
    nd, a_sums, f, m = kernelised.ball_sums(head, spec, u, x, sums)
    f = _add(f, _scaled_rows(_add(a_sums, f), _decay_errors(head, spec, u)))
    return nd, a_sums, f, m


def ball_sums(head: Head, spec: Spec, u: float, x: list[list[arb]]):
    """kernelised.ball_sums with the decay: rows sum_j w_ij (fq_i . fk_j) x_j in the quadratic
    form, w_ij exact (balls.decay_weights)."""
    rows = list(range(head.q.shape[0]))
    weights = decay_weights(head, rows, spec.decay)

    def sums(fq, fk, x, causal: bool) -> list[list[arb]]:
        sims = (arb_mat(fq) * arb_mat(fk).transpose()).tolist()
        decayed = [[s * w for s, w in zip(r, wr, strict=True)] for r, wr in zip(sims, weights)]
        return (arb_mat(decayed) * arb_mat(x)).tolist()

    return decayed_ball_sums(head, spec, u, x, sums)


def _fast_decayed(head: Head, spec: Spec, features):
    """kernelised._fast_plain's (A, F, den) of a decayed head: A and F upper bounds from
    certified_decay.one_sided_sums (F as psi_q.(|phi(k)| + psi_k) + |phi(q)|.psi_k: chains
    of m features, the decay's channels). The denominator: for non-negative features a
    lower bound on D from the same sums of lower bounds on the features, max(phi^ - err,
    0) (radius 0: eps + c D >= eps + c D_low), within about 1e-12 of D however small the
    weights make it; for signed ones D^ and the bound on |D^ - D| of
    certified_decay.decayed_sums (an interval for the exact D, which cancels)."""
    q, k, v = head.q, head.k, head.v
    n = k.shape[0]
    logs, gamma_e = log_decays(head.decay, n)

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


def fast_sums(head: Head, spec: Spec, u: float):
    """kernelised.fast_sums of a decayed head (_fast_decayed), with each weight's own decay
    error, relative: (A + F) eta, as ball_sums'."""
    a, f, den, m = kernelised.fast_sums(head, spec, u, _fast_decayed)
    eta = _decay_errors(head, spec, u)[:, None]
    with np.errstate(invalid="ignore", over="ignore"):  # arb: 0 inf is NaN, then inf
        f = np.where(np.isfinite(eta), (f + (a + f) * eta) * FEW_ROUNDINGS, np.inf)
    return a, f, den, m


def _denominators(x: AttentionInputs, spec: Spec, b: int, h: int):
    """kernelised._denominators of a decayed head (b, h): certified_decay.decayed_sums'."""
    head = Head.of(x, b, h)
    for start, stop, value, _, magnitude in decayed_sums(
        x.q[b, h], x.k[b, h], x.v[b, h][:, :0], x.projection, head.decay, spec
    ):
        yield start, stop, value[:, -1:], magnitude[:, -1:]


def denominator_condition(x: AttentionInputs, spec: Spec):
    """kernelised.denominator_condition with the decay's sums (_denominators)."""
    return kernelised.denominator_condition(x, spec, _denominators)


def state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0):
    """kernelised.state_bound with the decay's weights (DECAY)."""
    return kernelised.state_bound(x, spec, u, tiny, DECAY)


def state_gradient_bound(
    x: AttentionInputs, spec: Spec, g_out, g_state, u, tiny=0.0, normalised=None
):
    """kernelised's state_gradient_bound with the decay's weights (DECAY)."""
    return kernelised_state_gradient_bound(x, spec, g_out, g_state, u, tiny, normalised, DECAY)
