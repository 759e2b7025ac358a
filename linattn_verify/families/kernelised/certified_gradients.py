"""Certified gradients at length of the kernelised specs (every feature map, normalised or
not, causal or not, any eps, scale and decay; not the delta rule): dL/dq, dL/dk, dL/dv
(and dL/dg of the log-gates) of L = sum(out * G) in float64, O(N), each element with a
rigorous bound on its error, and an upper bound M' on the magnitude M of
reference/grad.py's gradient_magnitudes. The per-map part (the features, their magnitudes,
J_phi^T) is certified_gradient_maps.py's; reference/certified_grad.py runs the heads.

Definitions (grad.py's module docstring): a_ij = phi(q_i) . phi(k_j), A_ij = c w_ij a_ij,
D_i = eps + sum_(j<=i) A_ij, out_i = sum_j A_ij v_j / D_i, b_ij = G_i . (v_j - out_i) / D_i
(unnormalised: D_i = 1, out_i = sum_j A_ij v_j, b_ij = G_i . v_j). Normalised, in the
units of the sums, Dt_i = D_i / c = eps / c + sum_j w_ij a_ij (the forward's denominator,
certified._finish), so c cancels everywhere but in eps / c:

    dv_j       = sum_(i>=j) w_ij a_ij Gt_i,                        Gt_i = G_i / Dt_i,
    dphi(q)_i  = (sum_(j<=i) w_ij (G_i . v_j - tbar_i) phi(k_j)) / Dt_i,  tbar_i = G_i . out_i,
    dphi(k)_j  = sum_(i>=j) w_ij (v_j . Gt_i - h_i) phi(q_i),      h_i = tbar_i / Dt_i,
    dq_i = J_phi(q_i)^T dphi(q)_i, dk_j = J_phi(k_j)^T dphi(k)_j  (certified_gradient_maps.py),
    dL/dG_s = phi(q_s) . dphi(q)_s - phi(k_s) . dphi(k)_s   (sum_j p_sj - sum_i p_is with
    p_ij = b_ij A_ij, grad.py), dL/dg_t = sum_(s>=t) dL/dG_s, dL/dg_0 = 0;

unnormalised, the same with Gt_i = c G_i, tbar_i = h_i = 0 and dphi(q)_i = c sum_(j<=i)
w_ij (G_i . v_j) phi(k_j). Channel gates (identity, elu, relu) per key channel m: w_ij ->
W_ijm in a_ij's channel m for dv and the forward, and dphi(q)_im, dphi(k)_jm, dL/dG_sm
channel by channel (W_ijm as scalar gates). Each sum is one chain of
certified_decay.decayed_sums (left . right times columns; dk and dv on the reversed
sequence, j' = N-1-j, w_ij = exp(l'_(i'+1) + ... + l'_(j')) for the log-decays l'_t' =
l_(N-t'), l'_0 unused; no decay: log-gates of 0, every weight exactly 1): the forward F
(phi(q), phi(k), v) and dv (phi(k), phi(q), Gt^) with the features as computed, whose
error decayed_sums bounds; the others with exact "features" (identity) and the features as
columns: P_q = ([G, -tbar^], [v, 1], phi^(k)), P_k = ([v, 1], [Gt^, -h^], phi^(q)), and
the non-negative Z = (1, 1, |phi^(k)| + psi_k), E_k = ([|v|, 1], [xi, eta], |phi^(q)| +
psi_q), X = (|phi^(k)| + psi_k, |phi^(q)| + psi_q, xi) for the propagated errors.

Bounds (Higham 2002: Lemma 3.1, eq. 3.5 for sums and dots in any order, eq. 3.2's (1 +
delta) products; gradual underflow: a result below 2^-1022 errs by half a SUBNORMAL at
most). decayed_sums bounds |S^ - S(l, r, x^)| (its module docstring: the features' errors
included) for the columns as given; the columns' own errors add, sum_j w |l_i . r_j| psi_j,
at most its magnitude bound of the psi columns (exact features) or the computed X chain
plus its bound (|a_ij| <= (|phi^(q_i)| + psi) . (|phi^(k_j)| + psi)); and sum_j w (|dl_i| .
|r_j| + |l_i| . |dr_j|) |x_j| with |x_j| <= |x^_j| + psi_j:
- Dt^ = fl(S^ + eps / c) within e_D (certified._finish's denominator), slack_i = |Dt^_i| -
  e_D,i > 0 (else the row is unresolved: every element it reaches gets an infinite bound;
  exactly 0 with e_D = 0 for a positive map, a 0/0 row: NaN where grad.py gives NaN, q_i,
  the keys j <= i and dL/dg_t for t <= i); out^ within e_out (_finish).
- y = G / Dt^ rounded to Gt^: |y| <= yy = (|Gt^| + SUBNORMAL)(1 + 2u), |Gt^ - Gt| <= xi =
  yy (u + e_D / slack) + SUBNORMAL (|y - G / Dt| = |y| |Dt - Dt^| / |Dt|, |Dt| >= slack);
  unnormalised, Gt^ = fl(c^ G): xi = yy (u + r_c) + SUBNORMAL, r_c = c's relative error
  over 1 - itself (LIB for d^-0.5, else 0).
- tbar^ = fl(G . out^): tau = |G| . e_out + gamma_(dv+1) |G| . |out^| + 2 dv SUBNORMAL;
  h^ = fl(tbar^ / Dt^): eta = hh u + (tau + hh e_D) / slack + SUBNORMAL, hh = (|h^| +
  SUBNORMAL)(1 + 2u) (the quotient |a^/b^ - a/b| <= (|da| + |a^/b^| |db|) / (|b^| - |db|)).
- dv: decayed_sums' bound + the X chain's computed sum plus its bound.
- dphi(q): P_q's bound + its magnitude bound of the psi_k columns + tau_i Z^up_i (Z^up the
  computed Z plus its bound >= sum_j w_ij |phi(k_j)|), then the quotient by Dt^ as _finish
  divides (its bound formula, one rounding more); unnormalised, the product by c as _finish
  scales.
- dphi(k): P_k's bound + its psi_q columns' magnitude bound + E_k^up (E_k's computed sum
  plus its bound >= sum_i w_ij (|v_j| . xi_i + eta_i) |phi(q_i)|).
- dq, dk: certified_gradient_maps.py's J^T and its bound.
- dL/dg: each computed x^_s = fl(phi^(q_s) . dphi^(q)_s - phi^(k_s) . dphi^(k)_s) is
  within e_s = (|phi^(q_s)| + psi) . E_dq,s + psi . |dphi^(q)_s| + (the same for k) +
  gamma_(F+1) (|phi^(q_s)| . |dphi^(q)_s| + |phi^(k_s)| . |dphi^(k)_s|) + 4 F SUBNORMAL (a
  dot in any order; its products may underflow), and the reverse cumulative sum of N terms
  errs by gamma_N sum_(s>=t) |x^_s| (Lemma 3.1): |dg^_t - dg_t| <= (sum_(s>=t) e_s +
  gamma_N sum_(s>=t) |x^_s|) / (1 - gamma_N), the sums of non-negative terms computed,
  hence the division.
Every bound is multiplied by SAFETY for its own roundings (certified.py).

Magnitudes. grad.py's M(b_ij) = (|G_i| . |v_j| + M(tbar_i) + |b_ij| M(D_i)) / |D_i| holds
|b_ij|, not a sum of products of row and column factors: no chain sums it in O(N). M' takes
|b_ij| <= (|G_i| . |v_j| + |tbar_i|) / |D_i| instead, so M <= M' <= (1 + M(D_i) / |D_i|) M
term by term (2 M without a decay and eps = 0 for non-negative features, unbounded where
signed ones cancel in D_i; unnormalised M(b_ij) = |G_i| . |v_j| and M' = M): M'(b_ij) =
alpha_i |G_i| . |v_j| + beta_i with alpha_i = (1 + M(D_i) / |D_i|) / |D_i|,
beta_i = (M(tbar_i) + |tbar_i| M(D_i) / |D_i|) / |D_i|, M(D_i) = eps + c sum_j sigma_ij
w_ij M(a_ij), M(a_ij) = phiM(q_i) . phiM(k_j) (grad.py's; phiM = |phi| but for the Performer
maps, certified_gradient_maps.py), M(tbar_i) = (c |G_i| . sum_j sigma_ij w_ij M(a_ij) |v_j| +
|tbar_i| M(D_i)) / |D_i|, sigma_ij = 1 + M(ln w_ij): 1 without a decay, 1 + (i - j) |ln
gamma| for a constant one, 1 + 2 sum_(t<=i) |g_t| for gates, 1 + 2 max_m sum_(t<=i) |g_tm|
for channel gates; |D_i| is taken as its lower bound c slack_i and |tbar_i| as |tbar^_i| +
tau_i, so that M' >= M but for the chain sums' own roundings. Then M'(dphi(q)_i) = c sum_j
sigma_ij w_ij M'(b_ij) phiM(k_j),
M'(dphi(k)_j) alike over i, M'(dv_j) = c sum_i w_ij (sigma_ij M(a_ij) + a+_ij M(D_i) /
|D_i|) |G_i| / |D_i| with a+_ij = (|phi^(q_i)| + psi) . (|phi^(k_j)| + psi) >= |a_ij|
(grad.py's, but for a+ in place of |a|: equal to the last bits for elementwise features),
M'(dq) through
|J^T| (certified_gradient_maps.py), and M'(dg_t) = sum_(s>=t) (phiM(q_s) . M'(dphi(q)_s) +
phiM(k_s) . M'(dphi(k)_s)) (per channel for channel gates), chain sums of non-negative terms
in float64 (relative error about rho): _abs_sums, and for a constant decay
_constant_abs_sums by chunks of CHUNK rows (in-chunk pairs directly, earlier keys through
two states, sum_j gamma^(e-j) |r_j| |x_j| and the same times (e - j) |ln gamma|, e the
chunk's last row before, so that (i - j) = (i - e) + (e - j) splits into non-negative
parts). Where a bound is infinite (an unresolved denominator reaches the element) M' is not
meaningful either.

Non-causal (no decay: w_ij = 1, sigma_ij = 1; grad.py with every key allowed): the same
formulas with every sum over all j (all i). Each chain runs as one causal chain of
decayed_sums on 2N tokens (_total_run), the keys first and the queries after: token t < N
carries (a zero left feature, r_t, x_t), token N + i carries (l_i, a zero right feature, a
zero column), every feature given with its bound and the padding exactly 0 with bound 0, so
row N + i's causal sum is exactly the non-causal one plus terms with a zero factor, and
every bound above holds as derived (decayed_sums' depth counted for 2N keys). A zero
factor's product is exactly 0 unless the other factor is infinite; then the bound is
infinite too. The magnitudes' chain sums become totals, |l_i| (sum_j |r_j| |x_j|^T)
(_total_abs_sums). A column of dphi gets a zero bound where every feature of that column is
exactly 0 at every token (not only up to i). An unresolved row i reaches every key: dk, dv
of all keys get an infinite bound (NaN and bound 0 where D_i is exactly 0, grad.py's
non-causal NaN).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ...inputs import AttentionInputs
from ...reference import certified_decay as cd  # CHUNK, GROUP read at each call (tests shrink them)
from ...reference import certified_grad
from ...reference.certified import (
    SAFETY,
    SUBNORMAL,
    Features,
    gamma64,
)
from ...reference.certified_decay import Factors, chain, decayed_sums
from ...reference.certified_quotients import _quotient, _quotient_terms, _scaled, _scaled_terms
from ...specs import Spec
from .certified_gradient_maps import MapRows

Arrays = dict[str, np.ndarray]


def certified_gradients(x: AttentionInputs, spec: Spec, g_out: np.ndarray):
    """reference/certified_grad.py's (grads, bounds, magnitudes M') of a kernelised spec
    (decayed or channel-gated too), each head by feature_head."""
    return certified_grad.certified_gradients(x, spec, g_out, feature_head)


def feature_head(q, k, v, g_out, decay, w, spec: Spec) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes M') of a kernelised spec, W the Performer maps'
    projection (module docstring)."""
    n, d = q.shape
    dv = v.shape[1]
    kind = spec.decay
    decay = np.zeros(n) if decay is None else decay  # no decay: log-gates of 0
    reached = _reached if spec.causal else _reached_anywhere
    big_m = max(n, k.shape[0])
    rows = {side: MapRows.of(spec.feature_map, x, w, big_m) for side, x in (("q", q), ("k", k))}
    fq, fk = rows["q"].f, rows["k"].f

    # the forward: out^ (e_out) and Dt^ (e_D)
    value, total, mag = _run(fq, fk, v, decay, spec, False)
    if spec.normalize:
        terms = _quotient_terms(value, total, mag, g_out, spec, d)
    else:
        terms = _scaled_terms(g_out, spec, d)
    _, e_den, zero, lost, safe_den, safe_slack, gt, xi, tbar, tau, h, eta = terms

    grads, bounds = {}, {}
    identity = replace(spec, feature_map="identity", normalize=False, eps=0.0, scale=1.0)
    up = {side: _exact(np.abs(f.phi) + f.err) for side, f in (("q", fq), ("k", fk))}
    # dv: (phi(k), phi(q), Gt^) backward, the features as computed; X for xi
    value, total, _ = _run(fk, fq, gt, decay, spec, True)
    x_value, x_total, _ = _run(up["k"], up["q"], xi, decay, identity, True)
    grads["v"] = value[:, :dv]
    bounds["v"] = (total[:, :dv] + x_value[:, :dv] + x_total[:, :dv]) * SAFETY

    left_q, right_q = _exact(np.concatenate([g_out, -tbar[:, None]], 1)), _exact(_ones_after(v))
    left_k, right_k = _exact(_ones_after(v)), _exact(np.concatenate([gt, -h[:, None]], 1))
    err_left_k = _exact(_ones_after(np.abs(v)))
    err_right_k = _exact(np.concatenate([xi, eta[:, None]], 1))
    ones, ones_k = _exact(np.ones((n, 1))), _exact(np.ones((k.shape[0], 1)))
    dphi, e_dphi = {}, {}
    if kind == "channel-gates":
        scalar = replace(identity, decay="gates")
        channels = [(slice(m, m + 1), decay[:, m], scalar) for m in range(d)]
    else:
        channels = [(slice(0, fq.phi.shape[1]), decay, identity)]
    for side, f in (("q", fq), ("k", fk)):
        dphi[side], e_dphi[side] = np.empty(f.phi.shape), np.empty(f.phi.shape)
    for at, gates, sub in channels:
        width = at.stop - at.start
        # dphi(q) Dt (or / c): P_q, and Z for tbar^'s error
        cols = np.concatenate([fk.phi[:, at], fk.err[:, at]], 1)
        value, total, mag = _run(left_q, right_q, cols, gates, sub, False)
        e_num = total[:, :width] + mag[:, width : 2 * width]
        if spec.normalize:
            z_value, z_total, _ = _run(ones, ones_k, up["k"].phi[:, at], gates, sub, False)
            e_num = e_num + tau[:, None] * (z_value[:, :width] + z_total[:, :width])
            dphi["q"][:, at], e_dphi["q"][:, at] = _quotient(
                value[:, :width], e_num, safe_den, e_den, safe_slack
            )
        else:
            dphi["q"][:, at], e_dphi["q"][:, at] = _scaled(value[:, :width], e_num, spec, d)
        e_dphi["q"][:, at] *= reached(fk, at, False)
        # dphi(k): P_k, and E_k for Gt^'s and h^'s errors
        cols = np.concatenate([fq.phi[:, at], fq.err[:, at]], 1)
        value, total, mag = _run(left_k, right_k, cols, gates, sub, True)
        e_value, e_total, _ = _run(err_left_k, err_right_k, up["q"].phi[:, at], gates, sub, True)
        dphi["k"][:, at] = value[:, :width]
        e_k = total[:, :width] + mag[:, width : 2 * width]
        e_dphi["k"][:, at] = (e_k + e_value[:, :width] + e_total[:, :width]) * SAFETY
        e_dphi["k"][:, at] *= reached(fq, at, True)
    for side in ("q", "k"):
        grads[side], bounds[side] = rows[side].through(dphi[side], e_dphi[side])

    phi_m = {side: rows[side].phi_m for side in rows}
    c = spec.scale_for(d)
    features = (phi_m, {side: up[side].phi for side in up})
    forward = (safe_slack, np.abs(tbar) + tau, lost)  # |Dt| and |tbar| bounded below, above
    mags, m_phi = _magnitudes(features, v, g_out, decay, spec, c, forward)
    for side in ("q", "k"):
        mags[side] = rows[side].through_magnitudes(m_phi[side])
    if spec.gated:
        channel = kind == "channel-gates"
        grads["g"], bounds["g"], mags["g"] = gate_gradient(
            (fq, fk), dphi, e_dphi, (phi_m["q"] * m_phi["q"], phi_m["k"] * m_phi["k"]), channel
        )
    _unresolved(grads, bounds, mags, zero, lost)
    if not spec.causal:
        _unresolved_keys(grads, bounds, mags, zero, lost)
    return grads, bounds, mags


