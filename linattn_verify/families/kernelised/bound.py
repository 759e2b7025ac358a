"""Kernelised attention's terms of the shared a-priori bound (accuracy/bound.py): the
features' error model psi, a head's sums in balls and in float64, the denominator's
condition number, and the state's bound; the families built on kernelised (the decays:
families/decayed, families/channel_gates) pass their weights in.

psi(x_i) bounds the absolute error of any sane evaluation of phi(x_i) in precision u
(feature_errors), under the feature model in force (rounding.FEATURE_MODEL). Standard model
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2.2 and 3.1):
fl(a op b) = (a op b)(1 + delta), |delta| <= u, no underflow or overflow; elementary
functions return within C_LIB units. Feature models (rounding.feature_model): "standard"
admits every sane evaluation of each map, the textbook ones included: elu(x) + 1 as F.elu(x)
+ 1 = (exp(x) - 1) + 1, whose error is absolute (C_LIB u) rather than relative, the usual
max stabilisers of the exponential maps, any summation order. "relative" (vet --strict)
holds elu features to relative accuracy in entirely negative rows too, as a shifted
evaluation attains (the golden implementation's). Each weight a_ij = phi(q_i).phi(k_j) is
computed from features with absolute errors psi(q_i), psi(k_j) and summed over m features:
F sums (psi(q).|phi(k)| + |phi(q)|.psi(k) + psi(q).psi(k)) |v| (resp. 1) beside A's
|phi(q)|.|phi(k)| |v| (resp. 1) (accuracy/bound.py turns them into the bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flint import arb

from ...inputs import AttentionInputs
from ...reference.balls import Head, balls, features, kernel_sums
from ...reference.certified import (
    SAFETY,
    depth,
    float_features,
    gamma64,
    performer_arguments,
    streamed_sums,
)
from ...reference.certified_decay import FEW_ROUNDINGS
from ...rounding import C_LIB, FEATURE_MODEL, gamma, grow
from ...specs import Spec

# ln of float32's largest value: an unshifted exp(x) below -88 underflows float32, so any
# working elu implementation shifts rows that negative (float64 ones may not: 745 there,
# and their extra error |r| u beyond 88 u is charged to them)
ELU_UNSHIFTED_MAX = 88.0


def feature_errors(
    x: np.ndarray,
    positions: np.ndarray,
    big_m: int,
    w,
    name: str,
    u: float,
    stab: float,
    phi: np.ndarray,
) -> np.ndarray:
    """psi(x_i): bounds on the absolute error of any sane evaluation of phi(x_i) in
    precision u, given |phi| <= phi (float64 upper bounds); inflated by SAFETY, which
    covers this function's own float64 arithmetic.

    stab bounds the magnitude of the stabiliser a Performer implementation may subtract from
    its exponents (the largest exponent of the head).
    """
    # x + 1 (one rounding), or exp(x) for x <= 0 without cancellation: directly (C_LIB
    # relative), as exp2(x log2 e) (absolute |x| e^x u), or shifted by the row's largest
    # coordinate r < 0, exp(x - r) e^r (absolute |x - r| e^(x - r) u <= u / e, times e^r).
    # |x| e^x <= e^r (|r| e^(x - r) + 1/e), and no implementation leaves a row unshifted
    # below -ELU_UNSHIFTED_MAX (exp underflows there): within u (C_LIB e^r + phi + min(|r|,
    # ELU_UNSHIFTED_MAX) phi). In a row with a positive coordinate (r = 0) this is u (C_LIB +
    # phi) and admits expm1(x) + 1; in an entirely negative row the relative model does not:
    # expm1(x) + 1 cancels there (to exactly 0 below -17 in float32). The standard model
    # admits it there too: its error is within (e^x + C_LIB (1 - e^x)) u (1 + u), so the
    # absolute term is C_LIB u whatever the row.
    if name == "elu":
        top = np.minimum(x.max(axis=1, keepdims=True), 0.0)
        big = C_LIB * (1.0 if FEATURE_MODEL.get() == "standard" else np.exp(top))
        lift = 1 + np.minimum(-top, ELU_UNSHIFTED_MAX)
        psi = np.where(x > 0, phi, big + lift * phi) * u * (1 + u)
    elif name in ("relu", "identity"):  # exact features
        psi = np.zeros_like(phi)
    elif name == "cosformer":
        # theta = pi i / 2M after 3 roundings: |d theta| <= 3 u theta; cos and sin add C_LIB u
        # (absolute, not relative: cos is small near pi/2); the product with relu(x) one more
        theta = np.pi * positions[:, None] / (2 * big_m)
        rel = np.maximum(x, 0.0) * (3 * theta + C_LIB) * u * (1 + u)
        psi = np.concatenate([rel, rel], 1) + phi * u
    elif name == "taylor":
        # 1 exact; x' = x / d^(1/4): the root (C_LIB) and the division (1); x'_a x'_b / sqrt(2):
        # two such factors, their product, sqrt(2) (C_LIB) and the division: 3 C_LIB + 4
        _n, d = x.shape
        lin, quad = gamma(C_LIB + 1, u), gamma(3 * C_LIB + 4, u)
        rel = np.concatenate([np.zeros(1), np.full(d, lin), np.full(d * d, quad)])
        psi = phi * rel
    else:
        psi = _performer_errors(x, w, name, u, stab, phi)
    return psi * SAFETY


def _performer_errors(x, w, name: str, u: float, stab: float, phi: np.ndarray) -> np.ndarray:
    """psi of the Performer maps (feature_errors)."""
    d, m = x.shape[1], w.shape[0]
    _, _, half_sq, err_half = performer_arguments(x, w)
    hs = half_sq + err_half
    norms = (np.abs(x) @ np.abs(w).T) * SAFETY
    scale = d**-0.25 * SAFETY
    # exponent: the dot product over d, x' = x d^(-1/4) (C_LIB + 1), subtracting |x'|^2/2 and
    # a stabiliser (2), exp as exp2(x log2 e) (1); then the value: a feature may be formed
    # as exp(a - max a) exp(scale - shift) (two exps, 2 C_LIB, and their product, 1) and
    # divided by sqrt(m) (1)
    g_arg, g_lib = gamma(d + C_LIB + 4, u), gamma(2 * C_LIB + 2, u)
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "performer-trig":  # exp(|x'|^2/2)/sqrt(m) times sin/cos of W x'
            rel_e = grow(np.expm1(g_arg * (hs + stab)), g_lib)
            e = np.exp(hs) / math.sqrt(m) * SAFETY
            dtheta = g_arg * np.concatenate([norms, norms], 1) * scale + C_LIB * u
            return phi * rel_e + e * dtheta * (1 + rel_e)
        dalpha = g_arg * (norms * scale + hs + stab)  # exp(+-W x' - |x'|^2/2) / sqrt(m or 2m)
        if name == "performer-hyperbolic":
            dalpha = np.concatenate([dalpha, dalpha], 1)
        return phi * grow(np.expm1(dalpha), g_lib)


def _stabiliser(q: np.ndarray, k: np.ndarray, w, name: str) -> float:
    """Largest |exponent| over the head's queries and keys for the Performer maps."""
    if not name.startswith("performer"):
        return 0.0
    tops = [0.0]
    for rows in (q, k):
        proj, err_proj, half_sq, err_half = performer_arguments(rows, w)
        tops.append(float(np.max(np.abs(proj) + err_proj + half_sq + err_half)))
    return max(tops) * SAFETY


