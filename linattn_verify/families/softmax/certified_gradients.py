"""Certified gradients at length of softmax (Vaswani et al. 2017, eq. 1): dL/dq, dL/dk,
dL/dv of L = sum(out * G) in float64, O(N^2 d) in dense blocks of query rows (softmax has no
feature map to carry a state), each element with a rigorous bound on its error, and the
magnitudes M of reference/grad.py's gradient_magnitudes.

Definitions (grad.py): s_ij = c_d q_i . k_j (c_d = d^(-1/2)), a_ij = exp(s_ij) for the keys
j that query i uses, A_ij = c a_ij (c the spec's scale), D_i = eps + sum_j A_ij, out_i =
sum_j A_ij v_j / D_i, b_ij = G_i . (v_j - out_i) / D_i, dA_ij/dq_i = c_d A_ij k_j. Each row
is taken in units of exp(m_i), m_i the larger of the row's largest computed logit and ln eps
(an exact constant per row): a'_ij = exp(s_ij - m_i) <= about 1, eps'_i = exp(ln eps - m_i)
<= 1 (0 for eps = 0; ln eps within LIB |ln eps|), Dt_i = eps'_i / c + sum_j a'_ij, at least
about min(1, 1 / c), and every gradient is invariant under that shift:

    dv_j = sum_(i uses j) a'_ij Gt_i,        Gt_i = G_i / Dt_i,
    U_ij = a'_ij (Gt_i . v_j - h_i),          h_i = (G_i . out_i) / Dt_i,
    dq_i = c_d sum_j U_ij k_j,   dk_j = c_d sum_i U_ij q_i

(b_ij A_ij = U_ij: the scale c cancels but in eps / c).

Bounds (Higham 2002: Lemma 3.1 and eq. 3.5 for sums and dots in any order, eq. 3.2's (1 +
delta) products; gradual underflow: half a SUBNORMAL a result below 2^-1022):
- the logits s^ = fl(q_i . k_j) c_d^ within e_s = (gamma_(d+1) + LIB + u) (|q_i| . |k_j|)
  c_d (certified._softmax_sums, the forward's); a'^ = exp(fl(s^ - m)) within
  certified._exp_features' bound E_a (the argument's error e_s and its rounding, the
  exponential's LIB, underflow);
- the forward's sums N = a' v and S = sum_j a': |a'^| |v| gamma_(Nk+2) plus E_a |v| (and
  E_a for S); out^, Dt^ and the quotient rule's Gt^ (xi), tbar^ (tau), h^ (eta) as
  certified_quotients._quotient_terms forms and bounds them, eps' within LIB + u;
- y^_ij = fl(fl(Gt^_i . v_j) - h^_i) within e_y = xi_i . |v_j| + gamma_(dv+1) (|Gt^_i| .
  |v_j| + |h^_i|) + eta_i + (2 dv + 1) SUBNORMAL; U^ = fl(a'^ y^) within e_U = (a'^ + E_a)
  e_y + E_a |y^| + u |U^| + SUBNORMAL (exactly 0 where j is not used);
- dq^ = fl(c_d^ fl(U^ K)): the sum within gamma_Nk |U^| |K| + e_U |K| + Nk SUBNORMAL,
  then the product by c_d^ (relative LIB) as certified_quotients._times_c bounds it; dk^ =
  fl(c_d^ sum over the row blocks of U^T Q) alike with gamma_(Nq + blocks) (and its
  (Nq + blocks) SUBNORMAL for products that underflow); dv^ = sum over
  the blocks of a'^T Gt^ within gamma_(Nq + blocks) a'^T |Gt^| + E_a^T |Gt^| + (a'^ +
  E_a)^T xi.
Every bound times SAFETY for its own roundings.

Magnitudes (grad.py's, for softmax M(a_ij) = a_ij (1 + sm_ij), sm_ij = c_d |q_i| . |k_j|,
in units of exp(m_i) as above): Ma_ij = a'_ij (1 + sm_ij), MDt_i = eps'_i / c + sum_j
Ma_ij, Mtbar_i = (sum_j Ma_ij |G_i| . |v_j| + |tbar_i| MDt_i) / Dt_i, and the coefficient
of dq's and dk's terms C_ij = Ma_ij (|G_i| . |v_j| + Mtbar_i + |G_i . v_j - tbar_i| MDt_i /
Dt_i) / Dt_i (grad.py's M(b_ij) c M(a_ij)): M(dq_i) = c_d sum_j C_ij |k_j|, M(dk_j) = c_d
sum_i C_ij |q_i|, M(dv_j) = sum_i (Ma_ij + a'_ij MDt_i / Dt_i) |G_i| / Dt_i; evaluated
dense in float64 (relative error about (Nk + d) u), not upper bounds but grad.py's M to
the last bits.
"""