def _exact(a: np.ndarray) -> Features:
    """a as features without error (an identity chain's left, right or columns)."""
    return Features(a, np.zeros_like(a))


def _reached(f: Features, at: slice, backward: bool) -> np.ndarray:
    """1 where a feature of the columns `at` of f (phi^ or its error bound) is nonzero at a
    token j <= i (j >= i, backward), else 0: every term of the sum is then a product with 0,
    exactly 0, computed and exact (no bound needed)."""
    nonzero = (f.phi[:, at] != 0) | (f.err[:, at] != 0)
    if backward:
        return np.logical_or.accumulate(nonzero[::-1], axis=0)[::-1].astype(np.float64)
    return np.logical_or.accumulate(nonzero, axis=0).astype(np.float64)


def _reached_anywhere(f: Features, at: slice, backward: bool) -> np.ndarray:
    """_reached for a non-causal sum, (1, columns) for every row: 1 where a feature of the
    columns `at` of f is nonzero at any token (backward alike)."""
    nonzero = np.any((f.phi[:, at] != 0) | (f.err[:, at] != 0), axis=0, keepdims=True)
    return nonzero.astype(np.float64)


def _ones_after(a: np.ndarray) -> np.ndarray:
    """[a, 1] row by row."""
    return np.concatenate([a, np.ones((a.shape[0], 1))], 1)


