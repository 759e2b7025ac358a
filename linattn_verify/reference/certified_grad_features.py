"""Certified gradients at length of the normalised specs with elementwise, non-negative
features (elu + 1, relu): dL/dq, dL/dk, dL/dv (and dL/dg of the log-gates) of L = sum(out *
G) in float64, O(N), each element with a rigorous bound on its error, and an upper bound M'
on the magnitude M of reference/grad.py's gradient_magnitudes (certified_grad.py runs them
for certified_gradients; its docstring gives the unnormalised identity specs').

Definitions (grad.py's module docstring): a_ij = phi(q_i) . phi(k_j) >= 0, A_ij = c w_ij
a_ij, D_i = eps + sum_(j<=i) A_ij, out_i = sum_j A_ij v_j / D_i, b_ij = G_i . (v_j - out_i)
/ D_i. In the units of the sums, Dt_i = D_i / c = eps / c + sum_j w_ij a_ij (the forward's
denominator, certified._finish), so c cancels everywhere but in eps / c:

    dv_j       = sum_(i>=j) w_ij a_ij Gt_i,                        Gt_i = G_i / Dt_i,
    dphi(q)_i  = (sum_(j<=i) w_ij (G_i . v_j - tbar_i) phi(k_j)) / Dt_i,  tbar_i = G_i . out_i,
    dphi(k)_j  = sum_(i>=j) w_ij (v_j . Gt_i - h_i) phi(q_i),      h_i = tbar_i / Dt_i,
    dq_i = phi'(q_i) dphi(q)_i, dk_j = phi'(k_j) dphi(k)_j  (elementwise; elu: 1 above 0,
    exp(x) = phi(x) at or below; relu: 1 above 0, 0 at or below, torch's subgradient),
    dL/dG_s = phi(q_s) . dphi(q)_s - phi(k_s) . dphi(k)_s   (sum_j p_sj - sum_i p_is with
    p_ij = b_ij A_ij, grad.py), dL/dg_t = sum_(s>=t) dL/dG_s, dL/dg_0 = 0;

channel gates per key channel m: w_ij -> W_ijm in a_ij's channel m for dv and the forward,
and dphi(q)_im, dphi(k)_jm, dL/dG_sm channel by channel (W_ijm as scalar gates). Each sum
is one chain of certified_decay.decayed_sums (left . right times columns, forward or on the
reversed sequence as certified_grad.py runs them): the forward F (phi(q), phi(k), v) and dv
(phi(k), phi(q), Gt^) with the spec's own features, whose error decayed_sums bounds; the
others with identity "features" (exact to decayed_sums) and the features as columns:
P_q = ([G, -tbar^], [v, 1], phi^(k)), P_k = ([v, 1], [Gt^, -h^], phi^(q)), and the non-
negative Z = (1, 1, phi^(k) + psi_k), E_k = ([|v|, 1], [xi, eta], phi^(q) + psi_q) for the
propagated errors.

Bounds (Higham 2002: Lemma 3.1, eq. 3.5 for sums and dots in any order, eq. 3.2's (1 +
delta) products; gradual underflow: a result below 2^-1022 errs by half a SUBNORMAL at
most). decayed_sums bounds |S^ - S(l^, r^, x^)| (its module docstring) for the inputs as
given; the inputs' own errors add, by S(l^, r^, x^) - S(l, r, x) = [S(l^, r^, x^) - S(l^,
r^, x)] + [S(l^, r^, x) - S(l, r, x)]: sum_j w |l^_i . r^_j| psi_j, at most decayed_sums'
magnitude bound of the psi columns, plus sum_j w (|dl_i| . |r^_j| + |l^_i| . |dr_j|) |x_j|,
|x_j| <= x^_j + psi_j:
- Dt^ = fl(S^ + eps / c) within e_D (certified._finish's denominator), slack_i = Dt^_i -
  e_D,i > 0 (else the row is unresolved: every element it reaches gets an infinite bound;
  exactly 0 with e_D = 0, a 0/0 row: NaN where grad.py gives NaN, q_i, the keys j <= i and
  dL/dg_t for t <= i); out^ within e_out (_finish).
- y = G / Dt^ rounded to Gt^: |y| <= yy = (|Gt^| + SUBNORMAL)(1 + 2u), |Gt^ - Gt| <= xi =
  yy (u + e_D / slack) + SUBNORMAL (|y - G / Dt| = |y| |Dt - Dt^| / |Dt|, |Dt| >= slack).
- tbar^ = fl(G . out^): tau = |G| . e_out + gamma_(dv+1) |G| . |out^| + 2 dv SUBNORMAL;
  h^ = fl(tbar^ / Dt^): eta = hh u + (tau + hh e_D) / slack + SUBNORMAL, hh = (|h^| +
  SUBNORMAL)(1 + 2u) (the quotient |a^/b^ - a/b| <= (|da| + |a^/b^| |db|) / (|b^| - |db|)).
- dv: decayed_sums' bound + the xi columns' computed sum plus its bound (sum_i W_ij xi_i
  with the exact W, non-negative terms).
- dphi(q): P_q's bound + its magnitude bound of the psi_k columns + tau_i Z^up_i (Z^up the
  computed Z plus its bound >= sum_j w_ij phi(k_j)), then the quotient by Dt^ as _finish
  divides (its bound formula, one rounding more).
- dphi(k): P_k's bound + its psi_q columns' magnitude bound + E_k^up (E_k's computed sum
  plus its bound >= sum_i w_ij (|v_j| . xi_i + eta_i) phi(q_i)).
- dq = fl(phi'^ dphi^): phi' exact (1 or 0) but elu's exp(x) = phi^(x) within psi: error
  (phi'^ + psi) E + psi |dphi^| and the product's rounding.
- dL/dg: certified_grad.gate_gradient with the features' psi.
Every bound is multiplied by SAFETY for its own roundings (certified.py).

Magnitudes. grad.py's M(b_ij) = (|G_i| . |v_j| + M(tbar_i) + |b_ij| M(D_i)) / D_i holds
|b_ij|, not a sum of products of row and column factors: no chain sums it in O(N). M' takes
|b_ij| <= (|G_i| . |v_j| + |tbar_i|) / D_i instead, so M <= M' <= (1 + M(D_i) / D_i) M term
by term (2 M without a decay and eps = 0): M'(b_ij) = alpha_i |G_i| . |v_j| + beta_i with
alpha_i = (1 + M(D_i) / D_i) / D_i, beta_i = (M(tbar_i) + |tbar_i| M(D_i) / D_i) / D_i,
M(D_i) = eps + c sum_j sigma_ij w_ij a_ij, M(tbar_i) = (c |G_i| . sum_j sigma_ij w_ij a_ij
|v_j| + |tbar_i| M(D_i)) / D_i (sigma_ij = 1 + M(ln w_ij), certified_grad.py's). Then
M'(dphi(q)_i) = c sum_j sigma_ij w_ij M'(b_ij) phi(k_j), M'(dphi(k)_j) alike over i,
M(dv_j) = c sum_i w_ij a_ij (sigma_ij + M(D_i) / D_i) |G_i| / D_i (exact: r_ij = A_ij /
D_i >= 0), M'(dq) = phi' M'(dphi(q)), and M'(dg_t) = sum_(s>=t) (phi(q_s) . M'(dphi(q)_s)
+ phi(k_s) . M'(dphi(k)_s)), chain sums of non-negative terms (certified_grad._abs_sums,
_constant_abs_sums). dv's M is grad.py's; dq's, dk's and dg's are M'. Where a bound is
infinite (an unresolved denominator reaches the element) M' is not meaningful either.

Non-causal (no decay: w_ij = 1, sigma_ij = 1; grad.py with every key allowed): the same
formulas with every sum over all j (all i), D_i = eps + c sum_j a_ij. Each chain runs as
certified_grad._total_run runs it (certified_grad.py's "Non-causal": one causal chain of
decayed_sums over 2N tokens, keys first, queries after, the padding features exactly 0),
so every bound above holds as derived; the magnitudes' chain sums become totals,
|l_i| (sum_j |r_j| |x_j|^T) (certified_grad._total_abs_sums). A column of dphi gets a
zero bound where every feature of that column is exactly 0 at every token (not only
up to i). An unresolved row i reaches every key: dk, dv of all keys get an infinite bound
(NaN and bound 0 where D_i is exactly 0, grad.py's non-causal NaN).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..specs import RSQRT_D, Spec
from .certified import LIB, SAFETY, SUBNORMAL, U64, _finish, _rounding, float_features, gamma64
from .certified_decay import decayed_sums
from .certified_grad import (
    _abs_sums,
    _constant_abs_sums,
    _flipped,
    _flipped_logs,
    _spread,
    _total_abs_sums,
    _total_run,
    gate_gradient,
)

Arrays = dict[str, np.ndarray]


def normalised_head(q, k, v, g_out, decay, spec: Spec) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes M') of a normalised elu or relu spec (module
    docstring)."""
    n, d = q.shape
    dv = v.shape[1]
    kind = spec.decay
    # no decay: gates of 0 (non-causal: _run's totals)
    chain_spec = spec if kind or not spec.causal else replace(spec, decay="gates")
    reached = _reached if spec.causal else _reached_anywhere
    decay = np.zeros(n) if decay is None else decay
    rows = np.arange(n)
    fq = float_features(q, rows, n, None, spec.feature_map)
    fk = float_features(k, np.arange(k.shape[0]), n, None, spec.feature_map)  # Nk keys

    # the forward: out^ (e_out) and Dt^ (e_D)
    value, total, mag = _run(q, k, v, decay, chain_spec, False)
    den, e_den, zero, lost, safe_den, safe_slack, gt, xi, tbar, tau, h, eta = _quotient_terms(
        value, total, mag, g_out, spec, d
    )

    grads, bounds = {}, {}
    # dv: (phi(k), phi(q), [Gt^, xi]) backward, the spec's own features
    value, total, _ = _run(k, q, np.concatenate([gt, xi], 1), decay, chain_spec, True)
    grads["v"] = value[:, :dv]
    bounds["v"] = (total[:, :dv] + value[:, dv : 2 * dv] + total[:, dv : 2 * dv]) * SAFETY

    identity = replace(chain_spec, feature_map="identity", normalize=False, eps=0.0, scale=1.0)
    left_q, right_q = np.concatenate([g_out, -tbar[:, None]], 1), _ones_after(v)
    left_k, right_k = _ones_after(v), np.concatenate([gt, -h[:, None]], 1)
    err_left_k, err_right_k = _ones_after(np.abs(v)), np.concatenate([xi, eta[:, None]], 1)
    ones, ones_k = np.ones((n, 1)), np.ones((k.shape[0], 1))
    dphi, e_dphi = {}, {}
    if kind == "channel-gates":
        scalar = replace(identity, decay="gates")
        channels = [(slice(m, m + 1), decay[:, m], scalar) for m in range(d)]
    else:
        channels = [(slice(0, d), decay, identity)]
    for side, x in (("q", q), ("k", k)):
        dphi[side], e_dphi[side] = np.empty(x.shape), np.empty(x.shape)
    for at, gates, sub in channels:
        width = at.stop - at.start
        # dphi(q) Dt: P_q, and Z for tbar^'s error
        cols = np.concatenate([fk.phi[:, at], fk.err[:, at]], 1)
        value, total, mag = _run(left_q, right_q, cols, gates, sub, False)
        z_cols = fk.phi[:, at] + fk.err[:, at]
        z_value, z_total, _ = _run(ones, ones_k, z_cols, gates, sub, False)
        z_up = z_value[:, :width] + z_total[:, :width]
        e_num = total[:, :width] + mag[:, width : 2 * width] + tau[:, None] * z_up
        dphi["q"][:, at], e_dphi["q"][:, at] = _quotient(
            value[:, :width], e_num, safe_den, e_den, safe_slack
        )
        e_dphi["q"][:, at] *= reached(fk, at, False)
        # dphi(k): P_k, and E_k for Gt^'s and h^'s errors
        cols = np.concatenate([fq.phi[:, at], fq.err[:, at]], 1)
        value, total, mag = _run(left_k, right_k, cols, gates, sub, True)
        up = fq.phi[:, at] + fq.err[:, at]
        e_value, e_total, _ = _run(err_left_k, err_right_k, up, gates, sub, True)
        dphi["k"][:, at] = value[:, :width]
        e_k = total[:, :width] + mag[:, width : 2 * width]
        e_dphi["k"][:, at] = (e_k + e_value[:, :width] + e_total[:, :width]) * SAFETY
        e_dphi["k"][:, at] *= reached(fq, at, True)
    for side, x, f in (("q", q, fq), ("k", k, fk)):
        grads[side], bounds[side] = _through_derivative(
            spec.feature_map, x, f, dphi[side], e_dphi[side]
        )

    mags, m_phi = _magnitudes(fq.phi, fk.phi, v, g_out, decay, spec, (den, tbar, lost))
    for side, x, f in (("q", q, fq), ("k", k, fk)):
        below = _derivative_factor(spec.feature_map, f.phi) * m_phi[side]
        mags[side] = np.where(x > 0, m_phi[side], below)
        if spec.feature_map == "elu":
            mags[side] = _row_scale(x, mags[side])
    if spec.gated:
        channel = kind == "channel-gates"
        grads["g"], bounds["g"], mags["g"] = gate_gradient(
            (fq.phi, fk.phi), (fq.err, fk.err), dphi, e_dphi, m_phi, channel
        )
    _unresolved(grads, bounds, mags, zero, lost)
    if not spec.causal:
        _unresolved_keys(grads, bounds, mags, zero, lost)
    return grads, bounds, mags


