"""Exact reference gradients of attention, faithfully rounded to float64 (mpmath).

For the loss L = sum_{i,c} out_ic g_out_ic (the cotangent g_out taken exactly, the shape of
out) this module gives dL/dq, dL/dk, dL/dv, and dL/dg for the log-gates g of a gates spec,
from the definition, with the projection W of the Performer maps and a constant decay's
gamma held fixed. Derivation (reverse-mode chain rule; Baydin et al. 2018,
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

The decays (causal specs; specs.DECAY_SOURCES): constant, w_ij = gamma^(i-j) (Sun et al.
2023, RetNet, eq. 5); gates, w_ij = exp(G_i - G_j) with G_i = g_0 + ... + g_i (Yang et al.
2024, GLA, eq. 3 with scalar gates), so w_ij depends on g_t for j < t <= i with dw_ij/dg_t
= w_ij, and

    dL/dg_t = sum_{i >= t > j} b_ij A_ij = sum_{i >= t} R_i(t),   R_i(t) = sum_{j < t} b_ij A_ij,

O(N^2) from the row prefix sums R_i (dL/dg_0 = 0: no key precedes token 0). Normalised with
eps = 0, sum_j b_ij A_ij = 0 for every row (a row's common factor cancels in out_i), so the
sums over j < t and over t <= j <= i are opposites.

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
`features`, `decay_weights`), and the scale is its 1/sqrt(d) or number, so the forward
function differentiated here is exactly the one the mpmath reference evaluates.

Zero denominators: where D_i is exactly 0 (relu or cosFormer with eps = 0 and no positive
similarity in row i, normalised), out_i is 0/0 and L is undefined. Then dL/dq_i is NaN, and
so are dL/dk_j and dL/dv_j (all components) for every key j that row i uses, and dL/dg_t
for t <= i; the rest is exact.

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
bound mp.decay_weights gives; M(A_ij) = c M(w_ij) M(a_ij). n is a generous bound on the
number of roundings on any path (`roundings`). Elements not accepted are recomputed at
4p, 8p, ... until max_prec, then ReferenceAccuracyError. Each element is accepted on its
own, so whether dL/dk_j or dL/dv_j is accepted, and its value, depends only on the rows
that use key j (with causal, g_out_i for i < j cannot change it), and dL/dg_t only on
rows i >= t.

The magnitude of dL/dg_t that the judgement uses (gradient_magnitudes) is that of the
evaluation autograd makes through the prefix sums, dL/dg_t = sum_{s >= t} (dL/dG_s),
dL/dG_s = sum_j b_sj A_sj - sum_i b_is A_is: M(dg_t) = sum_{s >= t} (sum_j M(b_sj A_sj) +
sum_i M(b_is A_is)), not 0 at t = 0, where that evaluation leaves rounding errors (a
total-minus-prefix evaluation, which reaches rows before t, is outside it).

Exact zeros settle only once n 2^-p M is below 2^-1076 (1808 bits for O(1) inputs), so the
ones that are common are set exactly instead: with eps = 0 and normalised, a row whose keys
all have zero weight but one, j (always so for causal row 0), has out_i = v_j exactly, so
b_ij = 0 and tbar_i = t_ij; for relu and cosFormer normalised with eps = 0, A_ij is
homogeneous of degree 1 in relu(q_i), so out_i depends only on its direction and dL/dq_i =
0 when q_i has exactly one positive component; and dL/dg_0 = 0, an empty sum. Others (e.g.
dL/dq with identical keys) take the long way.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

from ..inputs import AttentionInputs, as_float64, validate
from ..specs import RSQRT_D, Spec, SpecError
from .common import MAX_PREC, ReferenceAccuracyError, allowed_keys
from .mp import DEFAULT_PREC, decay_weights, features, nearest, similarities

NAMES = ("q", "k", "v")
PERFORMER_SIGN = {"performer-positive": -1, "performer-hyperbolic": -1, "performer-trig": 1}


def gradient_names(spec: Spec) -> tuple[str, ...]:
    """The inputs the loss is differentiated in: q, k, v, and the log-gates g of a gates
    spec (gamma, W and the cotangent are held fixed)."""
    return NAMES + ("g",) * (spec.decay == "gates")


def roundings(x: AttentionInputs, spec: Spec) -> int:
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
    backward: a row and a column, then the reverse cumulative sum)."""
    _, _, nq, nk, d, dv = x.shape
    n_features = d
    if spec.info.needs_projection:
        n_features = spec.info.feature_dim(d, x.projection.shape[0])
    per_weight = (3 * nk + 8) * (spec.decay is not None) + 2 * (spec.scale != 1.0)
    n = 4 * (n_features + 2 * d + 12 + per_weight) + 4 * (nq + nk) + 2 * (d + dv) + 32
    return n + (nq + nk) * (spec.decay == "gates")