def _flipped(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[::-1])


def _flipped_logs(g: np.ndarray) -> np.ndarray:
    """The log-decays of the reversed sequence, l'_t' = l_(N-t') (l'_0 = 0, unused)."""
    return np.concatenate([np.zeros_like(g[:1]), g[::-1][:-1]])


def _run(left: Features, right: Features, cols, decay, spec: Spec, backward: bool):
    """(value, bound, magnitude bound) of decayed_sums for the whole head (columns: cols,
    then the ones' sum), the features given; on the reversed sequence for `backward`;
    non-causal specs: over every token (_total_run)."""
    if not spec.causal:
        return _total_run(left, right, cols, spec)
    if backward:
        left, right = (Features(_flipped(f.phi), _flipped(f.err)) for f in (left, right))
        cols = _flipped(cols)
        decay = decay if spec.decay == "constant" else _flipped_logs(decay)
    given = (left, right)
    parts = list(zip(*decayed_sums(None, None, cols, None, decay, spec, given), strict=True))
    value, total, mag = (np.concatenate(p) for p in parts[2:])
    if backward:
        return value[::-1], total[::-1], mag[::-1]
    return value, total, mag


def _total_run(left: Features, right: Features, cols, spec: Spec):
    """(value, bound, magnitude bound) as decayed_sums gives them, non-causal: sum_j (l_i .
    r_j) [cols_j, 1] over all j, as row N_r + i of one causal chain over the right rows,
    then the left rows (module docstring, "Non-causal")."""
    n, n_r = left.phi.shape[0], right.phi.shape[0]

    def padded(f: Features, before: int, after: int) -> Features:
        pad = ((before, after), (0, 0))
        return Features(np.pad(f.phi, pad), np.pad(f.err, pad))

    lefts, rights = padded(left, n_r, 0), padded(right, 0, n)
    columns = np.concatenate([cols, np.zeros((n, cols.shape[1]))])
    causal = replace(spec, causal=True)  # log-gates of 0: every weight 1
    kept = [  # the query rows of each step: (value, bound, magnitude bound)
        tuple(part[max(n_r - start, 0) :] for part in parts)
        for start, stop, *parts in decayed_sums(
            None, None, columns, None, np.zeros(n + n_r), causal, (lefts, rights)
        )
        if stop > n_r
    ]
    return tuple(np.concatenate(p) for p in zip(*kept, strict=True))


