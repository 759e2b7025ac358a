"""Exact reference gradients of attention, faithfully rounded to float64 (mpmath).

This module evaluates one head, controls the precision and holds the public functions; the
per-map part (Kernel: a_ij, J_phi^T) is grad_maps.py's, the per-row terms (b_ij, e_ij, p_ij,
dL/dg) grad_terms.py's, and the family's part (its weights w_ij, whether it has log-gates,
softmax's similarity) comes through its hooks (similarity.Gradients: families/<name>/
gradients.py for the decays and channel gates, families/softmax/reference.py's logits);
families.dispatch finds them for any spec.

For the loss L = sum_{i,c} out_ic g_out_ic (the cotangent g_out taken exactly, the shape of
out) this module gives dL/dq, dL/dk, dL/dv, and dL/dg for the log-gates g of a gates or
channel-gates spec, from the definition, with the projection W of the Performer maps and a
constant decay's gamma held fixed. Derivation (reverse-mode chain rule; Baydin et al. 2018,
"Automatic differentiation in machine learning: a survey", sec. 3.1, or any calculus text):

    a_ij = sim(q_i, k_j) for the keys j that query i uses (common.allowed_keys)
    A_ij = c w_ij a_ij   (c the spec's scale; w_ij the decay, 1 without one)
    D_i = eps + sum_j A_ij,   out_i = (sum_j A_ij v_j) / D_i   (normalised)
    D_i = 1,                  out_i = sum_j A_ij v_j           (unnormalised)
    dL/dv_j  = sum_i A_ij g_out_i / D_i               (over the queries i that use key j)
    dL/dA_ij = g_out_i . (v_j - out_i) / D_i  =: b_ij (quotient rule on N_i / D_i)
             = g_out_i . v_j                          (unnormalised)
    dL/dq_i  = sum_j b_ij dA_ij/dq_i,   dL/dk_j = sum_i b_ij dA_ij/dk_j,
    dA_ij/dq_i = c w_ij da_ij/dq_i (and so for k_j): the decay and the scale are constants.

The decays (causal; families/*/fields.py): constant, w_ij = gamma^(i-j) (Sun et al.
2023, RetNet, eq. 5); gates, w_ij = exp(G_i - G_j) with G_i = g_0 + ... + g_i (Yang et al.
2024, GLA, eq. 3 with scalar gates), so w_ij depends on g_t for j < t <= i with dw_ij/dg_t
= w_ij, and

    dL/dg_t = sum_{i >= t > j} b_ij A_ij = sum_{i >= t} R_i(t),   R_i(t) = sum_{j < t} b_ij A_ij,

O(N^2) from the row prefix sums R_i (dL/dg_0 = 0: no key precedes token 0). Normalised with
eps = 0, sum_j b_ij A_ij = 0 for every row (a row's common factor cancels in out_i), so the
sums over j < t and over t <= j <= i are opposites.

Channel gates (Yang et al. 2024, GLA, sec. 4.1: S_t = diag(exp g_t) S_(t-1) + phi(k_t) v_t^T,
a log-gate g_tm per token and key channel, for the maps whose feature m is channel m:
identity, elu, relu) decay each feature instead of the similarity:

    A_ij = c sum_m phi(q_i)_m phi(k_j)_m W_ijm,   W_ijm = exp(G_im - G_jm),
    G_im = g_0m + ... + g_im (j <= i).

b_ij = dL/dA_ij is as above, and the chain rule goes on through the features: with
p_ijm = b_ij c phi(q_i)_m phi(k_j)_m W_ijm (b_ij times A_ij's term m),

    dL/dphi(q_i)_m = c sum_j b_ij W_ijm phi(k_j)_m,
    dL/dphi(k_j)_m = c sum_i b_ij W_ijm phi(q_i)_m,
    dL/dq_i = phi'(q_i) dL/dphi(q_i) and dL/dk_j = phi'(k_j) dL/dphi(k_j) elementwise (the
    Jacobians of these maps are diagonal, phi' as below),
    dL/dG_sm = sum_j p_sjm - sum_i p_ism,   dL/dg_tm = sum_{s >= t} dL/dG_sm
             = sum_{i >= t > j} p_ijm     (the scalar gates' formula, channel by channel),

so dL/dg has the gates' shape (B, H, N, d), evaluated per channel as above, and dL/dg_0m = 0.

b_ij is computed as (t_ij - tbar_i) / D_i with t_ij = g_out_i . v_j and tbar_i = g_out_i .
out_i = (sum_j A_ij t_ij) / D_i: it cancels when v_j is near out_i, which the error
estimate below accounts for. The kernel derivatives (formulas and sources as in
specs.FEATURE_MAPS, x' = x d^(-1/4), p = W x', h = |x'|^2 / 2, c = d^(-1/4)):

- softmax, a = exp(s), s = q.k / sqrt(d) (Vaswani et al. 2017, eq. 1): da/dq_i = a k_j / sqrt(d),
  da/dk_j = a q_i / sqrt(d).
- taylor, a = 1 + s + s^2/2 (Arora et al. 2024, sec. 3): da/ds = 1 + s.
- kernelised maps, a = phi(q_i) . phi(k_j): dL/dq_i = J_phi(q_i)^T U_i with U_i = sum_j
  e_ij phi(k_j), e_ij = c w_ij b_ij; dL/dk_j = J_phi(k_j)^T sum_i e_ij phi(q_i). With
  - elu + 1 (Katharopoulos et al. 2020, eq. 7): phi'(x) = 1 for x > 0, exp(x) for x <= 0
    (both sides give 1 at 0: phi is C^1);
  - identity: phi(x) = x, phi'(x) = 1.
  - relu: phi'(x) = 1 for x > 0 and 0 for x <= 0. At 0 relu has no derivative; 0 is the
    subgradient torch uses (threshold_backward), so autograd and this reference agree;
  - cosFormer (Qin et al. 2022, eq. 9-11): a_ij = relu(q_i).relu(k_j) cos(pi (i-j) / (2M)),
    M = max(Nq, Nk); the positions are constants, so the cosine multiplies b_ij, and relu'
    is as above;
  - Performer (Choromanski et al. 2021, Lemma 1 and sec. 2.3), with w_r the rows of W:
    positive   phi_r = exp(w_r.x' - h) / sqrt(m),   dphi_r/dx = c phi_r (w_r - x');
    hyperbolic phi_r^(+/-) = exp(-h) exp(+/- w_r.x') / sqrt(2m),
               dphi_r^(+/-)/dx = c phi_r^(+/-) (+/- w_r - x');
    trig       phi_r^s = exp(h) sin(w_r.x') / sqrt(m), phi_r^c = exp(h) cos(w_r.x') / sqrt(m),
               dphi_r^s/dx = c (phi_r^c w_r + phi_r^s x'),
               dphi_r^c/dx = c (-phi_r^s w_r + phi_r^c x').
    Hence J^T U = c (W^T z + sigma x' (U . phi)) with z_r = U_r phi_r (positive),
    U_r^+ phi_r^+ - U_r^- phi_r^- (hyperbolic), U_r^s phi_r^c - U_r^c phi_r^s (trig), and
    sigma = -1, -1, +1.

The similarities, features and decay weights themselves come from mp.py (`similarities`,
`features`, `decay_weights`, through families/decayed/gradients.py; channel gates: the
prefix sums of `channel_prefix`, and A_ij formed as families/channel_gates/reference.py's
`_channel_gated` forms it, in families/channel_gates/gradients.py), and the scale is its
1/sqrt(d) or number, so the forward function differentiated here is exactly the one the
mpmath reference evaluates.

Zero denominators: where D_i is exactly 0 (relu or cosFormer with eps = 0 and no positive
similarity in row i, normalised), out_i is 0/0 and L is undefined. Then dL/dq_i is NaN, and
so are dL/dk_j and dL/dv_j (all components) for every key j that row i uses, and dL/dg_t
for t <= i (every channel of it, for channel gates); the rest is exact.

Precision control, as in mp.py: each head is evaluated at p and 2p bits (p = 113 first);
an element is accepted when the two float64 roundings are within one ulp of each other
AND a first-order error estimate at 2p, n 2^-2p M, is at most 2^-64 of the value (or half
the smallest subnormal). M bounds the sum of the absolute values of everything the element
is computed from, propagated by first-order rules (sums add magnitudes, a product y z
contributes M(y) M(z), a quotient y / z gives (M(y) + |y/z| M(z)) / |z|, exp(y) gives
exp(y) (1 + M(y)), sin(y) gives |sin y| + M(y)), so it grows with every cancellation: in
b_ij, in sign-changing (trig) features, inside exponents. A decay weight is such an
exponential: M(w_ij) = w_ij (1 + M(ln w_ij)), M(ln w_ij) <= 2 sum_{t <= i} |g_t| when it
is formed as G_i - G_j from prefix sums over the sequence (or (i - j) |ln gamma|), the
bound mp.decay_weights gives; M(A_ij) = c M(w_ij) M(a_ij). Channel gates alike, per
feature: M(W_ijm) = W_ijm (1 + M(ln W_ijm)), M(ln W_ijm) <= 2 max_m sum_{t <= i} |g_tm|
(mp.channel_prefix's spread, over the tokens row i reaches, as for scalar gates), M(A_ij) =
c sum_m |phi(q_i)_m| |phi(k_j)_m| M(W_ijm), the coefficient of dL/dphi(q_i)_m's term
M(b_ij) c M(W_ijm), M(p_ijm) = M(b_ij) c |phi(q_i)_m| |phi(k_j)_m| M(W_ijm) (these maps'
M(phi) = |phi|). n is a generous bound on the
number of roundings on any path (`roundings`). Elements not accepted are recomputed at
4p, 8p, ... until max_prec, then ReferenceAccuracyError. Each element is accepted on its
own, so whether dL/dk_j or dL/dv_j is accepted, and its value, depends only on the rows
that use key j (with causal, g_out_i for i < j cannot change it), and dL/dg_t only on
rows i >= t.

The magnitude of dL/dg_t that the judgement uses (gradient_magnitudes) is that of the
evaluation autograd makes through the prefix sums, dL/dg_t = sum_{s >= t} (dL/dG_s),
dL/dG_s = sum_j b_sj A_sj - sum_i b_is A_is: M(dg_t) = sum_{s >= t} (sum_j M(b_sj A_sj) +
sum_i M(b_is A_is)), not 0 at t = 0, where that evaluation leaves rounding errors (a
total-minus-prefix evaluation, which reaches rows before t, is outside it); for channel
gates the same per channel m, with M(p_ijm) for M(b_ij A_ij).

Exact zeros settle only once n 2^-p M is below 2^-1076 (1808 bits for O(1) inputs), so the
ones that are common are set exactly instead: with eps = 0 and normalised, a row whose keys
all have zero weight but one, j (always so for causal row 0), has out_i = v_j exactly, so
b_ij = 0 and tbar_i = t_ij; for relu and cosFormer normalised with eps = 0, A_ij is
homogeneous of degree 1 in relu(q_i), so out_i depends only on its direction and dL/dq_i =
0 when q_i has exactly one positive component (with channel gates too: A_ij stays
homogeneous of degree 1 in relu(q_i)); and dL/dg_0 = 0, an empty sum. Others (e.g.
dL/dq with identical keys) take the long way. gradient_magnitudes' M is that of the general
evaluation, without these shortcuts. exact_gradients_and_magnitudes (what the gradient
checks use) gives exactly exact_gradients and gradient_magnitudes from one evaluation per
head at p, the refinement's first: the general M is the same but in the rows with one key
of non-zero weight, the keys those rows use and dL/dg, recomputed without that shortcut,
and in the relu rows set to 0, where it is the M computed before.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

from ..inputs import AttentionInputs, as_float64
from ..specs import Spec, SpecError, summing
from .common import MAX_PREC, ReferenceAccuracyError, allowed_keys
from .grad_maps import Kernel, _transpose
from .grad_terms import _b_row, _channel, _gate_gradients, _gate_magnitudes, _row_terms, scale
from .mp import DEFAULT_PREC, abs_rows, nearest
from .similarity import Gradients

NAMES = ("q", "k", "v")


def gradient_names(spec: Spec, gradients: Gradients) -> tuple[str, ...]:
    """The inputs the loss is differentiated in: q, k, v, and the log-gates g where the
    family's hooks say (Gradients.gates: gates, channel gates; gamma, W and the cotangent
    are held fixed); accuracy.gradient's gradient_names takes every family's."""
    return NAMES + ("g",) * gradients.gates(spec)


def roundings(x: AttentionInputs, spec: Spec, gradients: Gradients) -> int:
    """A generous bound on the roundings behind any gradient element (the n of gamma_n),
    for inputs of x's shape:
    a similarity (x' scaling, |x'|^2, W x', exp/sin/cos, 1/sqrt(m), the feature dot
    product: under n_features + 2d + 12), D_i, tbar_i and b_ij (sums over Nk keys and a dot
    over dv), the weight of b_ij, then the sum over Nq or Nk and J^T (under 2d + 8 more).
    Products add the counts of their factors, hence the factor 4. The features are those
    this module differentiates: d of them but for the Performer maps (m or 2m). A decay
    weight adds 3 Nk + 8 (in a recurrence, up to Nk rounded exponentials, each within 2
    units, and products; from prefix sums, Nk sums and one or two exponentials), a scale 2
    (its rounding and the product), dL/dg another Nq + Nk (the sums of the prefix sums'
    backward: a row and a column, then the reverse cumulative sum; per channel for channel
    gates, whose weight W_ijm enters each feature product as a decay weight does a_ij).
    gradients: the family's hooks (a weight's roundings: Gradients.weight_roundings)."""
    _, _, nq, nk, d, dv = x.shape
    n_features = d
    if spec.info.needs_projection:
        n_features = spec.info.feature_dim(d, x.projection.shape[0])
    per_weight = gradients.weight_roundings(nk) + 2 * (spec.scale != 1.0)
    n = 4 * (n_features + 2 * d + 12 + per_weight) + 4 * (nq + nk) + 2 * (d + dv) + 32
    return n + (nq + nk) * gradients.gates(spec)


def _nearest(rows: list) -> np.ndarray:
    """Rows of mpf as a float64 array (each rounded to nearest)."""
    return np.array([[nearest(t) for t in row] for row in rows])


def _rounded(rows: list, mag_rows: list, rounding) -> list[np.ndarray]:
    """[float64 values, accepted-by-estimate mask, float64 magnitudes] of rows of mpf
    values and their magnitudes M (accepted: n 2^-p M at most 2^-64 of the value, or half
    the smallest subnormal)."""
    mp = mpmath.mp
    tiny, relative = mp.mpf(2) ** -1076, mp.mpf(2) ** -64
    vals = _nearest(rows)
    ok = np.array(
        [
            [rounding * m <= max(abs(t) * relative, tiny) for t, m in zip(row, row_m)]
            for row, row_m in zip(rows, mag_rows)
        ],
        dtype=bool,
    ).reshape(vals.shape)
    return [vals, ok, _nearest(mag_rows)]


def _head(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    hooks: Gradients,
    b: int,
    h: int,
    prec: int,
    general=False,
):
    """Gradients of head (b, h) at `prec` bits, with the exact-zero shortcuts: ({name:
    [float64 values, accepted-by-estimate mask, float64 magnitudes M]}, general). The mask
    is False where the error estimate is too large (or D_i rounded to 0 for a map that is
    not positive: then the row is unresolved, not 0/0). general: None, or (general=True)
    {name: float64 M} of the general evaluation, without the shortcuts, where M is the
    magnitude of what an evaluation computes, dL/dg's through the prefix sums
    (gradient_magnitudes): the rows the shortcuts change and the keys they use are
    recomputed without them, the rest is shared. hooks: the family's (Gradients)."""
    _, _, nq, nk, d, _ = x.shape
    with mpmath.workprec(prec):
        mp = mpmath.mp

        def conv(arr: np.ndarray) -> list:
            return [[mp.mpf(t) for t in row] for row in arr.tolist()]

        qs, ks, vs, gs = conv(x.q[b, h]), conv(x.k[b, h]), conv(x.v[b, h]), conv(g_out[b, h])
        w = None if x.projection is None else conv(x.projection)
        per_feature = hooks.per_feature
        kern = Kernel(spec, qs, ks, w, per_feature, hooks.logits)
        rounding = mp.mpf(2) ** -prec * roundings(x, spec, hooks)
        zero = mp.zero
        ags, avs = abs_rows(gs), abs_rows(vs)
        row = hooks.rows(x, spec, b, h, kern, scale(spec, d))
        # e_ij = b_ij c w_ij weight_ij, r_ij = A_ij / D_i and p_ij = b_ij A_ij (dL/dg's
        # terms), 0 where key j is not used; e and p are lists over the features m where
        # the weights are per feature (channel gates: e_ijm = b_ij c W_ijm, p_ijm = b_ij A_ijm)
        blank = [zero] * d if per_feature else zero
        e, em, p, pm = ([[blank] * nk for _ in range(nq)] for _ in range(4))
        r, rm = ([[zero] * nk for _ in range(nq)] for _ in range(2))
        changed = {}  # row i: its (e, em, p, pm) without the shortcut, where one applies
        nan_rows, bad_rows = [], []
        for i in range(nq):
            js = list(allowed_keys(i, nk, spec.causal))
            a, am, wt, wtm, terms, terms_m = row(i, js)
            t = [mp.fdot(gs[i], vs[j]) for j in js]
            tm = [mp.fdot(ags[i], avs[j]) for j in js]
            den, den_m = mp.one, zero  # unnormalised: D_i = 1, b_ij = t_ij
            coefs = general_coefs = (t, tm)
            if spec.normalize:
                den = mp.fsum(a) + spec.eps
                den_m = mp.fsum(am) + spec.eps
                if den == 0:
                    (nan_rows if spec.info.positive else bad_rows).append(i)
                    continue
                # One key of non-zero weight and eps = 0: out_i = v_j exactly, so b_ij = 0
                # and tbar_i = t_ij (with positive maps a computed 0 is an exact 0).
                nonzero = [n for n, an in enumerate(a) if an != 0]
                single = nonzero[0] if len(nonzero) == 1 and spec.eps == 0 else None
                if single is not None and not (len(js) == 1 or spec.info.positive):
                    single = None
                if single is None or general:
                    tbar = mp.fdot(a, t) / den
                    tbar_m = (mp.fdot(am, tm) + abs(tbar) * den_m) / abs(den)
                    coefs = general_coefs = _b_row(t, tm, den, den_m, tbar, tbar_m, None)
                if single is not None:
                    coefs = _b_row(t, tm, den, den_m, t[single], tm[single], single)
            aden = abs(den)
            for n, j in enumerate(js):
                r[i][j] = a[n] / den
                rm[i][j] = (am[n] + abs(r[i][j]) * den_m) / aden
            weights = (wt, wtm, terms, terms_m, blank)
            e[i], em[i], p[i], pm[i] = _row_terms(nk, js, coefs, *weights)
            if general and coefs is not general_coefs:
                changed[i] = _row_terms(nk, js, general_coefs, *weights)

        rT, rmT = _transpose(r), _transpose(rm)
        gs_cols, ags_cols = _transpose(gs), _transpose(ags)
        grads, mags = {}, {}
        grads["v"] = [[mp.fdot(rT[j], col) for col in gs_cols] for j in range(nk)]
        mags["v"] = [[mp.fdot(rmT[j], col) for col in ags_cols] for j in range(nk)]
        for side, coef, coef_m in (("q", e, em), ("k", _transpose(e), _transpose(em))):
            rows = [kern.gradient(side, n, c, cm) for n, (c, cm) in enumerate(zip(coef, coef_m))]
            grads[side], mags[side] = [g for g, _ in rows], [m for _, m in rows]
        general_mags = None
        if general:
            general_mags = {name: list(mags[name]) for name in NAMES}
            for i, (ei, emi, _, _) in changed.items():
                general_mags["q"][i] = kern.gradient("q", i, ei, emi)[1]
            if changed:
                e_general = [changed[i][0] if i in changed else row for i, row in enumerate(e)]
                em_general = [changed[i][1] if i in changed else row for i, row in enumerate(em)]
                eT, emT = _transpose(e_general), _transpose(em_general)
                for j in sorted({j for i in changed for j in allowed_keys(i, nk, spec.causal)}):
                    general_mags["k"][j] = kern.gradient("k", j, eT[j], emT[j])[1]
        if kern.name in ("relu", "cosformer") and spec.normalize and spec.eps == 0:
            # A_ij is homogeneous of degree 1 in relu(q_i), so out_i depends only on its
            # direction: with one positive component, dL/dq_i = 0 exactly.
            for i, qi in enumerate(qs):
                if sum(t > 0 for t in qi) == 1:
                    grads["q"][i] = mags["q"][i] = [zero] * d
        result = {name: _rounded(grads[name], mags[name], rounding) for name in NAMES}
        if general:
            general_mags = {name: _nearest(general_mags[name]) for name in NAMES}
        if hooks.gates(spec):  # per channel m, p_ijm as the scalar gates' p_ij: (N, d) rows
            shape = _gate_shape(nk, d, per_feature)
            channels = _channels(p, d, per_feature), _channels(pm, d, per_feature)
            per = [_gate_gradients(pc, pmc) for pc, pmc in zip(*channels)]
            dg, dg_m = _transpose([g for g, _ in per]), _transpose([gm for _, gm in per])
            result["g"] = [t.reshape(shape) for t in _rounded(dg, dg_m, rounding)]
            if general:
                pm_general = [changed[i][3] if i in changed else row for i, row in enumerate(pm)]
                through = [_gate_magnitudes(pc) for pc in _channels(pm_general, d, per_feature)]
                general_mags["g"] = _nearest(_transpose(through)).reshape(shape)
        # unresolved rows first: a key also used by a 0/0 row is NaN for certain
        for i in bad_rows + nan_rows:
            keys = list(allowed_keys(i, nk, spec.causal))
            at = {"q": [i], "k": keys, "v": keys, "g": list(range(i + 1))}  # g: all channels
            for name in result:
                result[name][0][at[name]] = result[name][2][at[name]] = np.nan
                result[name][1][at[name]] = i in nan_rows
                if general:
                    general_mags[name][at[name]] = np.nan
        return result, general_mags