def _reached(f, at: slice, backward: bool) -> np.ndarray:
    """1 where a feature of the columns `at` of f (phi^ or its error bound) is nonzero at a
    token j <= i (j >= i, backward), else 0: every term of the sum is then a product with 0,
    exactly 0, computed and exact (no bound needed)."""
    nonzero = (f.phi[:, at] != 0) | (f.err[:, at] != 0)
    if backward:
        return np.logical_or.accumulate(nonzero[::-1], axis=0)[::-1].astype(np.float64)
    return np.logical_or.accumulate(nonzero, axis=0).astype(np.float64)


def _reached_anywhere(f, at: slice, backward: bool) -> np.ndarray:
    """_reached for a non-causal sum, (1, columns) for every row: 1 where a feature of the
    columns `at` of f is nonzero at any token (backward alike)."""
    nonzero = np.any((f.phi[:, at] != 0) | (f.err[:, at] != 0), axis=0, keepdims=True)
    return nonzero.astype(np.float64)


def _ones_after(a: np.ndarray) -> np.ndarray:
    """[a, 1] row by row."""
    return np.concatenate([a, np.ones((a.shape[0], 1))], 1)


def _run(left, right, cols, decay, spec: Spec, backward: bool):
    """(value, bound, magnitude bound) of decayed_sums for the whole head (columns: cols,
    then the ones' sum), on the reversed sequence for `backward`; non-causal specs: over
    every token (certified_grad._total_run)."""
    if not spec.causal:
        return _total_run(left, right, cols, spec)
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
        decay = decay if spec.decay == "constant" else _flipped_logs(decay)
    parts = list(zip(*decayed_sums(left, right, cols, None, decay, spec), strict=True))
    value, total, mag = (np.concatenate(p) for p in parts[2:])
    if backward:
        return value[::-1], total[::-1], mag[::-1]
    return value, total, mag