def _abs(rows: list) -> list:
    return [[abs(t) for t in row] for row in rows]


def _transpose(rows: list) -> list:
    return [list(col) for col in zip(*rows)]


class _Kernel:
    """The per-map part at the working precision: a_ij and its magnitude, the weight that
    turns b_ij into the coefficient e_ij of the q/k derivative, and J^T."""

    def __init__(self, spec: Spec, qs: list, ks: list, w: list | None) -> None:
        mp = mpmath.mp
        self.name = spec.feature_map
        self.d = len(qs[0])
        nq, nk = len(qs), len(ks)
        big_m = max(nq, nk)
        self.dot = self.name in ("softmax", "taylor")
        self.w = w
        self.fq = self.fk = None
        if not self.dot:
            self.fq = [features(x, w, self._phi_kind()) for x in qs]
            self.fk = [features(x, w, self._phi_kind()) for x in ks]
            self.fqm = [self._feature_mags(x, f) for x, f in zip(qs, self.fq)]
            self.fkm = [self._feature_mags(x, f) for x, f in zip(ks, self.fk)]
        # a_ij (all keys; masking is done by the caller), its magnitude, the weight and its
        # magnitude: e_ij = b_ij * weight_ij.
        self.a, self.am, self.wt, self.wtm = [], [], [], []
        sqrt_d = mp.sqrt(self.d)
        aks = _abs(ks)
        for i, qi in enumerate(qs):
            fq = None if self.fq is None else self.fq[i]
            sims = similarities(qi, fq, i, ks, self.fk, spec, big_m)
            self.a.append(sims)
            if self.dot:
                aq = [abs(t) for t in qi]
                sm = [mp.fdot(aq, kj) / sqrt_d for kj in aks]  # |q|.|k| / sqrt(d) >= |s|
                if self.name == "softmax":
                    mags = [a * (1 + t) for a, t in zip(sims, sm)]
                    self.wt.append([a / sqrt_d for a in sims])
                    self.wtm.append([m / sqrt_d for m in mags])
                else:
                    mags = [1 + t + t * t / 2 for t in sm]
                    s = [mp.fdot(qi, kj) / sqrt_d for kj in ks]
                    self.wt.append([(1 + t) / sqrt_d for t in s])
                    self.wtm.append([(1 + t) / sqrt_d for t in sm])
            else:
                mags = [mp.fdot(self.fqm[i], fkm) for fkm in self.fkm]
                if self.name == "cosformer":
                    cosines = [mp.cospi(mp.mpf(i - j) / (2 * big_m)) for j in range(nk)]
                    mags = [m * c for m, c in zip(mags, cosines)]
                    self.wt.append(cosines)
                    self.wtm.append(cosines)
                else:
                    self.wt.append(None)
                    self.wtm.append(None)
            self.am.append(mags)

    def _phi_kind(self) -> str:
        return "relu" if self.name == "cosformer" else self.name

    def _projections(self, x: list) -> tuple[list, Any, list]:
        """x' = x d^(-1/4) as `features` computes it, |x'|^2 / 2, and |W| |x'| per row."""
        mp = mpmath.mp
        xs = [t / mp.root(self.d, 4) for t in x]
        axs = [abs(t) for t in xs]
        return xs, mp.fdot(xs, xs) / 2, [mp.fdot([abs(t) for t in row], axs) for row in self.w]

    def _feature_mags(self, x: list, f: list) -> list:
        """M(phi_f): |phi_f| plus what rounding inside its argument can change."""
        mp = mpmath.mp
        if self.name in ("elu", "relu", "identity", "cosformer"):
            return [abs(t) for t in f]  # exact input, one rounding (or none)
        _, half_sq, absproj = self._projections(x)
        if self.name == "performer-positive":
            return [t * (1 + p + half_sq) for t, p in zip(f, absproj)]
        if self.name == "performer-hyperbolic":
            return [t * (1 + p + half_sq) for t, p in zip(f, absproj + absproj)]
        # trig: exp(h)/sqrt(m) has magnitude scale (1 + h); sin p: |sin p| + |W||x'|
        scale = mp.exp(half_sq) / mp.sqrt(len(self.w))
        return [(1 + half_sq) * (abs(t) + scale * p) for t, p in zip(f, absproj + absproj)]

    def jt(self, x: list, f: list, fm: list, u: list, um: list) -> tuple[list, list]:
        """J_phi(x)^T u and its magnitude, for u (and magnitudes um) over the features."""
        mp = mpmath.mp
        if self.name == "elu":
            deriv = [mp.one if t > 0 else ft for t, ft in zip(x, f)]  # exp(x) = phi(x)
            return [a * b for a, b in zip(u, deriv)], [a * b for a, b in zip(um, deriv)]
        if self.name == "identity":
            return list(u), list(um)
        if self.name in ("relu", "cosformer"):
            zero = mp.zero
            return [a if t > 0 else zero for a, t in zip(u, x)], [
                a if t > 0 else zero for a, t in zip(um, x)
            ]
        xs, _, _ = self._projections(x)
        c = 1 / mp.root(self.d, 4)
        m = len(self.w)
        if self.name == "performer-positive":
            z = [a * b for a, b in zip(u, f)]
            zm = [a * b for a, b in zip(um, fm)]
        elif self.name == "performer-hyperbolic":
            z = [u[r] * f[r] - u[m + r] * f[m + r] for r in range(m)]
            zm = [um[r] * fm[r] + um[m + r] * fm[m + r] for r in range(m)]
        else:  # trig: features [sin..., cos...]
            z = [u[r] * f[m + r] - u[m + r] * f[r] for r in range(m)]
            zm = [um[r] * fm[m + r] + um[m + r] * fm[r] for r in range(m)]
        y, ym = mp.fdot(u, f), mp.fdot(um, fm)
        sigma = PERFORMER_SIGN[self.name]
        cols = _transpose(self.w)
        out = [c * (mp.fdot(z, col) + sigma * xc * y) for col, xc in zip(cols, xs)]
        mags = [
            c * (mp.fdot(zm, [abs(t) for t in col]) + abs(xc) * ym) for col, xc in zip(cols, xs)
        ]
        return out, mags


