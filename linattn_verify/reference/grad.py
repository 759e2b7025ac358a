"""Exact reference gradients of attention, faithfully rounded to float64 (mpmath).

For the loss L = sum_{i,c} out_ic g_ic (g taken exactly, the shape of out) this module gives
dL/dq, dL/dk, dL/dv from the definition, with the projection W of the Performer maps held
fixed. Derivation (reverse-mode chain rule; Baydin et al. 2018, "Automatic differentiation
in machine learning: a survey", sec. 3.1, or any calculus text):

    a_ij = sim(q_i, k_j) for the keys j that query i uses (common.allowed_keys)
    D_i = eps + sum_j a_ij,   out_i = (sum_j a_ij v_j) / D_i
    dL/dv_j  = sum_i a_ij g_i / D_i                       (over the queries i that use key j)
    dL/da_ij = g_i . (v_j - out_i) / D_i  =: b_ij         (quotient rule on N_i / D_i)
    dL/dq_i  = sum_j b_ij da_ij/dq_i,   dL/dk_j = sum_i b_ij da_ij/dk_j

b_ij is computed as (t_ij - tbar_i) / D_i with t_ij = g_i . v_j and tbar_i = g_i . out_i =
(sum_j a_ij t_ij) / D_i: it cancels when v_j is near out_i, which the error estimate
below accounts for. The kernel derivatives (formulas and sources as in specs.FEATURE_MAPS,
x' = x d^(-1/4), p = W x', h = |x'|^2 / 2, c = d^(-1/4)):

- softmax, a = exp(s), s = q.k / sqrt(d) (Vaswani et al. 2017, eq. 1): da/dq_i = a k_j / sqrt(d),
  da/dk_j = a q_i / sqrt(d).
- taylor, a = 1 + s + s^2/2 (Arora et al. 2024, sec. 3): da/ds = 1 + s.
- kernelised maps, a = phi(q_i) . phi(k_j): dL/dq_i = J_phi(q_i)^T U_i with U_i = sum_j b_ij
  phi(k_j); dL/dk_j = J_phi(k_j)^T sum_i b_ij phi(q_i). With
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

The similarities and features themselves come from mp.py (`similarities`, `features`), so the
forward function differentiated here is exactly the one the mpmath reference evaluates.

Zero denominators: where D_i is exactly 0 (relu or cosFormer with eps = 0 and no positive
similarity in row i), out_i is 0/0 and L is undefined. Then dL/dq_i is NaN, and so are
dL/dk_j and dL/dv_j (all components) for every key j that row i uses; the rest is exact.

Precision control, as in mp.py: each head is evaluated at p and 2p bits (p = 113 first);
an element is accepted when the two float64 roundings are within one ulp of each other
AND a first-order error estimate at 2p, n 2^-2p M, is at most 2^-64 of the value (or half
the smallest subnormal). M bounds the sum of the absolute values of everything the element
is computed from, propagated by first-order rules (sums add magnitudes, a product y z
contributes M(y) M(z), a quotient y / z gives (M(y) + |y/z| M(z)) / |z|, exp(y) gives
exp(y) (1 + M(y)), sin(y) gives |sin y| + M(y)), so it grows with every cancellation: in
b_ij, in sign-changing (trig) features, inside exponents. n is a generous bound on the
number of roundings on any path (`roundings`). Elements not accepted are recomputed at
4p, 8p, ... until max_prec, then ReferenceAccuracyError. Each element is accepted on its
own, so whether dL/dk_j or dL/dv_j is accepted, and its value, depends only on the rows
that use key j (with causal, g_i for i < j cannot change it).

Exact zeros settle only once n 2^-p M is below 2^-1076 (1808 bits for O(1) inputs), so the
two that are common are set exactly instead: with eps = 0, a row whose keys all have zero
weight but one, j (always so for causal row 0), has out_i = v_j exactly, so b_ij = 0 and
tbar_i = t_ij; and for relu and cosFormer with eps = 0, a_ij is homogeneous of degree 1 in
relu(q_i), so out_i depends only on its direction and dL/dq_i = 0 when q_i has exactly one
positive component. Others (e.g. dL/dq with identical keys) take the long way.
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np

from ..inputs import AttentionInputs, as_float64, validate
from ..specs import Spec, SpecError
from .common import MAX_PREC, ReferenceAccuracyError, allowed_keys
from .mp import DEFAULT_PREC, features, nearest, similarities

NAMES = ("q", "k", "v")
PERFORMER_SIGN = {"performer-positive": -1, "performer-hyperbolic": -1, "performer-trig": 1}


def roundings(x: AttentionInputs, spec: Spec) -> int:
    """A generous bound on the roundings behind any gradient element (the n of gamma_n),
    for inputs of x's shape:
    a similarity (x' scaling, |x'|^2, W x', exp/sin/cos, 1/sqrt(m), the feature dot
    product: under n_features + 2d + 12), D_i, tbar_i and b_ij (sums over Nk keys and a dot
    over dv), the weight of b_ij, then the sum over Nq or Nk and J^T (under 2d + 8 more).
    Products add the counts of their factors, hence the factor 4. The features are those
    this module differentiates: d of them but for the Performer maps (m or 2m)."""
    _, _, nq, nk, d, dv = x.shape
    n_features = d
    if spec.info.needs_projection:
        n_features = spec.info.feature_dim(d, x.projection.shape[0])
    return 4 * (n_features + 2 * d + 12) + 4 * (nq + nk) + 2 * (d + dv) + 32


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


def _head(
    x: AttentionInputs, spec: Spec, g: np.ndarray, b: int, h: int, prec: int, exact_zeros=True
):
    """Gradients of head (b, h) at `prec` bits: {name: [float64 values, accepted-by-estimate
    mask, float64 magnitudes M]}. The mask is False where the error estimate is too large
    (or D_i rounded to 0 for a map that is not positive: then the row is unresolved, not
    0/0). exact_zeros=False skips the two exact-zero shortcuts, so that M is the magnitude
    of what a general evaluation computes there (gradient_magnitudes)."""
    _, _, nq, nk, d, _ = x.shape
    with mpmath.workprec(prec):
        mp = mpmath.mp

        def conv(arr: np.ndarray) -> list:
            return [[mp.mpf(t) for t in row] for row in arr.tolist()]

        qs, ks, vs, gs = conv(x.q[b, h]), conv(x.k[b, h]), conv(x.v[b, h]), conv(g[b, h])
        w = None if x.projection is None else conv(x.projection)
        kern = _Kernel(spec, qs, ks, w)
        rounding = mp.mpf(2) ** -prec * roundings(x, spec)
        zero = mp.zero
        ags, avs = _abs(gs), _abs(vs)
        # e_ij = b_ij * weight_ij and r_ij = a_ij / D_i, 0 where key j is not used
        e = [[zero] * nk for _ in range(nq)]
        em = [[zero] * nk for _ in range(nq)]
        r = [[zero] * nk for _ in range(nq)]
        rm = [[zero] * nk for _ in range(nq)]
        nan_rows, bad_rows = [], []
        for i in range(nq):
            js = list(allowed_keys(i, nk, spec.causal))
            a = [kern.a[i][j] for j in js]
            am = [kern.am[i][j] for j in js]
            den = mp.fsum(a) + spec.eps
            den_m = mp.fsum(am) + spec.eps
            if den == 0:
                (nan_rows if spec.info.positive else bad_rows).append(i)
                continue
            aden = abs(den)
            t = [mp.fdot(gs[i], vs[j]) for j in js]
            tm = [mp.fdot(ags[i], avs[j]) for j in js]
            # One key of non-zero weight and eps = 0: out_i = v_j exactly, so b_ij = 0 and
            # tbar_i = t_ij (with positive maps a computed 0 is an exact 0).
            nonzero = [n for n, an in enumerate(a) if an != 0]
            single = nonzero[0] if len(nonzero) == 1 and spec.eps == 0 else None
            if exact_zeros and single is not None and (len(js) == 1 or spec.info.positive):
                tbar, tbar_m = t[single], tm[single]
            else:
                single = None
                tbar = mp.fdot(a, t) / den
                tbar_m = (mp.fdot(am, tm) + abs(tbar) * den_m) / aden
            for n, j in enumerate(js):
                if n == single:
                    bij = bij_m = zero
                else:
                    bij = (t[n] - tbar) / den
                    bij_m = (tm[n] + tbar_m + abs(bij) * den_m) / aden
                r[i][j] = a[n] / den
                rm[i][j] = (am[n] + abs(r[i][j]) * den_m) / aden
                if kern.wt[i] is None:
                    e[i][j], em[i][j] = bij, bij_m
                else:
                    e[i][j], em[i][j] = bij * kern.wt[i][j], bij_m * kern.wtm[i][j]

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
            if exact_zeros and kern.name in ("relu", "cosformer") and spec.eps == 0:
                # a_ij is homogeneous of degree 1 in relu(q_i), so out_i depends only on its
                # direction: with one positive component, dL/dq_i = 0 exactly.
                for i, qi in enumerate(qs):
                    if sum(t > 0 for t in qi) == 1:
                        grads["q"][i] = mags["q"][i] = [zero] * d

        tiny = mp.mpf(2) ** -1076
        result = {}
        for name in NAMES:
            vals = np.array([[nearest(t) for t in row] for row in grads[name]])
            ok = np.array(
                [
                    [rounding * m <= max(abs(t) * mp.mpf(2) ** -64, tiny) for t, m in zip(rg, rmg)]
                    for rg, rmg in zip(grads[name], mags[name])
                ],
                dtype=bool,
            ).reshape(vals.shape)
            result[name] = [vals, ok, np.array([[nearest(m) for m in row] for row in mags[name]])]
        # unresolved rows first: a key also used by a 0/0 row is NaN for certain
        for i in bad_rows + nan_rows:
            keys = list(allowed_keys(i, nk, spec.causal))
            for name, idx in (("q", [i]), ("k", keys), ("v", keys)):
                result[name][0][idx] = result[name][2][idx] = np.nan
                result[name][1][idx] = i in nan_rows
        return result


def _agree(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Elements within one ulp of each other at p and 2p (NaN agreeing with NaN)."""
    with np.errstate(invalid="ignore"):
        close = np.abs(low - high) <= np.spacing(np.abs(high))
    return (low == high) | close | (np.isnan(low) & np.isnan(high))


