"""Certified gradients at length of the normalised Performer specs with non-negative
features (performer-positive, performer-hyperbolic): dL/dq, dL/dk, dL/dv (and dL/dg of
scalar log-gates) of L = sum(out * G) in float64, O(N), each element with a rigorous bound
on its error, and an upper bound M' on the magnitude M of reference/grad.py's
gradient_magnitudes. Causal, any eps and scale, decay None, "constant" or "gates" (the
Performer maps take no channel gates: specs.CHANNEL_GATED_MAPS).

The chain sums are certified_grad_normalised.py's (its module docstring derives them and
their bounds): with phi the F features of float_features (F = m, or 2m for hyperbolic),
within psi, the forward F and dv run with the spec's own features (decayed_sums with W),
and dphi(q)_i, dphi(k)_j (the gradients with respect to the features, within E) with the
features as columns. What differs is the last step, through J_phi^T (grad.py's Kernel.jt):
with x' = c x, c = d^(-1/4), h = |x'|^2 / 2 and W_F = W (positive) or [W; -W]
(hyperbolic: phi = [exp(W x' - h), exp(-W x' - h)] / sqrt(2m)),

    phi_r = exp(w_r . x' - h) / sqrt(F'),   dphi_r / dx = c phi_r (w_r - x')   (w_r: W_F's rows),
    dq_i = J^T y = c (W_F^T z - x' s),   z = phi(q_i) * y (elementwise), s = sum_r z_r,

y = dphi(q)_i (dk_j alike with phi(k_j), dphi(k)_j). grad.py's hyperbolic form c (W^T (z^+
- z^-) - x' (y . phi)) is the same number.

Bound of J^T (Higham 2002: eq. 3.2's (1 + delta) products, eq. 3.5 for dots in any order,
the matmul's included; gradual underflow: a result below 2^-1022 errs by half a SUBNORMAL).
phi^ within psi, y^ within E, c^ = fl(d^(-1/4)) within LIB c (a power within LIB_ULPS) and
xs^ = fl(x c^) as performer_arguments forms x' (relative LIB + u, and a SUBNORMAL):
- z^ = fl(phi^ y^): e_z = (phi^ + psi) E + psi |y^| + u (1 + u) |z^| + SUBNORMAL;
- t^ = fl(W_F^T z^) (d dots of F terms): e_t = |W_F|^T e_z + gamma_F |W_F|^T |z^| + F SUBNORMAL;
- s^ = fl(sum_r z^_r): e_s = sum_r e_z + gamma_F sum_r |z^_r|;
- u^ = fl(t^ - fl(xs^ s^)) within e_u = e_t + |xs^| e_s + e_x (|s^| + e_s) + gamma_2 (|t^|
  + |xs^ s^|) + 2 SUBNORMAL of u = W_F^T z - x' s (e_x = r_x |xs^| + SUBNORMAL, r_x the
  relative error of x' over 1 - itself);
- dq^ = fl(c^ u^): c^ (1 + r_c) e_u + r_c c^ |u^| (r_c = LIB / (1 - LIB)) and the product's
  rounding, u (1 + u) |dq^| + SUBNORMAL.
The sum, times SAFETY for the bound's own roundings; infinite where E is (an unresolved
denominator: certified_grad_normalised._unresolved then settles the rows, NaN for 0/0).

Magnitudes. grad.py's feature magnitudes are M(phi_r) = phi_r (1 + |w_r| . |x'| + h)
(Kernel._feature_mags), not |phi_r|, and M(a_ij) = M(phi(q_i)) . M(phi(k_j)): a chain of
non-negative features still. So certified_grad_normalised._magnitudes, given phiM = (phi^ +
psi) (1 + |W_F| |xs^| + h^) (>= M(phi) up to the last bits) in place of the features, gives
M(D_i), M(tbar_i), M'(dphi(q)_i) = c_s sum_j sigma_ij w_ij M'(b_ij) phiM(k_j) (>= grad.py's
sum of M(e_ij) M(phi(k_j)); c_s the spec's scale) and M'(dv_j) = c_s sum_i w_ij M(a_ij)
(sigma_ij + M(D_i) / D_i) |G_i| / D_i, above grad.py's c_s sum_i w_ij (sigma_ij M(a_ij) +
a_ij M(D_i) / D_i) |G_i| / D_i since a_ij <= M(a_ij). Through |J^T| as Kernel.jt does:
M'(dq_i) = c (|W_F|^T (M'(dphi(q)_i) * phiM(q_i)) + |xs^| (M'(dphi(q)_i) . phiM(q_i))),
M'(dk_j) alike, and M'(dg_t) = sum_(s>=t) (phiM(q_s) . M'(dphi(q)_s) + phiM(k_s) .
M'(dphi(k)_s)) (grad.py's M(p_ij) = M(b_ij) M(A_ij); dL/dg's values and bounds are
certified_grad.gate_gradient's). All are upper bounds on grad.py's M, up to the rounding
of M' itself (relative about rho while its chain sums of products do not underflow): M'
<= (1 + M(D_i) / D_i) M term by term for b_ij (about 2 M for dq, dk without a decay and eps
= 0), dv's up to (max phiM / phi)^2 M more.

Not covered: performer-trig. Its features sin, cos are signed, so the chains that bound
the propagated errors (Z, E_k) need |phi| + psi columns, the denominator may be negative or
cancel (the slack |D^| - e_D), and a_ij <= M(a_ij) no longer makes dv's and b_ij's
magnitudes chain sums of the same form: a separate derivation, not a change of features.
Large q or k make the features underflow (phi <= exp(|w_r|^2 / 2) / sqrt(m) never
overflows): rows whose denominator is then not resolved get infinite bounds (no stabiliser
is applied: the spec's features have none).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..specs import Spec, SpecError
from .certified import LIB, SAFETY, SUBNORMAL, U64, Features, float_features, gamma64
from .certified_decay import decayed_sums
from .certified_grad import PROJECTED_MAPS, _flipped, _flipped_logs, gate_gradient
from .certified_grad_normalised import (
    _magnitudes,
    _ones_after,
    _quotient,
    _quotient_terms,
    _reached,
    _run,
    _unresolved,
)

Arrays = dict[str, np.ndarray]


def performer_head(q, k, v, g_out, decay, w, spec: Spec) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes M') of a causal normalised performer-positive
    or performer-hyperbolic spec, W the projection (m, d) (module docstring)."""
    if spec.feature_map not in PROJECTED_MAPS or not spec.normalize or not spec.causal:
        raise SpecError(f"performer_head covers causal normalised {PROJECTED_MAPS}, not {spec}")
    n, d = q.shape
    dv = v.shape[1]
    kind = spec.decay
    chain_spec = spec if kind else replace(spec, decay="gates")  # no decay: gates of 0
    decay = np.zeros(n) if decay is None else decay
    rows = np.arange(n)
    fq = float_features(q, rows, n, w, spec.feature_map)
    fk = float_features(k, rows, n, w, spec.feature_map)
    width = fq.phi.shape[1]

    # the forward: out^ (e_out) and Dt^ (e_D)
    value, total, mag = _run_projected(q, k, v, w, decay, chain_spec, False)
    den, e_den, zero, lost, safe_den, safe_slack, gt, xi, tbar, tau, h, eta = _quotient_terms(
        value, total, mag, g_out, spec, d
    )

    grads, bounds = {}, {}
    # dv: (phi(k), phi(q), [Gt^, xi]) backward, the spec's own features
    cols = np.concatenate([gt, xi], 1)
    value, total, _ = _run_projected(k, q, cols, w, decay, chain_spec, True)
    grads["v"] = value[:, :dv]
    bounds["v"] = (total[:, :dv] + value[:, dv : 2 * dv] + total[:, dv : 2 * dv]) * SAFETY

    identity = replace(chain_spec, feature_map="identity", normalize=False, eps=0.0, scale=1.0)
    every = slice(0, width)
    ones = np.ones((n, 1))
    dphi, e_dphi = {}, {}
    # dphi(q) Dt: P_q = ([G, -tbar^], [v, 1], phi^(k)), and Z for tbar^'s error
    left, right = np.concatenate([g_out, -tbar[:, None]], 1), _ones_after(v)
    value, total, mag = _run(
        left, right, np.concatenate([fk.phi, fk.err], 1), decay, identity, False
    )
    z_value, z_total, _ = _run(ones, ones, fk.phi + fk.err, decay, identity, False)
    e_num = (
        total[:, :width] + mag[:, width : 2 * width] + tau[:, None] * (z_value + z_total)[:, :width]
    )
    dphi["q"], e_dphi["q"] = _quotient(value[:, :width], e_num, safe_den, e_den, safe_slack)
    e_dphi["q"] *= _reached(fk, every, False)
    # dphi(k): P_k = ([v, 1], [Gt^, -h^], phi^(q)), and E_k for Gt^'s and h^'s errors
    left, right = _ones_after(v), np.concatenate([gt, -h[:, None]], 1)
    value, total, mag = _run(
        left, right, np.concatenate([fq.phi, fq.err], 1), decay, identity, True
    )
    err_left, err_right = _ones_after(np.abs(v)), np.concatenate([xi, eta[:, None]], 1)
    e_value, e_total, _ = _run(err_left, err_right, fq.phi + fq.err, decay, identity, True)
    dphi["k"] = value[:, :width]
    e_k = total[:, :width] + mag[:, width : 2 * width] + e_value[:, :width] + e_total[:, :width]
    e_dphi["k"] = e_k * SAFETY * _reached(fq, every, True)

    w_f = _full_projection(w, spec)
    for side, x, f in (("q", q, fq), ("k", k, fk)):
        grads[side], bounds[side] = _through_jacobian(x, w_f, f, dphi[side], e_dphi[side])

    phi_m = {side: _feature_magnitudes(x, w_f, f) for side, x, f in (("q", q, fq), ("k", k, fk))}
    # _magnitudes reads the scale at the features' width: hand it the number
    numeric = replace(spec, scale=spec.scale_for(d))
    mags, m_phi = _magnitudes(phi_m["q"], phi_m["k"], v, g_out, decay, numeric, (den, tbar, lost))
    for side, x in (("q", q), ("k", k)):
        mags[side] = _jacobian_magnitudes(x, w_f, phi_m[side], m_phi[side])
    if spec.gated:
        grads["g"], bounds["g"], _ = gate_gradient(
            (fq.phi, fk.phi), (fq.err, fk.err), dphi, e_dphi, m_phi, False
        )
        # M(p_ij) = M(b_ij) M(A_ij): the features' magnitudes phiM, not |phi|
        terms = np.sum(phi_m["q"] * m_phi["q"] + phi_m["k"] * m_phi["k"], axis=1)
        mags["g"] = np.cumsum(terms[::-1])[::-1]
    _unresolved(grads, bounds, mags, zero, lost)
    return grads, bounds, mags