def _quotient_terms(value, total, mag, g_out, spec: Spec, d: int):
    """The forward's out^ and Dt^ (e_D) from its sums, and the quotient rule's inputs with
    their bounds (module docstring: Gt^ within xi, tbar^ within tau, h^ within eta), 0 on
    rows whose denominator is not resolved (0/0 ones too): (den, e_den, zero, lost,
    safe_den, safe_slack, gt, xi, tbar, tau, h, eta)."""
    dv = g_out.shape[1]
    out, e_out, _ = _finish(value, total, mag, spec.eps, 0.0, spec, d)
    den, e_den = _denominator(value, total, spec, d)
    with np.errstate(invalid="ignore"):
        slack = den - e_den
    zero = (den == 0) & (e_den == 0)  # 0/0 rows
    lost = ~(slack > 0)  # rows whose denominator is not resolved (0/0 ones too)
    safe_den = np.where(lost, 1.0, den)
    safe_slack = np.where(lost, 1.0, slack)
    rel_d = np.where(lost, 0.0, e_den / safe_slack)[:, None]
    out_ok = np.where(lost[:, None], 0.0, out)
    e_out_ok = np.where(lost[:, None], 0.0, e_out)

    ag = np.abs(g_out)
    gt = g_out / safe_den[:, None]
    yy = (np.abs(gt) + SUBNORMAL) * (1 + 2 * U64)
    xi = (yy * (U64 + rel_d) + SUBNORMAL) * SAFETY
    tbar = np.sum(g_out * out_ok, axis=1)
    tau = np.sum(ag * e_out_ok, axis=1) + gamma64(dv + 1) * np.sum(ag * np.abs(out_ok), axis=1)
    tau = (tau + 2 * dv * SUBNORMAL) * SAFETY
    h = tbar / safe_den
    hh = (np.abs(h) + SUBNORMAL) * (1 + 2 * U64)
    eta = (hh * U64 + tau / safe_slack + hh * rel_d[:, 0] + SUBNORMAL) * SAFETY
    gt[lost], xi[lost], tbar[lost], tau[lost], h[lost], eta[lost] = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return den, e_den, zero, lost, safe_den, safe_slack, gt, xi, tbar, tau, h, eta


