"""Bounds on the errors of a carried state and of its gradients, for any evaluation in
precision u: state_bound (|S_hat - S| and |z_hat - z| after every key) and
state_gradient_bound (dL/dS_0, dL/dz_0 and dL_S/dv), from the features' errors
(feature_errors.py) and the decay's (decay_errors.py), each product and sum within gamma_n
of its terms' magnitudes (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed.,
Theorem 3.1 and eq. 3.5). A family with a model of its own (family_of(spec).state_bound,
the delta rule's families/delta/bound.py) answers for itself.
"""

from __future__ import annotations

import numpy as np

from ..families import family_of
from ..inputs import AttentionInputs
from ..reference.balls import Head
from ..reference.certified import SAFETY
from ..rounding import C_LIB, gamma
from ..specs import Spec
from .decay_errors import (
    _causal_weight_matrix,
    _decay_errors,
    _from_start_weights,
    _last_weights,
)
from .feature_errors import _features, _stabiliser


def state_bound(
    x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on |S_hat - S| (B, H, F, dv) and |z_hat - z| (B, H, F) for any evaluation in
    precision u of the state after every key, S = sum_j w_j phi(k_j) v_j^T and z = sum_j
    w_j phi(k_j) (reference/state.py; w_j the decay from key j to the last, 1 without
    one, each within eta_(N-1) of its value: _decay_errors), stored in precision u; tiny:
    the dtype's smallest subnormal.

    Each term's feature is within psi_j of phi(k_j) (feature_errors) and at most a_j + psi_j
    in magnitude. The products and a sum of N terms in any order, tiled or not, add at most
    gamma_(N+1) times the sum of the terms' magnitudes (Higham 2002, Theorem 3.1 and eq.
    3.5); a kernel that keeps its sums in units of exp(shift) and rescales them when the
    shift grows (stabilised features, the built-in forms) multiplies each term at most once
    a token by exp(a difference), C_LIB + 1 roundings each: gamma_((C_LIB + 2) N + 1)
    covers both. Accumulated in a higher precision and stored in precision u, the state
    gains u |S| (which also covers the float64 rounding of the exact state it is compared
    with); each of the N products may underflow by tiny / 2, and so may each feature (Higham
    2002, sec. 2.1). Evaluated in float64, inflated by SAFETY for its own rounding;
    infinite where gamma is (n u >= 1). The delta rule's is its own (families/delta/bound.py), z
    none (zeros)."""
    b_, h_, nk, _, _, dv = x.shape
    if own := family_of(spec).state_bound:  # a family with a model of its own
        return own(x, spec, u, tiny)
    name, g = spec.feature_map, gamma((C_LIB + 2) * nk + 1, u)
    out_s, out_z = [], []
    for b in range(b_):
        for h in range(h_):
            head = Head.of(x, b, h)
            stab = _stabiliser(head.k, head.k, head.w, name)
            _, a, psi = _features(head.k, np.arange(nk), head.big_m, head.w, name, u, stab)
            if spec.decay is not None:  # each term times w_(N-1, j) <= 1, with its error
                last = _last_weights(head, spec) * SAFETY
                eta = _decay_errors(head, spec, u)[-1]
                a, psi = a * last, (psi + eta * (a + psi)) * last
            mags = np.concatenate([np.abs(head.v), np.ones((nk, 1))], 1)
            terms, errors, sizes = (a + psi).T @ mags, psi.T @ mags, a.T @ mags
            underflow = tiny * (mags.sum(0) + nk)
            with np.errstate(invalid="ignore"):
                out = (g * terms + errors + u * sizes + underflow) * SAFETY
            out_s.append(np.where(np.isfinite(g), out, np.inf)[:, :dv])
            out_z.append(np.where(np.isfinite(g), out, np.inf)[:, dv])
    f = out_s[0].shape[0]
    return np.stack(out_s).reshape(b_, h_, f, dv), np.stack(out_z).reshape(b_, h_, f)


def state_gradient_bound(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray,
    u: float,
    tiny: float = 0.0,
    normalised: tuple | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Bounds on the errors of dL/dS_0 (B, H, F, dv), dL/dz_0 (B, H, F; None unnormalised)
    and dL_S/dv (B, H, N, dv) of reference/state.py's exact_state_gradients, for any
    evaluation in precision u. normalised: (g_z, (S_0, z_0), the exact StateGradients) of
    a normalised spec, whose exact denominators and outputs the bound takes.

    dL/dS_0 = sum_i c W_i phi(q_i) (g_out_i / D_i)^T + W_(N-1) g_state: N + 1 terms, each a
    product of a feature (within psi, feature_errors), the decay W_i (within eta_i,
    _decay_errors), the scale, a cotangent and 1 / D_i; a backward pass through a
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
            if spec.decay is not None:
                into = _from_start_weights(head, spec) * SAFETY
                last = _last_weights(head, spec) * SAFETY
                eta = _decay_errors(head, spec, u)
            go, gs = np.abs(g_out[b, h]), np.abs(g_state[b, h])
            left = c * into * aq  # |c W_i phi(q_i)|
            left_err = c * into * (psi_q + eta[:, None] * (aq + psi_q))
            den, r_den, out_abs, out_err = np.ones(n), np.zeros(n), None, None
            if normalised is not None:
                g_z, initial, exact = normalised
                den, r_den, out_abs, out_err = _quotient_errors(
                    head, spec, (aq, psi_q, ak, psi_k), (left, left_err, eta), (g, tiny),
                    [t[b, h] for t in initial], (exact.den[b, h], exact.out[b, h]),
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


def _quotient_errors(head: Head, spec: Spec, feats, lefts, rounding, initial, exact):
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
    weights = _causal_weight_matrix(head, spec) * SAFETY  # (N, N, 1 or F)
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


def _weighted_products(left: np.ndarray, right: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_m left_im right_jm w_ijm, the weights (N, N, 1) shared by every feature or
    (N, N, F) per feature."""
    if weights.shape[-1] == 1:
        return (left @ right.T) * weights[..., 0]
    return np.einsum("im,jm,ijm->ij", left, right, weights)
