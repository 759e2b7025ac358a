"""Kernelised attention's bound on the errors of a carried state's gradients
(state_gradient_bound: dL/dS_0, dL/dz_0 and dL_S/dv), for any evaluation in precision u, from
the features' errors (bound.feature_errors) and a decay's (bound.DecayWeights, passed in by
families/decayed/bound.py), each product and sum within gamma_n of its terms' magnitudes
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Theorem 3.1 and eq. 3.5).
"""

from __future__ import annotations

import numpy as np

from ...inputs import AttentionInputs
from ...reference.balls import Head
from ...reference.certified import SAFETY
from ...rounding import C_LIB, gamma
from ...specs import Spec
from .bound import DecayWeights, _features, _stabiliser


def state_gradient_bound(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray,
    u: float,
    tiny: float = 0.0,
    normalised: tuple | None = None,
    decay: DecayWeights | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Bounds on the errors of dL/dS_0 (B, H, F, dv), dL/dz_0 (B, H, F; None unnormalised)
    and dL_S/dv (B, H, N, dv) of reference/state.py's exact_state_gradients, for any
    evaluation in precision u. normalised: (g_z, (S_0, z_0), the exact StateGradients) of
    a normalised spec, whose exact denominators and outputs the bound takes. decay: its
    weights (DecayWeights), None without one.

    dL/dS_0 = sum_i c W_i phi(q_i) (g_out_i / D_i)^T + W_(N-1) g_state: N + 1 terms, each a
    product of a feature (within psi, feature_errors), the decay W_i (within eta_i,
    DecayWeights.errors), the scale, a cotangent and 1 / D_i; a backward pass through a
    recurrence or through chunks forms W_i from up to N rounded decays (an exponential and a
    product each) and sums the terms in any order, so gamma_((C_LIB + 2) N + 2 C_LIB + 6)
    times the terms' magnitudes covers it (Higham 2002, Theorem 3.1), F + dv + 2 more when
    normalised (the quotient and the dot g_out_i . out_i), plus the features',
    decays' and denominators' own errors; dL/dz_0 = -sum_i c W_i phi(q_i) (g_out_i . out_i)
    / D_i + W_(N-1) g_z likewise, with out_i's error; dL_S/dv_j = w_(N-1, j) g_state^T
    phi(k_j) over F terms. The computed D_i (its N F + F terms: the continued sums, the
    initial state's) is within e_D of D_i, the numerator within e_n, so 1 / D_i is within
    r_D / |D_i|, r_D = e_D / (|D_i| - e_D), and out_i within (e_n + |out_i| e_D) / (|D_i| -
    e_D) (infinite where e_D >= |D_i|: the row's sign is not determined), e_D and e_n with
    tiny per product for underflow (eps's rounding among them). Unnormalised D_i = 1
    exactly. Stored in precision u: u times the magnitude, which also covers the
    float64 rounding of the exact values; tiny / 2 per term for underflow. In float64,
    inflated by SAFETY; infinite where gamma is."""
    b_, h_, n, d = x.q.shape
    name = spec.feature_map
    c = spec.scale_for(d) * SAFETY
    out_s, out_z, out_v = [], [], []
    for b in range(b_):
        for h in range(h_):
            head = Head.of(x, b, h)
            stab = _stabiliser(head.q, head.k, head.w, name)
            positions = np.arange(n)
            _, aq, psi_q = _features(head.q, positions, head.big_m, head.w, name, u, stab)
            _, ak, psi_k = _features(head.k, positions, head.big_m, head.w, name, u, stab)
            extra = aq.shape[1] + g_out.shape[-1] + 2 if normalised is not None else 0
            g = gamma((C_LIB + 2) * n + 2 * C_LIB + 6 + extra, u)
            into, last = np.ones((n, 1)), np.ones((n, 1))
            eta = np.zeros(n)
            if decay is not None:
                into = decay.from_start(head, spec) * SAFETY
                last = decay.last(head, spec) * SAFETY
                eta = decay.errors(head, spec, u)
            go, gs = np.abs(g_out[b, h]), np.abs(g_state[b, h])
            left = c * into * aq  # |c W_i phi(q_i)|
            left_err = c * into * (psi_q + eta[:, None] * (aq + psi_q))
            den, r_den, out_abs, out_err = np.ones(n), np.zeros(n), None, None
            if normalised is not None:
                g_z, initial, exact = normalised
                den, r_den, out_abs, out_err = _quotient_errors(
                    head, spec, (aq, psi_q, ak, psi_k), (left, left_err, eta), (g, tiny),
                    [t[b, h] for t in initial], (exact.den[b, h], exact.out[b, h]), decay,
                )  # fmt: skip
            with np.errstate(divide="ignore"):
                per_row = go / den[:, None]
            size_s = left.T @ per_row + into[-1][:, None] * gs
            errs_s = (left_err * (1 + r_den[:, None]) + left * r_den[:, None]).T @ per_row
            parts = [(size_s, errs_s + eta[-1] * into[-1][:, None] * gs, n + 1, out_s)]
            keys = last * ak
            parts.append((keys @ gs, (last * (psi_k + eta[-1] * (ak + psi_k))) @ gs,
                          ak.shape[1], out_v))  # fmt: skip
            if normalised is not None:
                gz = np.abs(g_z[b, h])
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    hz = (go * out_abs).sum(1) / den
                    e_hz = (go * out_err).sum(1) / den * (1 + r_den) + hz * r_den
                size_z = left.T @ hz + into[-1] * gz
                errs_z = left_err.T @ (hz + e_hz) + left.T @ e_hz + eta[-1] * into[-1] * gz
                parts.append((size_z, errs_z, n + 1, out_z))
            with np.errstate(invalid="ignore", over="ignore"):
                for size, errs, terms, out in parts:
                    e = (g * (size + errs) + errs + u * size + tiny * terms) * SAFETY
                    out.append(np.where(np.isfinite(g) & ~np.isnan(e), e, np.inf))
    f, dv = out_s[0].shape
    bound_z = np.stack(out_z).reshape(b_, h_, f) if out_z else None
    return (np.stack(out_s).reshape(b_, h_, f, dv), bound_z, np.stack(out_v).reshape(b_, h_, n, dv))


def _quotient_errors(head: Head, spec: Spec, feats, lefts, rounding, initial, exact, decay):
    """For a normalised spec continuing (S_0, z_0): (a lower bound on |D_i|, r_D_i, an upper
    bound on |out_i|, the bound on out_i's error) per row, from the exact D_i and out_i
    (within one float64 rounding, SAFETY) and the errors of the computed sums (see
    state_gradient_bound)."""
    aq, psi_q, ak, psi_k = feats
    left, left_err, eta = lefts
    g, tiny = rounding  # gamma_n, and the smallest subnormal: each term may underflow
    s0, z0 = (np.abs(t) for t in initial)
    den_exact, out_exact = exact
    c = spec.scale_for(head.q.shape[1]) * SAFETY
    weights = _causal_weights(head, spec, decay) * SAFETY  # (N, N, 1 or F)
    sizes = c * _weighted_products(aq, ak, weights)  # |c w_ij phi(q_i) . phi(k_j)|
    grown = c * _weighted_products(aq + psi_q, ak + psi_k, weights) * (1 + eta[:, None])
    errors = grown - sizes  # the features' and the decay's errors
    mags = np.concatenate([np.abs(head.v), np.ones((head.v.shape[0], 1))], 1)
    state = np.concatenate([s0, z0[:, None]], 1)
    size = sizes @ mags + left @ state + np.concatenate([np.zeros(s0.shape[1]), [spec.eps]])
    err = errors @ mags + left_err @ state
    with np.errstate(invalid="ignore", over="ignore"):
        terms = (head.k.shape[0] + 1) * aq.shape[1] + 1  # N F + F products and eps
        e = g * (size + err) + err + tiny * terms  # numerator columns, then the denominator
        e_n, e_d = e[:, :-1], e[:, -1]
        den = np.abs(den_exact) / SAFETY
        margin = den - e_d
        r_den = np.where(margin > 0, e_d / margin, np.inf)
        out_abs = np.abs(out_exact) * SAFETY
        out_err = np.where(
            margin[:, None] > 0, (e_n + out_abs * e_d[:, None]) / margin[:, None], np.inf
        )
    return den, r_den, out_abs, out_err


def _causal_weights(head: Head, spec: Spec, decay: DecayWeights | None) -> np.ndarray:
    """w_ij (N, N, 1 or F): the decay's (DecayWeights.causal), or 1 for j <= i and 0 above
    the diagonal without one."""
    if decay is not None:
        return decay.causal(head, spec)
    n = head.q.shape[0]
    gaps = (np.arange(n)[:, None] - np.arange(n)[None, :])[..., None]
    return (gaps >= 0).astype(np.float64)


def _weighted_products(left: np.ndarray, right: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_m left_im right_jm w_ijm, the weights (N, N, 1) shared by every feature or
    (N, N, F) per feature."""
    if weights.shape[-1] == 1:
        return (left @ right.T) * weights[..., 0]
    return np.einsum("im,jm,ijm->ij", left, right, weights)