def _magnitudes(features, v, g_out, decay, spec: Spec, c: float, forward):
    """({"v": M'(dv)}, {"q": M'(dphi(q)), "k": M'(dphi(k))}) from the features' magnitudes
    phiM and upper bounds |phi^| + psi on |phi| (module docstring); forward: the
    denominators' slack |Dt^| - e_D <= |Dt| and |tbar^| + tau >= |tbar| per row, and the
    rows not resolved."""
    slack, tbar_up, lost = forward
    (phi_m, up) = features
    fq, fk = phi_m["q"], phi_m["k"]
    n = fq.shape[0]
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

    if spec.normalize:
        safe = np.where(lost, 1.0, c * slack)[:, None]  # <= |D_i|
        sums = spread * nonnegative(fq, fk, _ones_after(av), False)
        m_den = spec.eps + c * sums[:, -1:]
        ratio = m_den / safe  # >= M(D_i) / |D_i|
        a_tbar = tbar_up[:, None]  # >= |tbar_i|
        m_tbar = (c * np.sum(ag * sums[:, :-1], axis=1, keepdims=True) + a_tbar * m_den) / safe
        alpha = (1 + ratio) / safe
        beta = (m_tbar + a_tbar * ratio) / safe
        alpha[lost], beta[lost] = 0.0, 0.0
    else:  # D = 1, M(D) = 0, M(b_ij) = |G_i| . |v_j|
        safe, alpha = np.ones((n, 1)), np.ones((n, 1))
        ratio, beta = np.zeros((n, 1)), np.zeros((n, 1))
    left = np.concatenate([alpha * ag, beta], 1)
    right_v = _ones_after(av)
    m_phi = {"q": np.empty(fq.shape), "k": np.empty(fk.shape)}
    if kind == "channel-gates":
        for m in range(fq.shape[1]):
            at, channel_logs = slice(m, m + 1), logs[:, m : m + 1]
            forward = _abs_sums(channel_logs, left, right_v, fk[:, at], False)
            m_phi["q"][:, at] = c * spread * forward
            m_phi["k"][:, at] = c * _abs_sums(channel_logs, right_v, spread * left, fq[:, at], True)
    else:
        m_phi["q"] = c * spread * nonnegative(left, right_v, fk, False)
        m_phi["k"] = c * nonnegative(right_v, spread * left, fq, True)
    scaled_g = ag / safe
    scaled_g[lost] = 0.0
    # M(dv_j) = c sum_i w_ij (sigma_ij M(a_ij) + |a_ij| M(D_i) / |D_i|) |G_i| / |D_i|
    m_v = nonnegative(fk, fq, scaled_g * (1.0 if kind == "constant" else spread), True)
    if spec.normalize:
        m_v += plain(up["k"], up["q"], scaled_g * ratio, True)
    return {"v": c * m_v}, m_phi