def _features(x: np.ndarray, positions: np.ndarray, big_m: int, w, name: str, u, stab):
    """(features in float64, upper bounds on the exact |phi(x_i)|, psi(x_i))."""
    f = float_features(x, positions, big_m, w, name)
    a = (np.abs(f.phi) + f.err) * FEW_ROUNDINGS  # |phi^| + err, rounded: two roundings
    return f, a, feature_errors(x, positions, big_m, w, name, u, stab, a)


def feature_count(spec: Spec, d: int, rows: int | None) -> int:
    """m, the features per weight phi(q_i).phi(k_j) (W's rows for the Performer maps)."""
    return spec.info.feature_dim(d, rows)


def _abs(rows: list[list[arb]]) -> list[list[arb]]:
    return [[abs(t) for t in r] for r in rows]


def _add(*mats: list[list[arb]]) -> list[list[arb]]:
    return [[sum(ts, arb(0)) for ts in zip(*rows, strict=True)] for rows in zip(*mats, strict=True)]


def ball_sums(head: Head, spec: Spec, u: float, x: list[list[arb]], sums=kernel_sums):
    """(N and D, A, F, m) of a head in arb balls, unscaled (accuracy/ball_sums.py takes it
    on): N and D the sums of phi(q_i).phi(k_j) times v (none) and 1, A and F (module
    docstring) with x = [|v|, 1] as columns, m features per term. sums: balls.kernel_sums,
    or a decay's (families/decayed/bound.py), rows sum_j w_ij (fq_i . fk_j) x_j."""
    name, causal = spec.feature_map, spec.causal
    nq, nk = head.q.shape[0], head.k.shape[0]
    big_m = max(nq, nk)
    stab = _stabiliser(head.q, head.k, head.w, name)
    pq, pk = (features(t, range(len(t)), head, name) for t in (head.q, head.k))
    sq, sk = (
        balls(_features(t, np.arange(len(t)), big_m, head.w, name, u, stab)[2])
        for t in (head.q, head.k)
    )
    aq, ak = _abs(pq), _abs(pk)
    ones = balls(np.ones((nk, 1)))
    nd = sums(pq, pk, ones, causal)
    a_sums = sums(aq, ak, x, causal)
    f = _add(sums(sq, ak, x, causal), sums(aq, sk, x, causal), sums(sq, sk, x, causal))
    return nd, a_sums, f, len(pq[0])