from __future__ import annotations

import math

import numpy as np

from ...inputs import AttentionInputs
from ...reference import certified_grad
from ...reference.certified import LIB, SAFETY, SUBNORMAL, U64, _exp_features, gamma64
from ...reference.certified_quotients import _quotient_terms, _times_c
from ...specs import Spec

Arrays = dict[str, np.ndarray]
ROWS = 256  # query rows per dense block (a few N x ROWS float64 matrices at once)


def certified_gradients(x: AttentionInputs, spec: Spec, g_out: np.ndarray):
    """reference/certified_grad.py's (grads, bounds, magnitudes) of a softmax spec, each
    head by softmax_head."""
    return certified_grad.certified_gradients(x, spec, g_out, softmax_head)


def softmax_head(q, k, v, g_out, decay, w, spec: Spec) -> tuple[Arrays, Arrays, Arrays]:
    """One head's (grads, bounds, magnitudes) of a softmax spec (module docstring); decay
    and w are None (certified_grad.Head's signature)."""
    nq, d = q.shape
    nk, dv = v.shape
    c_d = d**-0.5
    aq, ak, av, ag = (np.abs(t) for t in (q, k, v, g_out))
    scale = spec.scale_for(d)
    grads = {"q": np.empty((nq, d)), "k": np.zeros((nk, d)), "v": np.zeros((nk, dv))}
    sums = {name: np.zeros((nk, t.shape[1])) for name, t in grads.items() if name != "q"}
    sums["k_err"], sums["v_err"] = np.zeros((nk, d)), np.zeros((nk, dv))
    bounds = {"q": np.empty((nq, d))}
    mags = {"q": np.empty((nq, d)), "k": np.zeros((nk, d)), "v": np.zeros((nk, dv))}
    blocks = -(-nq // ROWS)
    unresolved = np.zeros(nk, dtype=bool)  # keys a row without a resolved denominator uses
    for start in range(0, nq, ROWS):
        rows = slice(start, min(start + ROWS, nq))
        used = _used(np.arange(nq)[rows], nk, spec.causal)
        a, e_a, eps, e_eps, sm = _weights(q[rows], k, used, c_d, spec.eps)
        # the forward's sums and the quotient rule's inputs
        value = np.concatenate([a @ v, a.sum(1, keepdims=True)], 1)
        mag = np.concatenate([a @ av, value[:, -1:]], 1)
        total = gamma64(nk + 2) * mag + np.concatenate([e_a @ av, e_a.sum(1, keepdims=True)], 1)
        total += (nk + 2) * SUBNORMAL  # the products a' v may underflow
        rel_eps = np.divide(e_eps, eps, out=np.zeros_like(eps), where=eps > 0)
        terms = _quotient_terms(value, total * SAFETY, mag, g_out[rows], spec, d, eps, rel_eps)
        den, _, _, lost, _, _, gt, xi, tbar, _, h, eta = terms
        # U and its bound
        y = gt @ v.T - h[:, None]
        e_y = xi @ av.T + gamma64(dv + 1) * (np.abs(gt) @ av.T + np.abs(h)[:, None])
        e_y += eta[:, None] + (2 * dv + 1) * SUBNORMAL
        u = a * y
        e_u = (a + e_a) * e_y + e_a * np.abs(y) + U64 * np.abs(u) + SUBNORMAL * used
        e_u *= SAFETY
        au = np.abs(u)
        inner = u @ k
        e_inner = gamma64(nk) * (au @ ak) + e_u @ ak + nk * SUBNORMAL
        grads["q"][rows], bounds["q"][rows] = _times_c(c_d, inner, e_inner)
        if lost.any():  # no denominator resolved there: q_i and every key it uses
            bounds["q"][rows][lost] = np.inf
            unresolved[np.any(used[lost] > 0, axis=0)] = True
        grads["k"] += u.T @ q[rows]
        sums["k"] += au.T @ aq[rows]
        sums["k_err"] += e_u.T @ aq[rows]
        grads["v"] += a.T @ gt
        sums["v"] += a.T @ np.abs(gt)
        sums["v_err"] += e_a.T @ np.abs(gt) + (a + e_a).T @ xi
        # the magnitudes
        dt = den[:, None]
        ma = a * (1 + sm)
        m_dt = eps[:, None] / scale + ma.sum(1, keepdims=True)
        t_m = ag[rows] @ av.T  # |G_i| . |v_j|
        a_tbar = np.abs(tbar)[:, None]
        m_tbar = ((ma * t_m).sum(1, keepdims=True) + a_tbar * m_dt) / dt
        coef = ma * (t_m + m_tbar + np.abs(g_out[rows] @ v.T - tbar[:, None]) * m_dt / dt) / dt
        mags["q"][rows] = c_d * coef @ ak
        mags["k"] += c_d * coef.T @ aq[rows]
        mags["v"] += ((ma + a * m_dt / dt) / dt).T @ ag[rows]
    depth = nq + blocks
    e_k = gamma64(depth) * sums["k"] + sums["k_err"] + depth * SUBNORMAL
    grads["k"], bounds["k"] = _times_c(c_d, grads["k"], e_k)
    bounds["v"] = (gamma64(depth) * sums["v"] + sums["v_err"] + depth * SUBNORMAL) * SAFETY
    for name in ("k", "v"):
        bounds[name][unresolved] = np.inf
    for bound in bounds.values():
        bound[np.isnan(bound)] = np.inf
    return grads, bounds, mags


def _used(rows: np.ndarray, nk: int, causal: bool) -> np.ndarray:
    """1.0 where query row i uses key j (j <= i causal), else 0.0."""
    if not causal:
        return np.ones((rows.size, nk))
    return (np.arange(nk)[None, :] <= rows[:, None]).astype(np.float64)


def _weights(q, k, used, c_d: float, eps: float):
    """(a'^, its bound E_a, eps', its bound, sm = c_d |q| . |k|) for the rows q against
    every key, a' 0 (exactly, bound 0) where a key is not used: each row in units of
    exp(m_i), m_i the larger of its largest computed logit and ln eps (module docstring),
    so that a' <= 1 and eps' = exp(ln eps - m_i) <= 1 (0 for eps = 0)."""
    logits = (q @ k.T) * c_d
    sm = (np.abs(q) @ np.abs(k).T) * c_d
    e_s = (gamma64(q.shape[1] + 1) + LIB + U64) * sm * SAFETY
    logits = np.where(used > 0, logits, -np.inf)
    top = logits.max(axis=1, keepdims=True)
    log_eps = math.log(eps) if eps > 0 else -math.inf
    top = np.maximum(top, log_eps)
    with np.errstate(invalid="ignore"):
        arg = np.where(used > 0, logits - top, -np.inf)
        f = _exp_features(arg, np.where(used > 0, e_s, 0.0), 1.0)
        if eps > 0:  # ln eps within LIB |ln eps|
            e = _exp_features(log_eps - top[:, 0], np.full(top.shape[0], LIB * abs(log_eps)), 1.0)
            eps_shifted, e_eps = e.phi, e.err
        else:
            eps_shifted = e_eps = np.zeros(top.shape[0])
    err = np.where(used > 0, f.err, 0.0)
    return f.phi, err, eps_shifted, e_eps, sm
