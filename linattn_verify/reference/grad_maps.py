"""The per-map part of the exact gradients (grad.py) at the working precision: for each feature
map, the similarities a_ij and their magnitudes M, the weight that turns b_ij into the
coefficient of dL/dq_i and dL/dk_j, and J_phi^T. The derivatives, with their sources (softmax:
Vaswani et al. 2017, eq. 1; taylor: Arora et al. 2024, sec. 3; elu + 1: Katharopoulos et al.
2020, eq. 7; cosFormer: Qin et al. 2022, eq. 9-11; Performer: Choromanski et al. 2021, Lemma 1
and sec. 2.3), and the rules for M: grad.py's module docstring."""

from __future__ import annotations

import mpmath

from ..specs import Spec
from .mp import abs_rows, features, similarities

NON_NEGATIVE = ("elu", "relu", "cosformer")  # maps whose features are >= 0
PERFORMER_SIGN = {"performer-positive": -1, "performer-hyperbolic": -1, "performer-trig": 1}


def _transpose(rows: list) -> list:
    return [list(col) for col in zip(*rows)]


class Kernel:
    """The per-map part at the working precision: a_ij and its magnitude, the weight that
    turns b_ij into the coefficient e_ij of the q/k derivative, and the sums over keys
    (for dL/dq_i) or queries (dL/dk_j) of those coefficients, through J^T; per_feature:
    the coefficients are lists over the features (Gradients.per_feature: channel gates);
    logits: the family's similarity of the logit s = q.k / sqrt(d) (Gradients.logits:
    softmax's), None for the map's."""

    def __init__(
        self,
        spec: Spec,
        qs: list,
        ks: list,
        w: list | None,
        per_feature: bool = False,
        logits=None,
    ) -> None:
        mp = mpmath.mp
        self.name = spec.feature_map
        self.d = len(qs[0])
        nq, nk = len(qs), len(ks)
        big_m = max(nq, nk)
        self.dot = logits is not None or self.name == "taylor"
        # per-feature weights (channel gates): the coefficients e_ij are lists, e_ijm
        self.channel = per_feature
        self.w = w
        self.x = {"q": qs, "k": ks}
        # the Performer maps' x' = x d^(-1/4) as `features` computes it, per row; c, and
        # the columns of W and |W|
        self.scaled = {"q": None, "k": None}
        if w is not None:
            root = mp.root(self.d, 4)
            self.c = 1 / root
            self.scaled = {
                side: [[t / root for t in x] for x in rows] for side, rows in self.x.items()
            }
            self.aw = abs_rows(w)
            self.w_cols = _transpose(w)
            self.aw_cols = _transpose(self.aw)
        self.f = self.fm = {"q": None, "k": None}
        if not self.dot:
            self.f = {
                side: [features(x, w, self._phi_kind()) for x in rows]
                for side, rows in self.x.items()
            }
            self.fm = {
                side: [self._feature_mags(side, n, f) for n, f in enumerate(self.f[side])]
                for side in self.x
            }
        # what dL/dq_i (dL/dk_j) sums e_ij (e_ij over i) against: the other side's rows
        # (dot maps) or features, transposed, and their magnitudes
        other = {"q": "k", "k": "q"}
        if self.dot:
            self.cols = {side: _transpose(self.x[other[side]]) for side in self.x}
            self.mcols = {side: _transpose(abs_rows(self.x[other[side]])) for side in self.x}
        else:
            self.cols = {side: _transpose(self.f[other[side]]) for side in self.x}
            self.mcols = {side: _transpose(self.fm[other[side]]) for side in self.x}
        fq, fk = self.f["q"], self.f["k"]
        # a_ij (all keys; masking is done by the caller), its magnitude, the weight and its
        # magnitude: e_ij = b_ij * weight_ij.
        self.a, self.am, self.wt, self.wtm = [], [], [], []
        sqrt_d = mp.sqrt(self.d)
        aks = abs_rows(ks)
        for i, qi in enumerate(qs):
            if logits is not None:  # a_ij, M, da/ds and its M: weight_ij = (da/ds) / sqrt(d)
                sims, mags, da, dam = logits(qi, ks, aks)
                self.a.append(sims)
                self.wt.append([t / sqrt_d for t in da])
                self.wtm.append([m / sqrt_d for m in dam])
                self.am.append(mags)
                continue
            sims = similarities(qi, None if fq is None else fq[i], i, ks, fk, spec, big_m)
            self.a.append(sims)
            if self.dot:  # taylor, a = 1 + s + s^2 / 2
                aq = [abs(t) for t in qi]
                sm = [mp.fdot(aq, kj) / sqrt_d for kj in aks]  # |q|.|k| / sqrt(d) >= |s|
                mags = [1 + t + t * t / 2 for t in sm]
                s = [mp.fdot(qi, kj) / sqrt_d for kj in ks]
                self.wt.append([(1 + t) / sqrt_d for t in s])
                self.wtm.append([(1 + t) / sqrt_d for t in sm])
            else:
                if self.name in NON_NEGATIVE:
                    # |phi| = phi: |phi(q_i)|.|phi(k_j)| (times cosFormer's cosine, > 0 for
                    # |i - j| < M) is computed as a_ij is, to the bit
                    mags = list(sims)
                else:
                    fqm = self.fm["q"][i]
                    mags = [mp.fdot(fqm, fkm) for fkm in self.fm["k"]]
                if self.name == "cosformer":
                    cosines = [mp.cospi(mp.mpf(i - j) / (2 * big_m)) for j in range(nk)]
                    self.wt.append(cosines)
                    self.wtm.append(cosines)
                else:
                    self.wt.append(None)
                    self.wtm.append(None)
            self.am.append(mags)

    def _phi_kind(self) -> str:
        return "relu" if self.name == "cosformer" else self.name

    def _feature_mags(self, side: str, n: int, f: list) -> list:
        """M(phi_f) of row n of side "q" or "k": |phi_f| plus what rounding inside its
        argument can change."""
        mp = mpmath.mp
        if self.name in ("elu", "relu", "identity", "cosformer"):
            return [abs(t) for t in f]  # exact input, one rounding (or none)
        xs = self.scaled[side][n]
        axs = [abs(t) for t in xs]
        half_sq = mp.fdot(xs, xs) / 2  # |x'|^2 / 2, and |W| |x'| per row
        absproj = [mp.fdot(row, axs) for row in self.aw]
        if self.name == "performer-positive":
            return [t * (1 + p + half_sq) for t, p in zip(f, absproj)]
        if self.name == "performer-hyperbolic":
            return [t * (1 + p + half_sq) for t, p in zip(f, absproj + absproj)]
        # trig: exp(h)/sqrt(m) has magnitude scale (1 + h); sin p: |sin p| + |W||x'|
        scale = mp.exp(half_sq) / mp.sqrt(len(self.w))
        return [(1 + half_sq) * (abs(t) + scale * p) for t, p in zip(f, absproj + absproj)]

    def gradient(self, side: str, n: int, coef: list, coef_m: list) -> tuple[list, list]:
        """dL/dq_n (side "q", coef the row e_n.) or dL/dk_n (side "k", coef the column
        e_.n) and its magnitude (coef_m those of the coefficients). Channel gates: each
        coefficient is a list over the features, u_m = sum_j e_njm phi(k_j)_m (and so for
        dL/dk_n over the queries)."""
        mp = mpmath.mp
        cols, mcols = self.cols[side], self.mcols[side]
        if self.dot:
            return [mp.fdot(coef, col) for col in cols], [mp.fdot(coef_m, col) for col in mcols]
        if self.channel:
            u = [mp.fdot([e[m] for e in coef], col) for m, col in enumerate(cols)]
            um = [mp.fdot([e[m] for e in coef_m], col) for m, col in enumerate(mcols)]
        else:
            u = [mp.fdot(coef, col) for col in cols]
            um = [mp.fdot(coef_m, col) for col in mcols]
        return self.jt(side, n, u, um)

    def jt(self, side: str, n: int, u: list, um: list) -> tuple[list, list]:
        """J_phi(x)^T u and its magnitude for row n of side "q" or "k", for u (and
        magnitudes um) over the features. An elu row whose every entry is <= 0 may be taken
        as exp(x - top) exp(top), top = max_m x_m (golden_features.py, for range): top's
        gradient, exactly 0, is computed as the rounding of sum_m phi_m u_m and lands on
        entry top, so that entry's magnitude adds the row's."""
        mp = mpmath.mp
        x, f, fm = self.x[side][n], self.f[side][n], self.fm[side][n]
        if self.name == "elu":
            deriv = [mp.one if t > 0 else ft for t, ft in zip(x, f)]  # exp(x) = phi(x)
            mags = [a * b for a, b in zip(um, deriv)]
            if all(t <= 0 for t in x):  # the row's scale's gradient (jt's docstring)
                top = max(range(len(x)), key=lambda m: x[m])
                mags[top] += mp.fsum(mags)
            return [a * b for a, b in zip(u, deriv)], mags
        if self.name == "identity":
            return list(u), list(um)
        if self.name in ("relu", "cosformer"):
            zero = mp.zero
            return [a if t > 0 else zero for a, t in zip(u, x)], [
                a if t > 0 else zero for a, t in zip(um, x)
            ]
        xs = self.scaled[side][n]
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
        sigma, c = PERFORMER_SIGN[self.name], self.c
        out = [c * (mp.fdot(z, col) + sigma * xc * y) for col, xc in zip(self.w_cols, xs)]
        mags = [c * (mp.fdot(zm, col) + abs(xc) * ym) for col, xc in zip(self.aw_cols, xs)]
        return out, mags