def _channels(rows: list, d: int, per_feature: bool) -> list:
    """Rows of p_ij per channel: feature m's of per-feature lists, else the one channel."""
    return [_channel(rows, m) for m in range(d)] if per_feature else [rows]


def _gate_shape(nk: int, d: int, per_feature: bool) -> tuple[int, ...]:
    """dL/dg's shape in a head: per token (and channel, for per-feature weights)."""
    return (nk, d) if per_feature else (nk,)


def agree(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Elements within one ulp of each other at p and 2p (NaN agreeing with NaN)."""
    with np.errstate(invalid="ignore"):
        close = np.abs(low - high) <= np.spacing(np.abs(high))
    return (low == high) | close | (np.isnan(low) & np.isnan(high))


def _refined_head(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    hooks: Gradients,
    b: int,
    h: int,
    prec: int,
    max_prec: int,
    first: dict | None = None,
) -> dict[str, np.ndarray]:
    """Head (b, h) of exact_gradients, {name: float64 values}, starting at `prec` bits
    (compared with 2 prec first); `first`: _head's result at `prec` where already made."""
    _, _, nq, nk, d, dv = x.shape
    g_shape = _gate_shape(nk, d, hooks.per_feature)
    shapes = {"q": (nq, d), "k": (nk, d), "v": (nk, dv), "g": g_shape}
    shapes = {name: shapes[name] for name in gradient_names(spec, hooks)}
    out = {name: np.empty(shape) for name, shape in shapes.items()}
    done = {name: np.zeros(shape, dtype=bool) for name, shape in shapes.items()}
    if first is None:
        first, _ = _head(x, spec, g_out, hooks, b, h, prec)
    low = {name: vals for name, (vals, _, _) in first.items()}
    p = prec
    while True:
        if 2 * p > max_prec:
            left = {name: int((~done[name]).sum()) for name in shapes}
            raise ReferenceAccuracyError(
                f"mpmath gradients: elements of head ({b}, {h}) not resolved to "
                f"float64 at {max_prec} bits (unresolved per gradient: {left})"
            )
        high, _ = _head(x, spec, g_out, hooks, b, h, 2 * p)
        for name in shapes:
            vals, ok, _ = high[name]
            new = ~done[name] & ok & agree(low[name], vals)
            out[name][new] = vals[new]
            done[name] |= new
        if all(done[name].all() for name in shapes):
            return out
        low = {name: vals for name, (vals, _, _) in high.items()}
        p *= 2


def _stacked(heads: list, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """{name: (B, H, ...)} from heads[b][h] = {name: array}."""
    return {name: np.array([[head[name] for head in row] for row in heads]) for name in names}


def _refined_gradients(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, hooks: Gradients, prec: int, max_prec: int
) -> dict[str, np.ndarray]:
    """exact_gradients starting at `prec` bits (compared with 2 prec first)."""
    b_, h_ = x.shape[:2]
    heads = [
        [_refined_head(x, spec, g_out, hooks, b, h, prec, max_prec) for h in range(h_)]
        for b in range(b_)
    ]
    return _stacked(heads, gradient_names(spec, hooks))


def _check_g_out(x: AttentionInputs, g_out: Any) -> np.ndarray:
    """The cotangent g as an exact float64 array of out's shape (B, H, Nq, dv), or a
    SpecError."""
    ga, _ = as_float64(g_out, "g")
    b_, h_, nq, _, _, dv = x.shape
    if ga.shape != (b_, h_, nq, dv):
        raise SpecError(
            f"g must have the shape of the attention output (B, H, Nq, dv) = "
            f"{(b_, h_, nq, dv)}, got {ga.shape}"
        )
    return ga


def exact_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    gradients: Gradients,
    max_prec: int = MAX_PREC,
) -> dict[str, np.ndarray]:
    """For the loss L = sum(out * g_out) (g_out of out's shape (B, H, Nq, dv), float64 taken
    exactly), the exact dL/dq, dL/dk, dL/dv, each faithfully rounded to float64 (keys "q",
    "k", "v"), and for a gates (channel-gates) spec dL/dg of the log-gates (key "g", their
    shape (B, H, N) ((B, H, N, d))). The decay
    is x's (validate(..., decay)); W and gamma are held fixed. NaN where a row's
    denominator is exactly 0 (see the module docstring). gradients: the family's hooks
    (Similarity.gradients; families.dispatch.exact_gradients finds them for any spec)."""
    summing(spec, "exact gradients")
    ga = _check_g_out(x, g_out)
    return _refined_gradients(x, spec, ga, gradients, DEFAULT_PREC, max_prec)


def gradient_magnitudes(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, gradients: Gradients
) -> dict[str, np.ndarray]:
    """The magnitude M of each gradient element (the keys of exact_gradients; NaN where the
    gradient is): the first-order sum of the absolute values of everything a general
    evaluation computes it from, at DEFAULT_PREC bits (a magnitude, not a value: no
    refinement). The scale gradient errors are measured in (accuracy/gradient.py); unlike
    the precision control's, it is not 0 where the exact gradient is known to be 0 (N = 1
    rows, relu rows with one positive component, dL/dg_0), since an evaluation rounds
    there too."""
    ga = _check_g_out(x, g_out)
    b_, h_ = x.shape[:2]
    heads = [
        [_head(x, spec, ga, gradients, b, h, DEFAULT_PREC, general=True)[1] for h in range(h_)]
        for b in range(b_)
    ]
    return _stacked(heads, gradient_names(spec, gradients))


def exact_gradients_and_magnitudes(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    gradients: Gradients,
    max_prec: int = MAX_PREC,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(exact_gradients(x, spec, g_out, max_prec), gradient_magnitudes(x, spec, g_out)),
    the same arrays, from one evaluation per head at DEFAULT_PREC: the first of the
    refinement, which gives the general magnitudes too."""
    ga = _check_g_out(x, g_out)
    b_, h_ = x.shape[:2]
    exact, mags = [], []
    for b in range(b_):
        exact.append([])
        mags.append([])
        for h in range(h_):
            first, general = _head(x, spec, ga, gradients, b, h, DEFAULT_PREC, general=True)
            refined = _refined_head(x, spec, ga, gradients, b, h, DEFAULT_PREC, max_prec, first)
            exact[b].append(refined)
            mags[b].append(general)
    names = gradient_names(spec, gradients)
    return _stacked(exact, names), _stacked(mags, names)


__all__ = [
    "NAMES",
    "exact_gradients",
    "exact_gradients_and_magnitudes",
    "gradient_magnitudes",
    "gradient_names",
    "roundings",
]