def _run_projected(left, right, cols, w, decay, spec: Spec, backward: bool):
    """(value, bound, magnitude bound) of decayed_sums with the spec's own features of
    left and right (projection W), on the reversed sequence for `backward`."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
        decay = decay if spec.decay == "constant" else _flipped_logs(decay)
    parts = list(zip(*decayed_sums(left, right, cols, w, decay, spec), strict=True))
    value, total, mag = (np.concatenate(p) for p in parts[2:])
    if backward:
        return value[::-1], total[::-1], mag[::-1]
    return value, total, mag


def _full_projection(w: np.ndarray, spec: Spec) -> np.ndarray:
    """W_F, the rows w_r with phi_r = exp(w_r . x' - h) / sqrt(F'): W, or [W; -W]."""
    return np.concatenate([w, -w]) if spec.feature_map == "performer-hyperbolic" else w


def _scaling(x: np.ndarray) -> tuple[float, np.ndarray]:
    """(c^ = fl(d^(-1/4)), xs^ = fl(x c^)) as certified.performer_arguments forms x'."""
    c = x.shape[1] ** -0.25
    return c, x * c


def _through_jacobian(x, w_f, f: Features, y, e_y):
    """(J_phi(x_i)^T y_i row by row, its bound) for y within e_y (module docstring)."""
    n_features = w_f.shape[0]
    c, xs = _scaling(x)
    aw = np.abs(w_f)
    with np.errstate(over="ignore", invalid="ignore"):
        z = f.phi * y
        az = np.abs(z)
        e_z = (f.phi + f.err) * e_y + f.err * np.abs(y) + U64 * (1 + U64) * az + SUBNORMAL
        t = z @ w_f
        e_t = e_z @ aw + gamma64(n_features) * (az @ aw) + n_features * SUBNORMAL
        s = np.sum(z, axis=1, keepdims=True)
        e_s = np.sum(e_z, axis=1, keepdims=True) + gamma64(n_features) * np.sum(az, axis=1)[:, None]
        p = xs * s
        inner = t - p
        grad = c * inner
        rel_x = (1 + LIB) * (1 + U64) - 1
        axs = np.abs(xs)
        e_x = rel_x / (1 - rel_x) * axs + SUBNORMAL
        a_s = np.abs(s)
        e_inner = e_t + axs * e_s + e_x * (a_s + e_s)
        e_inner += gamma64(2) * (np.abs(t) + np.abs(p)) + 2 * SUBNORMAL
        r_c = LIB / (1 - LIB)
        bound = c * (1 + r_c) * e_inner + r_c * c * np.abs(inner)
        bound += U64 * (1 + U64) * np.abs(grad) + SUBNORMAL
        bound *= SAFETY
    bound[~np.isfinite(bound) | ~np.isfinite(grad)] = np.inf
    return grad, bound


def _feature_magnitudes(x, w_f, f: Features) -> np.ndarray:
    """phiM = (phi^ + psi) (1 + |W_F| |xs^| + h^), an upper bound on grad.py's M(phi)
    (Kernel._feature_mags) but for the last bits."""
    _, xs = _scaling(x)
    half_sq = np.sum(xs * xs, axis=1, keepdims=True) / 2
    with np.errstate(over="ignore", invalid="ignore"):
        return (f.phi + f.err) * (1 + np.abs(xs) @ np.abs(w_f).T + half_sq)


def _jacobian_magnitudes(x, w_f, phi_m, m_phi) -> np.ndarray:
    """M' through |J^T|: c (|W_F|^T (M'(dphi) phiM) + |xs^| (M'(dphi) . phiM))."""
    c = math.pow(x.shape[1], -0.25)
    _, xs = _scaling(x)
    with np.errstate(over="ignore", invalid="ignore"):
        zm = m_phi * phi_m
        return c * (zm @ np.abs(w_f) + np.abs(xs) * np.sum(zm, axis=1, keepdims=True))