def _factors(x: AttentionInputs, spec: Spec, b: int, h: int, i: int, n_keys: int):
    """(c w_ij, c M(w_ij)) for the n_keys keys j of row i at the working precision: the
    scale times the decay (mp.decay_weights; 1 without one)."""
    mp = mpmath.mp
    c = 1 / mp.sqrt(x.q.shape[3]) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
    if spec.decay is None:
        return [c] * n_keys, [c] * n_keys
    decay = x.decay[h] if x.decay.ndim == 1 else x.decay[b, h]
    weights, spreads = decay_weights(decay, i, spec.decay)  # spread: 1 + M(ln w_ij)
    return [c * w for w in weights], [c * w * t for w, t in zip(weights, spreads)]


def _gate_gradients(p: list, pm: list, general: bool) -> tuple[list, list]:
    """dL/dg_t = sum_{i >= t} R_i(t), R_i(t) = sum_{j < t} p_ij (p_ij = b_ij A_ij), in
    O(N^2), and its magnitude: that of this sum, or (general) that of the prefix sums'
    backward, sum_{s >= t} (sum_j |p_sj| + sum_i |p_is|) in magnitudes."""
    zero = mpmath.mp.zero
    n = len(p)
    dg, direct = [zero] * n, [zero] * n
    for i in range(n):
        row = row_m = zero
        for t in range(1, i + 1):
            row, row_m = row + p[i][t - 1], row_m + pm[i][t - 1]
            dg[t], direct[t] = dg[t] + row, direct[t] + row_m
    if not general:
        return dg, direct
    through, after = [zero] * n, zero
    for s in reversed(range(n)):
        after += mpmath.mp.fsum(pm[s]) + mpmath.mp.fsum(r[s] for r in pm)
        through[s] = after
    return dg, through


def _rounded(rows: list, mag_rows: list, rounding) -> list[np.ndarray]:
    """[float64 values, accepted-by-estimate mask, float64 magnitudes] of rows of mpf
    values and their magnitudes M (accepted: n 2^-p M at most 2^-64 of the value, or half
    the smallest subnormal)."""
    mp = mpmath.mp
    tiny = mp.mpf(2) ** -1076
    vals = np.array([[nearest(t) for t in row] for row in rows])
    ok = np.array(
        [
            [rounding * m <= max(abs(t) * mp.mpf(2) ** -64, tiny) for t, m in zip(row, row_m)]
            for row, row_m in zip(rows, mag_rows)
        ],
        dtype=bool,
    ).reshape(vals.shape)
    return [vals, ok, np.array([[nearest(m) for m in row] for row in mag_rows])]