def _fast_plain(head: Head, spec: Spec, features):
    """(A, F, (D^, a bound on |D^ - D|) or None unnormalised) of a head without a decay,
    unscaled, from certified.streamed_sums: the computed sums of n non-negative terms are
    at least (1 - gamma_n) the exact ones (Higham 2002, Lemma 3.1 and eq. 3.5), n the
    summation depth; D^ errs by its rounding, gamma_n sum |phi^(q)|.|phi^(k)| <= gamma_n A,
    and by the features' errors, sum err_q.(|phi^(k)| + err_k) + |phi(q)|.err_k."""
    q, k, v = head.q, head.k, head.v
    nq, nk = q.shape[0], k.shape[0]
    normalize = spec.normalize

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        f, a, psi = features(q, start, stop)
        both = [f.phi, np.concatenate([f.err, a], 1)] if normalize else []
        return [a, np.concatenate([psi, a], 1), *both]

    def rights(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        f, a, psi = features(k, start, stop)
        ones = np.ones((stop - start, 1))
        mags = np.concatenate([np.abs(v[start:stop]), ones], 1)
        grown = (a + psi) * FEW_ROUNDINGS
        both = [(f.phi, ones), (np.concatenate([a + f.err, f.err], 1), ones)] if normalize else []
        return [(a, mags), (np.concatenate([grown, psi], 1), mags), *both]

    blocks = list(streamed_sums(lefts, rights, nq, nk, spec.causal))
    sums = [np.concatenate([b[2][i] for b in blocks]) for i in range(len(blocks[0][2]))]
    m = spec.info.feature_dim(q.shape[1], None if head.w is None else head.w.shape[0])
    g64 = gamma64(depth(2 * m, nk))
    a, f = (t / (1 - g64) * FEW_ROUNDINGS for t in sums[:2])
    if not normalize:
        return a, f, None
    value, errs = sums[2][:, 0], sums[3][:, 0]
    return a, f, (value, (g64 * a[:, -1] + errs / (1 - g64)) * SAFETY)


def fast_sums(head: Head, spec: Spec, u: float, sums=_fast_plain):
    """(A, F, den, m) of a head in float64, unscaled, the same quantities as ball_sums' with
    the sums' own rounding bounded a posteriori (accuracy/fast_sums.py takes it on): for
    long sequences, where ball arithmetic is too slow. sums: _fast_plain, or a decay's
    (families/decayed/bound.py), given the head's features, upper bounds and psi by rows."""
    q, k, w, name = head.q, head.k, head.w, spec.feature_map
    big_m, stab = max(q.shape[0], k.shape[0]), _stabiliser(q, k, w, name)

    def features(x: np.ndarray, start: int, stop: int):
        """(features, upper bounds on the exact |phi|, psi) of rows start:stop of x."""
        return _features(x[start:stop], np.arange(start, stop), big_m, w, name, u, stab)

    a, f, den = sums(head, spec, features)
    return a, f, den, spec.info.feature_dim(q.shape[1], None if w is None else w.shape[0])


def _denominators(x: AttentionInputs, spec: Spec, b: int, h: int):
    """(start, stop, D, sum_j |phi(q_i)|.|phi(k_j)|) by rows of head (b, h), unscaled, from
    float64 sums (certified.streamed_sums)."""
    _b, _h, nq, nk, _d, _dv = x.shape
    q, k, w, name = x.q[b, h], x.k[b, h], x.projection, spec.feature_map
    big_m = max(nq, nk)

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        phi = float_features(q[start:stop], np.arange(start, stop), big_m, w, name).phi
        return [phi, np.abs(phi)]

    def rights(start: int, stop: int):
        phi = float_features(k[start:stop], np.arange(start, stop), big_m, w, name).phi
        ones = np.ones((stop - start, 1))
        return [(phi, ones), (np.abs(phi), ones)]

    for start, stop, (d, a) in streamed_sums(lefts, rights, nq, nk, spec.causal):
        yield start, stop, d, a


def denominator_condition(x: AttentionInputs, spec: Spec, denominators=_denominators):
    """kappa_i = c sum_j w_ij |phi(q_i)|.|phi(k_j)| / |eps + c D_i| (B, H, Nq, 1), the factor
    by which rounding in the denominator's terms is amplified, from float64 sums (a
    condition number: estimated, not bounded); None where they cannot cancel (non-negative
    features) or there is no denominator. denominators: _denominators, or a decay's
    (families/decayed/bound.py), (start, stop, D, its |terms|) by rows of head (b, h)."""
    b_, h_, nq, _, d, _ = x.shape
    if spec.info.nonnegative_features or not spec.normalize:
        return None
    kappa = np.ones((b_, h_, nq, 1))
    eps = spec.eps / spec.scale_for(d)  # kappa = sum |a| / |eps / c + D|
    for b in range(b_):
        for h in range(h_):
            for start, stop, den, a in denominators(x, spec, b, h):
                with np.errstate(divide="ignore", invalid="ignore"):
                    kappa[b, h, start:stop] = a / np.abs(den + eps)
    return kappa


@dataclass(frozen=True)
class DecayWeights:
    """A decay's weights for the state bounds (families/decayed/bound.py), in float64 within
    SAFETY: errors(head, spec, u) eta_i, the relative error of any sane evaluation of w_ij;
    last(head, spec) w_(N-1, j); from_start(head, spec) W_i, from before the first token;
    causal(head, spec) w_ij, 0 above the diagonal (N, N, 1 or F)."""

    errors: Callable[[Head, Spec, float], np.ndarray]
    last: Callable[[Head, Spec], np.ndarray]
    from_start: Callable[[Head, Spec], np.ndarray]
    causal: Callable[[Head, Spec], np.ndarray]


def state_bound(
    x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0, decay: DecayWeights | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on |S_hat - S| (B, H, F, dv) and |z_hat - z| (B, H, F) for any evaluation in
    precision u of the state after every key, S = sum_j w_j phi(k_j) v_j^T and z = sum_j
    w_j phi(k_j) (reference/state.py; w_j the decay from key j to the last, 1 without
    one, each within eta_(N-1) of its value: DecayWeights), stored in precision u; tiny:
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
    infinite where gamma is (n u >= 1)."""
    b_, h_, nk, _, _, dv = x.shape
    name, g = spec.feature_map, gamma((C_LIB + 2) * nk + 1, u)
    out_s, out_z = [], []
    for b in range(b_):
        for h in range(h_):
            head = Head.of(x, b, h)
            stab = _stabiliser(head.k, head.k, head.w, name)
            _, a, psi = _features(head.k, np.arange(nk), head.big_m, head.w, name, u, stab)
            if decay is not None:  # each term times w_(N-1, j) <= 1, with its error
                last = decay.last(head, spec) * SAFETY
                eta = decay.errors(head, spec, u)[-1]
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