def _denominator(value, total, spec: Spec, d: int):
    """(Dt^ = S^ + eps / c, a bound on its error) as certified._finish forms them."""
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    eps_c = spec.eps / c if c != 1.0 else spec.eps
    eps_rel = (1 + U64) / (1 - c_rel) - 1 if c != 1.0 else 0.0
    den = value[:, -1] + eps_c
    err = total[:, -1] + abs(eps_c) * eps_rel * SAFETY + U64 * np.abs(den)
    return den, err


def _quotient(num, e_num, den, e_den, slack):
    """(fl(num / den), its bound) for num within e_num, den within e_den (slack = den -
    e_den > 0), as certified._finish bounds out."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = num / den[:, None]
        bound = (e_num + np.abs(out) * (1 + U64) * e_den[:, None]) * (
            (1 + U64) * SAFETY / slack[:, None]
        )
        bound += _rounding(out, bound)
    bound[~np.isfinite(bound) | ~np.isfinite(out)] = np.inf
    return out, bound


def _row_scale(x: np.ndarray, mags: np.ndarray) -> np.ndarray:
    """M of elu rows whose every entry is <= 0, their first largest entry's plus the row's
    (grad.py's Kernel.jt: a row taken as exp(x - top) exp(top), top's gradient landing
    there)."""
    rows = np.flatnonzero(np.all(x <= 0, axis=1))
    out = mags.copy()
    out[rows, np.argmax(x[rows], axis=1)] += mags[rows].sum(axis=1)
    return out


def _derivative_factor(name: str, phi: np.ndarray) -> np.ndarray:
    """phi'(x) at or below 0: exp(x) = phi(x) for elu, 0 for relu."""
    return phi if name == "elu" else np.zeros_like(phi)