def _refined_gradients(
    x: AttentionInputs, spec: Spec, g: np.ndarray, prec: int, max_prec: int
) -> dict[str, np.ndarray]:
    """exact_gradients starting at `prec` bits (compared with 2 prec first)."""
    b_, h_, nq, nk, d, dv = x.shape
    shapes = {"q": (nq, d), "k": (nk, d), "v": (nk, dv)}
    out = {name: np.empty((b_, h_, *shape)) for name, shape in shapes.items()}
    for b in range(b_):
        for h in range(h_):
            done = {name: np.zeros(shape, dtype=bool) for name, shape in shapes.items()}
            low = {name: vals for name, (vals, _, _) in _head(x, spec, g, b, h, prec).items()}
            p = prec
            while True:
                if 2 * p > max_prec:
                    left = {name: int((~done[name]).sum()) for name in NAMES}
                    raise ReferenceAccuracyError(
                        f"mpmath gradients: elements of head ({b}, {h}) not resolved to "
                        f"float64 at {max_prec} bits (unresolved per gradient: {left})"
                    )
                high = _head(x, spec, g, b, h, 2 * p)
                for name in NAMES:
                    vals, ok, _ = high[name]
                    new = ~done[name] & ok & _agree(low[name], vals)
                    out[name][b, h][new] = vals[new]
                    done[name] |= new
                if all(done[name].all() for name in NAMES):
                    break
                low = {name: vals for name, (vals, _, _) in high.items()}
                p *= 2
    return out