def _head(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, b: int, h: int, prec: int, exact_zeros=True
):
    """Gradients of head (b, h) at `prec` bits: {name: [float64 values, accepted-by-estimate
    mask, float64 magnitudes M]}. The mask is False where the error estimate is too large
    (or D_i rounded to 0 for a map that is not positive: then the row is unresolved, not
    0/0). exact_zeros=False skips the exact-zero shortcuts, so that M is the magnitude of
    what a general evaluation computes there, dL/dg's through the prefix sums
    (gradient_magnitudes)."""
    _, _, nq, nk, d, _ = x.shape
    with mpmath.workprec(prec):
        mp = mpmath.mp

        def conv(arr: np.ndarray) -> list:
            return [[mp.mpf(t) for t in row] for row in arr.tolist()]

        qs, ks, vs, gs = conv(x.q[b, h]), conv(x.k[b, h]), conv(x.v[b, h]), conv(g_out[b, h])
        w = None if x.projection is None else conv(x.projection)
        kern = _Kernel(spec, qs, ks, w)
        rounding = mp.mpf(2) ** -prec * roundings(x, spec)
        zero = mp.zero
        ags, avs = _abs(gs), _abs(vs)
        # e_ij = b_ij c w_ij weight_ij, r_ij = A_ij / D_i and p_ij = b_ij A_ij (dL/dg's
        # terms), 0 where key j is not used
        e, em, r, rm, p, pm = ([[zero] * nk for _ in range(nq)] for _ in range(6))
        nan_rows, bad_rows = [], []
        for i in range(nq):
            js = list(allowed_keys(i, nk, spec.causal))
            f, fm = _factors(x, spec, b, h, i, len(js))
            a = [kern.a[i][j] * fj for j, fj in zip(js, f)]
            am = [kern.am[i][j] * fj for j, fj in zip(js, fm)]
            t = [mp.fdot(gs[i], vs[j]) for j in js]
            tm = [mp.fdot(ags[i], avs[j]) for j in js]
            den, den_m, single = mp.one, zero, None  # unnormalised: D_i = 1
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
                if exact_zeros and single is not None and (len(js) == 1 or spec.info.positive):
                    tbar, tbar_m = t[single], tm[single]
                else:
                    single = None
                    tbar = mp.fdot(a, t) / den
                    tbar_m = (mp.fdot(am, tm) + abs(tbar) * den_m) / abs(den)
            aden = abs(den)
            for n, j in enumerate(js):
                if n == single:
                    bij = bij_m = zero
                elif spec.normalize:
                    bij = (t[n] - tbar) / den
                    bij_m = (tm[n] + tbar_m + abs(bij) * den_m) / aden
                else:
                    bij, bij_m = t[n], tm[n]
                r[i][j] = a[n] / den
                rm[i][j] = (am[n] + abs(r[i][j]) * den_m) / aden
                wt, wtm = f[n], fm[n]
                if kern.wt[i] is not None:
                    wt, wtm = wt * kern.wt[i][j], wtm * kern.wtm[i][j]
                e[i][j], em[i][j] = bij * wt, bij_m * wtm
                p[i][j], pm[i][j] = bij * a[n], bij_m * am[n]

        eT, emT, rT, rmT = _transpose(e), _transpose(em), _transpose(r), _transpose(rm)
        grads, mags = {}, {}
        grads["v"] = [[mp.fdot(rT[j], col) for col in _transpose(gs)] for j in range(nk)]
        mags["v"] = [[mp.fdot(rmT[j], col) for col in _transpose(ags)] for j in range(nk)]
        if kern.dot:
            for name, coef, coef_m, other in (("q", e, em, ks), ("k", eT, emT, qs)):
                cols, acols = _transpose(other), _transpose(_abs(other))
                grads[name] = [[mp.fdot(row, col) for col in cols] for row in coef]
                mags[name] = [[mp.fdot(row, col) for col in acols] for row in coef_m]
        else:
            for name, coef, coef_m, xs, fx, fxm, other_f, other_fm in (
                ("q", e, em, qs, kern.fq, kern.fqm, kern.fk, kern.fkm),
                ("k", eT, emT, ks, kern.fk, kern.fkm, kern.fq, kern.fqm),
            ):
                cols, mcols = _transpose(other_f), _transpose(other_fm)
                grads[name], mags[name] = [], []
                for row, row_m, xi, fi, fim in zip(coef, coef_m, xs, fx, fxm):
                    u = [mp.fdot(row, col) for col in cols]
                    um = [mp.fdot(row_m, col) for col in mcols]
                    gi, mi = kern.jt(xi, fi, fim, u, um)
                    grads[name].append(gi)
                    mags[name].append(mi)
            homogeneous = spec.normalize and spec.eps == 0
            if exact_zeros and kern.name in ("relu", "cosformer") and homogeneous:
                # A_ij is homogeneous of degree 1 in relu(q_i), so out_i depends only on its
                # direction: with one positive component, dL/dq_i = 0 exactly.
                for i, qi in enumerate(qs):
                    if sum(t > 0 for t in qi) == 1:
                        grads["q"][i] = mags["q"][i] = [zero] * d
        result = {name: _rounded(grads[name], mags[name], rounding) for name in NAMES}
        if spec.decay == "gates":
            dg, dg_m = _gate_gradients(p, pm, general=not exact_zeros)
            result["g"] = [t[0] for t in _rounded([dg], [dg_m], rounding)]
        # unresolved rows first: a key also used by a 0/0 row is NaN for certain
        for i in bad_rows + nan_rows:
            keys = list(allowed_keys(i, nk, spec.causal))
            at = {"q": [i], "k": keys, "v": keys, "g": list(range(i + 1))}
            for name in result:
                result[name][0][at[name]] = result[name][2][at[name]] = np.nan
                result[name][1][at[name]] = i in nan_rows
        return result