def _through_derivative(name: str, x, f, dphi, e_dphi):
    """(phi'(x) dphi, its bound) elementwise (module docstring)."""
    grad, bound = dphi.copy(), e_dphi.copy()
    below = x <= 0
    if name == "relu":
        grad[below], bound[below] = 0.0, 0.0
        return grad, bound
    with np.errstate(over="ignore", invalid="ignore"):
        prod = f.phi * dphi
        err = (f.phi + f.err) * e_dphi + f.err * np.abs(dphi)
        err = (err * (1 + U64) + _rounding(prod, err)) * SAFETY
    err[~np.isfinite(err)] = np.inf
    grad[below], bound[below] = prod[below], err[below]
    return grad, bound


def _magnitudes(fq, fk, v, g_out, decay, spec: Spec, forward):
    """({"v": M(dv)}, {"q": M'(dphi(q)), "k": M'(dphi(k))}) (module docstring)."""
    den, tbar, lost = forward
    n, d = fq.shape
    c = spec.scale_for(d)
    kind = spec.decay
    av, ag = np.abs(v), np.abs(g_out)
    if not spec.causal:  # no decay, every token
        spread = np.ones((n, 1))

        def nonnegative(left, right, cols, backward):
            return _total_abs_sums(left, right, cols)

        plain = nonnegative

    elif kind == "constant":
        log_gamma = -math.log(float(decay))
        spread = np.ones((n, 1))

        def nonnegative(left, right, cols, backward):
            return _constant_abs_sums(log_gamma, left, right, cols, backward)

        flat_logs = np.full((n, 1), -log_gamma)

        def plain(left, right, cols, backward):
            return _abs_sums(flat_logs, left, right, cols, backward)

    else:
        logs = np.zeros((n, 1)) if kind is None else decay.reshape(n, -1)
        spread = _spread(logs)[:, None] if kind else np.ones((n, 1))

        def nonnegative(left, right, cols, backward):
            return _abs_sums(logs, left, right, cols, backward)

        plain = nonnegative

    safe = np.where(lost, 1.0, c * den)[:, None]  # D_i
    sums = spread * nonnegative(fq, fk, _ones_after(av), False)
    m_den = spec.eps + c * sums[:, -1:]
    ratio = m_den / safe  # M(D_i) / D_i
    a_tbar = np.abs(tbar)[:, None]
    m_tbar = (c * np.sum(ag * sums[:, :-1], axis=1, keepdims=True) + a_tbar * m_den) / safe
    alpha = (1 + ratio) / safe
    beta = (m_tbar + a_tbar * ratio) / safe
    alpha[lost], beta[lost] = 0.0, 0.0
    left = np.concatenate([alpha * ag, beta], 1)
    right_v = _ones_after(av)
    m_phi = {"q": np.empty((n, d)), "k": np.empty(fk.shape)}
    if kind == "channel-gates":
        for m in range(d):
            at, channel_logs = slice(m, m + 1), logs[:, m : m + 1]
            forward = _abs_sums(channel_logs, left, right_v, fk[:, at], False)
            m_phi["q"][:, at] = c * spread * forward
            m_phi["k"][:, at] = c * _abs_sums(channel_logs, right_v, spread * left, fq[:, at], True)
    else:
        m_phi["q"] = c * spread * nonnegative(left, right_v, fk, False)
        m_phi["k"] = c * nonnegative(right_v, spread * left, fq, True)
    scaled_g = ag / safe
    scaled_g[lost] = 0.0
    if kind == "constant":
        m_v = nonnegative(fk, fq, scaled_g, True) + plain(fk, fq, scaled_g * ratio, True)
    else:
        m_v = plain(fk, fq, scaled_g * (spread + ratio), True)
    return {"v": c * m_v}, m_phi