def _check_g(x: AttentionInputs, g: Any) -> np.ndarray:
    """g as an exact float64 array of out's shape (B, H, Nq, dv), or a SpecError."""
    ga, _ = as_float64(g, "g")
    b_, h_, nq, _, _, dv = x.shape
    if ga.shape != (b_, h_, nq, dv):
        raise SpecError(
            f"g must have the shape of the attention output (B, H, Nq, dv) = "
            f"{(b_, h_, nq, dv)}, got {ga.shape}"
        )
    return ga


def exact_gradients(
    x: AttentionInputs, spec: Spec, g: np.ndarray, max_prec: int = MAX_PREC
) -> dict[str, np.ndarray]:
    """For the loss L = sum(out * g) (g of out's shape (B, H, Nq, dv), float64 taken exactly),
    the exact dL/dq, dL/dk, dL/dv, each faithfully rounded to float64 (keys "q", "k", "v").
    Random-feature specs: the projection W is held fixed. NaN where a row's denominator is
    exactly 0 (see the module docstring)."""
    return _refined_gradients(x, spec, _check_g(x, g), DEFAULT_PREC, max_prec)


def gradient_magnitudes(x: AttentionInputs, spec: Spec, g: np.ndarray) -> dict[str, np.ndarray]:
    """The magnitude M of each gradient element (keys "q", "k", "v"; NaN where the gradient
    is): the first-order sum of the absolute values of everything a general evaluation
    computes it from, at DEFAULT_PREC bits (a magnitude, not a value: no refinement). The
    scale gradient errors are measured in (accuracy/gradient.py); unlike the precision
    control's, it is not 0 where the exact gradient is known to be 0 (N = 1 rows, relu rows
    with one positive component), since an evaluation rounds there too."""
    ga = _check_g(x, g)
    b_, h_ = x.shape[:2]
    heads = [
        [_head(x, spec, ga, b, h, DEFAULT_PREC, exact_zeros=False) for h in range(h_)]
        for b in range(b_)
    ]
    return {name: np.array([[head[name][2] for head in row] for row in heads]) for name in NAMES}


def reference_gradients(q: Any, k: Any, v: Any, g: Any, spec: Spec, projection: Any = None):
    """Like reference.reference() for the gradients: validates q, k, v (and W, g) for
    `spec`, then exact_gradients. Torch tensors or numpy arrays of any judged dtype, taken
    exactly."""
    return exact_gradients(validate(q, k, v, spec, projection), spec, g)


__all__ = ["exact_gradients", "gradient_magnitudes", "reference_gradients", "roundings"]