def _spread(logs: np.ndarray) -> np.ndarray:
    """1 + 2 max_m sum_(t<=i) |g_tm| per row i: grad.py's bound on 1 + M(ln w_ij)."""
    return 1 + 2 * np.max(np.cumsum(np.abs(logs.reshape(logs.shape[0], -1)), axis=0), axis=1)


def _abs_sums(logs, left, right, cols, backward: bool) -> np.ndarray:
    """sum_(j<=i) sum_m left_im right_jm w_ijm cols_j (or j >= i, backward) for non-negative
    float64 inputs, w from the log-decays (N, 1) or (N, m): certified_decay.chain, streamed."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
        logs = _flipped_logs(logs)
    n, step = left.shape[0], cd.CHUNK * cd.GROUP
    state, out = np.zeros((left.shape[1], cols.shape[1])), []
    for start in range(0, n, step):
        stop = min(start + step, n)
        f = Factors.of(np.pad(logs[start:stop], ((0, -(stop - start) % cd.CHUNK), (0, 0))))
        rows = slice(start, stop)
        part, state = chain(f, left[rows], right[rows], cols[rows], state)
        out.append(part)
    sums = np.concatenate(out)
    return sums[::-1] if backward else sums


def _total_abs_sums(left, right, cols) -> np.ndarray:
    """sum_j (left_i . right_j) cols_j over all j for non-negative float64 inputs."""
    return left @ (right.T @ cols)


def _constant_abs_sums(log_gamma: float, left, right, cols, backward: bool) -> np.ndarray:
    """sum_(j<=i) gamma^(i-j) (1 + (i-j) L) (left_i . right_j) cols_j (or j >= i, gamma^(j-i)
    (1 + (j-i) L), backward), L = -ln gamma, for non-negative inputs: by chunks of CHUNK
    rows (module docstring), every part non-negative."""
    if backward:
        left, right, cols = _flipped(left), _flipped(right), _flipped(cols)
    n, size = left.shape[0], cd.CHUNK
    lc, rc, xc = (
        np.pad(t, ((0, -n % size), (0, 0))).reshape(-1, size, t.shape[1])
        for t in (left, right, cols)
    )
    at = np.arange(size, dtype=np.float64) * log_gamma  # o L for the offsets o in a chunk
    apart = np.maximum(at[:, None] - at[None, :], 0.0)  # (i - j) L inside a chunk, j <= i
    inner = np.tril(np.exp(-apart) * (1 + apart))
    to_end = at[::-1]  # (e' - j) L, e' the chunk's last row
    own_a = np.matmul((rc * np.exp(-to_end)[:, None]).swapaxes(1, 2), xc)
    own_b = np.matmul((rc * (np.exp(-to_end) * to_end)[:, None]).swapaxes(1, 2), xc)
    whole, length = math.exp(-size * log_gamma), size * log_gamma
    before_a, before_b = np.empty_like(own_a), np.empty_like(own_b)
    state_a = state_b = np.zeros_like(own_a[0])
    for chunk in range(own_a.shape[0]):
        before_a[chunk], before_b[chunk] = state_a, state_b
        state_b = whole * (state_b + length * state_a) + own_b[chunk]
        state_a = whole * state_a + own_a[chunk]
    reach = at + log_gamma  # (i - e) L, e the last row before i's chunk
    pre = np.exp(-reach)[:, None]
    out = np.matmul(lc * (pre * (1 + reach[:, None])), before_a) + np.matmul(lc * pre, before_b)
    out += np.matmul(np.matmul(lc, rc.swapaxes(1, 2)) * inner, xc)
    sums = out.reshape(-1, cols.shape[1])[:n]
    return sums[::-1] if backward else sums


def gate_gradient(features, grads: Arrays, bounds: Arrays, terms, channel: bool):
    """(dL/dg, its bound, its magnitude) from the features (Features of q and k), grads and
    bounds of dL/dphi(q) and dL/dphi(k) under "q" and "k", and the magnitudes' terms
    (phiM(q) M'(dphi(q)), phiM(k) M'(dphi(k))) (module docstring): the reverse cumulative
    sum of phi(q) . dphi(q) - phi(k) . dphi(k) (per channel for channel gates), 0 at token
    0. A product f^ y^ of f^ within psi of f and y^ within E of y errs by (|f^| + psi) E +
    psi |y^|."""
    fq, fk = features
    q, k, psi_q, psi_k = fq.phi, fk.phi, fq.err, fk.err
    dq, dk, eq, ek = grads["q"], grads["k"], bounds["q"], bounds["k"]
    aq, ak = np.abs(q), np.abs(k)
    with np.errstate(invalid="ignore"):  # inf bounds times 0 features: inf below
        err_terms = (aq + psi_q) * eq + (ak + psi_k) * ek + psi_q * np.abs(dq) + psi_k * np.abs(dk)
    if channel:
        width, x = 1, q * dq - k * dk
        err = err_terms + gamma64(2) * (aq * np.abs(dq) + ak * np.abs(dk))
        mag = terms[0] + terms[1]
    else:
        width, x = q.shape[1], np.sum(q * dq, axis=1) - np.sum(k * dk, axis=1)
        err = np.sum(err_terms, axis=1)
        err += gamma64(width + 1) * np.sum(aq * np.abs(dq) + ak * np.abs(dk), axis=1)
        mag = np.sum(terms[0] + terms[1], axis=1)
    err = np.where(np.isnan(err), np.inf, err)
    n = x.shape[0]
    # products that may underflow: none where every product has an exact zero factor
    active = ((aq != 0) & (dq != 0)) | ((ak != 0) & (dk != 0)) | (err_terms > 0)
    active = active if channel else np.any(active, axis=1)
    err = err + 4 * width * SUBNORMAL * active

    def through(t: np.ndarray) -> np.ndarray:  # sum_(s>=t) t_s
        return np.cumsum(t[::-1], axis=0)[::-1]

    g = gamma64(n)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = (through(err) + g * through(np.abs(x))) / (1 - g) * SAFETY
    dg = through(x)
    dg[0], bound[0] = 0.0, 0.0
    bound[~np.isfinite(dg)] = np.inf
    return dg, bound, through(mag)


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