def _unresolved_keys(grads: Arrays, bounds: Arrays, mags: Arrays, zero, lost) -> None:
    """Non-causal, after _unresolved: an unresolved row reaches every key, so dk and dv
    get an infinite bound everywhere (NaN, bound 0, where a denominator is exactly 0)."""
    for rows, nan in ((lost, False), (zero, True)):
        if not rows.any():
            continue
        for name in ("k", "v"):
            if nan:
                grads[name][:], mags[name][:], bounds[name][:] = np.nan, np.nan, 0.0
            else:
                bounds[name][:] = np.inf


def _unresolved(grads: Arrays, bounds: Arrays, mags: Arrays, zero, lost) -> None:
    """Rows whose denominator is not resolved: infinite bounds on q_i, the keys j <= i and
    dL/dg_t for t <= i; where it is exactly 0 (0/0), NaN there (grad.py's)."""
    for rows, nan in ((lost, False), (zero, True)):
        if not rows.any():
            continue
        last = int(np.flatnonzero(rows)[-1]) + 1
        at = {"q": rows, "k": slice(0, last), "v": slice(0, last), "g": slice(0, last)}
        for name in grads:
            if nan:
                grads[name][at[name]] = np.nan
                mags[name][at[name]] = np.nan
                bounds[name][at[name]] = 0.0
            else:
                bounds[name][at[name]] = np.inf