def _agree(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Elements within one ulp of each other at p and 2p (NaN agreeing with NaN)."""
    with np.errstate(invalid="ignore"):
        close = np.abs(low - high) <= np.spacing(np.abs(high))
    return (low == high) | close | (np.isnan(low) & np.isnan(high))


def _refined_gradients(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, prec: int, max_prec: int
) -> dict[str, np.ndarray]:
    """exact_gradients starting at `prec` bits (compared with 2 prec first)."""
    b_, h_, nq, nk, d, dv = x.shape
    shapes = {"q": (nq, d), "k": (nk, d), "v": (nk, dv), "g": (nk,)}
    shapes = {name: shapes[name] for name in gradient_names(spec)}
    out = {name: np.empty((b_, h_, *shape)) for name, shape in shapes.items()}
    for b in range(b_):
        for h in range(h_):
            done = {name: np.zeros(shape, dtype=bool) for name, shape in shapes.items()}
            low = {name: vals for name, (vals, _, _) in _head(x, spec, g_out, b, h, prec).items()}
            p = prec
            while True:
                if 2 * p > max_prec:
                    left = {name: int((~done[name]).sum()) for name in shapes}
                    raise ReferenceAccuracyError(
                        f"mpmath gradients: elements of head ({b}, {h}) not resolved to "
                        f"float64 at {max_prec} bits (unresolved per gradient: {left})"
                    )
                high = _head(x, spec, g_out, b, h, 2 * p)
                for name in shapes:
                    vals, ok, _ = high[name]
                    new = ~done[name] & ok & _agree(low[name], vals)
                    out[name][b, h][new] = vals[new]
                    done[name] |= new
                if all(done[name].all() for name in shapes):
                    break
                low = {name: vals for name, (vals, _, _) in high.items()}
                p *= 2
    return out


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
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, max_prec: int = MAX_PREC
) -> dict[str, np.ndarray]:
    """For the loss L = sum(out * g_out) (g_out of out's shape (B, H, Nq, dv), float64 taken
    exactly), the exact dL/dq, dL/dk, dL/dv, each faithfully rounded to float64 (keys "q",
    "k", "v"), and for a gates spec dL/dg of the log-gates (key "g", (B, H, N)). The decay
    is x's (validate(..., decay)); W and gamma are held fixed. NaN where a row's
    denominator is exactly 0 (see the module docstring)."""
    return _refined_gradients(x, spec, _check_g_out(x, g_out), DEFAULT_PREC, max_prec)


def gradient_magnitudes(x: AttentionInputs, spec: Spec, g_out: np.ndarray) -> dict[str, np.ndarray]:
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
        [_head(x, spec, ga, b, h, DEFAULT_PREC, exact_zeros=False) for h in range(h_)]
        for b in range(b_)
    ]
    return {
        name: np.array([[head[name][2] for head in row] for row in heads])
        for name in gradient_names(spec)
    }


def reference_gradients(
    q: Any, k: Any, v: Any, g_out: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> dict[str, np.ndarray]:
    """Like reference.reference() for the gradients: validates q, k, v (and W, g_out, and
    the decay: gamma (H,) or the log-gates g (B, H, N), as validate takes it) for `spec`,
    then exact_gradients. Torch tensors or numpy arrays of any judged dtype, taken
    exactly."""
    return exact_gradients(validate(q, k, v, spec, projection, decay), spec, g_out)


__all__ = [
    "NAMES",
    "exact_gradients",
    "gradient_magnitudes",
    "gradient_names",
    "reference_gradients",
    "roundings",
]
