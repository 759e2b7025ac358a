"""The decay's error model and its weights in float64 (each within SAFETY): eta_i, a bound on
the relative error of any sane evaluation of the decay w_ij (gamma^(i-j) or exp(G_i - G_j))
in precision u (_decay_errors; Higham, "Accuracy and Stability of Numerical Algorithms", 2nd
ed., eq. 3.5), and the weights the state bounds take: w_(N-1, j) from each key to the last,
W_i from before the first token, and w_ij, 0 above the diagonal.
"""

from __future__ import annotations

import math

import numpy as np

from ..reference.balls import Head
from ..reference.certified import SAFETY
from ..rounding import C_LIB, gamma
from ..specs import Spec
from .feature_errors import _grow


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
    else:  # channel gates: the largest channel's
        logs = np.cumsum(np.abs(head.decay), axis=0).reshape(n, -1).max(axis=1)
    with np.errstate(over="ignore"):
        rounds = gamma((C_LIB + 1) * n + 2 * C_LIB + 2, u)
        rel = _grow(np.expm1(gamma(n + 1, u) * (2 * logs + 1)), rounds)
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
    for j > i: 1, gamma^(i-j) or exp(G_i - G_j)."""
    n = head.q.shape[0]
    gaps = (np.arange(n)[:, None] - np.arange(n)[None, :])[..., None]
    if spec.decay is None:
        return (gaps >= 0).astype(np.float64)
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
