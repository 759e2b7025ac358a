"""The a-priori floating-point error bound, and the scale errors are measured against.

Standard model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2.2
and 3.1): fl(a op b) = (a op b)(1 + delta), |delta| <= u, no underflow or overflow; a sum
or dot product of n terms in any order has error <= gamma_n sum |terms|, gamma_n =
n u / (1 - n u) (Lemma 3.1 and eq. 3.5); elementary functions return within C_LIB units.

For attention out_i = N_i / (eps + D_i), N_i = sum_j a_ij v_j, D_i = sum_j a_ij:
- each weight a_ij = phi(q_i).phi(k_j) is computed from features with absolute errors
  psi(q_i), psi(k_j) (per feature map below) and summed over m features; then N and D sum
  over Nk keys and eps is added: in any order (quadratic, linear, chunked), with
  gamma = gamma_{m + Nk + 1}, |dN_ic| <= (1 + gamma) F_ic + gamma A_ic and
  |dD_i| <= (1 + gamma) F_i + gamma A_i, where A sums |phi(q)|.|phi(k)| |v| (resp. 1)
  and F sums (psi(q).|phi(k)| + |phi(q)|.psi(k) + psi(q).psi(k)) |v| (resp. 1);
- softmax is a single exponential (m = 1): a_ij = exp(s_ij), s = q.k / sqrt(d), with
  |ds| <= gamma_{d + C_LIB + 2} sum_l |q_l k_l| / sqrt(d) + u (|s_ij| + max_j |s_ij|)
  (the last term: a stabilising max subtraction), so |da_ij| <= a_ij (e^{|ds|}(1 +
  gamma_{C_LIB}) - 1);
- the quotient: |d out| <= (|dN| + |out| |dD|) / (|eps + D| - |dD|) (1 + u) + u |out|.
Feature models (FEATURE_MODEL): "standard" admits every sane evaluation of each map, the
textbook ones included: elu(x) + 1 as F.elu(x) + 1 = (exp(x) - 1) + 1, whose error is
absolute (C_LIB u) rather than relative, the usual max stabilisers of the exponential maps,
any summation order. "relative" (vet --strict) holds elu features to relative accuracy in
entirely negative rows too, as a shifted evaluation attains (the golden implementation's).
The bound is reported in units of u * s_ic, s_ic = sum_j |a_ij| |v_jc| / |eps + D_i| (for
the signed performer-trig map: |phi(q)|.|phi(k)| in place of |a|), the magnitude the
computation works at (docs/accuracy.md). The sums are evaluated in arb balls, so that the
bound carries no rounding error of its own, or, for long sequences of kernelised specs, in
float64 with their own rounding bounded (_fast_sums: within about 1e-9 of the balls',
never below); the bound is infinite where n u >= 1.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
from flint import arb, arb_mat
from threadpoolctl import threadpool_limits

from ..families import family_of
from ..inputs import AttentionInputs
from ..reference.balls import (
    Head,
    balls,
    channel_gated,
    decay_weights,
    direct_sims,
    features,
    kernel_sums,
    masked,
    working_precision,
)
from ..reference.certified import (
    LIB,
    SAFETY,
    U64,
    depth,
    float_features,
    gamma64,
    performer_arguments,
    streamed_sums,
)
from ..reference.certified_decay import FEW_ROUNDINGS, decayed_sums, log_decays, one_sided_sums
from ..reference.common import MAX_PREC
from ..rounding import C_LIB, gamma
from ..specs import RSQRT_D, Spec, SpecError

BOUND_PREC = 64  # bits for the bound's own arithmetic: balls keep it rigorous
FAST_BOUND_WORK = 2**16  # query-key pairs per head beyond which the sums run in float64
# Bytes of heads' ball sums kept (_head_sums): the checks meet a head again (batch-head and
# layout permute heads, accuracy meets the search's cases), and so do the zoo's and the
# property suite's kernels of one spec; a small case's sums are a few KiB, a long decayed
# head's megabytes (arb bounds them at any N): the least recent go first past this
KEPT_BYTES = 2**28
# ln of float32's largest value: an unshifted exp(x) below -88 underflows float32, so any
# working elu implementation shifts rows that negative (float64 ones may not: 745 there,
# and their extra error |r| u beyond 88 u is charged to them)
ELU_UNSHIFTED_MAX = 88.0


FEATURE_MODELS = ("standard", "relative")
FEATURE_MODEL: ContextVar[str] = ContextVar("feature_model", default="standard")


@contextmanager
def feature_model(model: str) -> Iterator[None]:
    """Bounds computed inside the block assume `model` (FEATURE_MODELS) for the features."""
    if model not in FEATURE_MODELS:
        raise ValueError(f"feature model {model!r}; known: {', '.join(FEATURE_MODELS)}")
    token = FEATURE_MODEL.set(model)
    try:
        yield
    finally:
        FEATURE_MODEL.reset(token)


def gamma_probabilistic(n: int, u: float, lam: float) -> float:
    """Higham & Mary 2019 ("A new approach to probabilistic rounding error analysis", SISC
    41(5), Thm. 3.1): with rounding errors independent and of mean zero, a product of n
    factors (1 + delta) is within exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1 of 1 with
    probability at least 1 - 2 exp(-lam^2 (1 - u)^2 / 2); `probabilistic_lambda` picks lam."""
    return math.expm1(lam * math.sqrt(n) * u + n * u * u / (1 - u))


def probabilistic_lambda(terms: int, failure: float, u: float) -> float:
    """The lam for which `terms` products (each sum's terms, all elements) all hold but with
    probability `failure` at most (a union bound over Higham & Mary's Thm. 3.1)."""
    return math.sqrt(2 * math.log(2 * terms / failure)) / (1 - u)


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


def _grow(rel, g: float):
    """(1 + rel)(1 + g) - 1: relative errors compose."""
    return (1 + rel) * (1 + g) - 1


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
            rel_e = _grow(np.expm1(g_arg * (hs + stab)), g_lib)
            e = np.exp(hs) / math.sqrt(m) * SAFETY
            dtheta = g_arg * np.concatenate([norms, norms], 1) * scale + C_LIB * u
            return phi * rel_e + e * dtheta * (1 + rel_e)
        dalpha = g_arg * (norms * scale + hs + stab)  # exp(+-W x' - |x'|^2/2) / sqrt(m or 2m)
        if name == "performer-hyperbolic":
            dalpha = np.concatenate([dalpha, dalpha], 1)
        return phi * _grow(np.expm1(dalpha), g_lib)


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


def _abs(rows: list[list[arb]]) -> list[list[arb]]:
    return [[abs(t) for t in r] for r in rows]


def _add(*mats: list[list[arb]]) -> list[list[arb]]:
    return [[sum(ts, arb(0)) for ts in zip(*rows, strict=True)] for rows in zip(*mats, strict=True)]


@dataclass(frozen=True)
class HeadSums:
    """One head's sums over |eps + D|, as float64 upper bounds (ratios stay in range where
    the sums themselves do not, e^-1e6): A (|terms| with |v| columns, then 1), F (the
    features' errors, same columns); where D + eps is exactly zero; m (features per term)."""

    a: np.ndarray
    f: np.ndarray
    zero: np.ndarray
    m: int


def _arb_sums(head: Head, spec: Spec, u: float, final: bool) -> HeadSums | None:
    """HeadSums in ball arithmetic; None if some denominator is not resolved away from 0,
    unless `final` (the last precision: then its lower end is taken as it is)."""
    name, causal = spec.feature_map, spec.causal
    nq, nk = head.q.shape[0], head.k.shape[0]
    x = balls(np.concatenate([np.abs(head.v), np.ones((nk, 1))], 1))
    if name == "softmax":
        rows = list(range(nq))
        sims = masked(direct_sims(head, rows, name), rows, causal)
        d = head.q.shape[1]
        absdot = arb_mat(balls(np.abs(head.q))) * arb_mat(balls(np.abs(head.k))).transpose()
        s = (arb_mat(balls(head.q)) * arb_mat(balls(head.k)).transpose()) * arb(d).rsqrt()
        g_dot, g_lib = gamma(d + C_LIB + 2, u), gamma(C_LIB, u)
        rel = []
        for i, (ar, sr) in enumerate(zip(absdot.tolist(), s.tolist(), strict=True)):
            big = max(abs(t).upper() for t in (sr[: i + 1] if causal else sr))
            ds = [
                g_dot * a * arb(d).rsqrt() + u * (abs(t) + big) for a, t in zip(ar, sr, strict=True)
            ]
            rel.append([_grow(e.exp() - 1, g_lib) for e in ds])
        f = [[a * r for a, r in zip(ar, rr, strict=True)] for ar, rr in zip(sims, rel, strict=True)]
        xm = arb_mat(x)
        a_sums = (arb_mat(sims) * xm).tolist()
        nd, f, m = a_sums, (arb_mat(f) * xm).tolist(), 1
    else:
        big_m = max(nq, nk)
        stab = _stabiliser(head.q, head.k, head.w, name)
        pq, pk = (features(t, range(len(t)), head, name) for t in (head.q, head.k))
        sq, sk = (
            balls(_features(t, np.arange(len(t)), big_m, head.w, name, u, stab)[2])
            for t in (head.q, head.k)
        )
        aq, ak = _abs(pq), _abs(pk)
        ones = balls(np.ones((nk, 1)))
        sums = kernel_sums if spec.decay is None else _decayed_sums(head, spec)
        nd = sums(pq, pk, ones, causal)
        a_sums = sums(aq, ak, x, causal)
        f = _add(sums(sq, ak, x, causal), sums(aq, sk, x, causal), sums(sq, sk, x, causal))
        if spec.decay is not None:  # each weight's own decay error, relative: (A + F) eta
            f = _add(f, _scaled_rows(_add(a_sums, f), _decay_errors(head, spec, u)))
        m = len(pq[0])
    if spec.scale != 1.0:  # an exact factor, rounded once where a kernel applies it
        d = head.q.shape[1]
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        nd, a_sums = ([[c * t for t in r] for r in rows] for rows in (nd, a_sums))
        f = _add([[c * t for t in r] for r in f], [[u * t for t in r] for r in a_sums])
    if not spec.normalize:  # no denominator: the sums themselves, and no error in a quotient
        zero = np.zeros(nq, dtype=bool)
        a, fs = (_ratios(rows, [arb(1)] * nq) for rows in (a_sums, f))
        a[:, -1], fs[:, -1] = 0.0, 0.0
        return HeadSums(a, fs, zero, m)
    dens = [abs(r[-1] + spec.eps) for r in nd]
    zero = np.array([t.is_zero() for t in dens])
    if not final and not all(z or t > 0 for z, t in zip(zero, dens, strict=True)):
        return None
    return HeadSums(_ratios(a_sums, dens), _ratios(f, dens), zero, m)


def _decayed_sums(head: Head, spec: Spec):
    """kernel_sums with the decay: rows sum_j w_ij (fq_i . fk_j) x_j in the quadratic form,
    w_ij exact (balls.decay_weights)."""
    rows = list(range(head.q.shape[0]))
    if spec.decay == "channel-gates":  # (fq . B)(fk / B)^T, masked (balls.channel_gated)

        def gated(fq, fk, x, causal: bool) -> list[list[arb]]:
            up, down = channel_gated(fq, fk, head)
            sims = masked((arb_mat(up) * arb_mat(down).transpose()).tolist(), rows, True)
            return (arb_mat(sims) * arb_mat(x)).tolist()

        return gated
    weights = decay_weights(head, rows, spec.decay)

    def sums(fq, fk, x, causal: bool) -> list[list[arb]]:
        sims = (arb_mat(fq) * arb_mat(fk).transpose()).tolist()
        decayed = [[s * w for s, w in zip(r, wr, strict=True)] for r, wr in zip(sims, weights)]
        return (arb_mat(decayed) * arb_mat(x)).tolist()

    return sums


def _decay_errors(head: Head, spec: Spec, u: float) -> np.ndarray:
    """eta_i: a bound on the relative error of any sane evaluation of the decay w_ij, j <= i,
    in precision u. The exponent ln w_ij = G_i - G_j (G the prefix sums of the log-gates;
    (i - j) ln gamma) comes from sums of at most N terms, directly or as a difference of
    prefix sums from the sequence's start (chunked kernels): error <= gamma_(N+1) (2 L_i),
    L_i = sum_(t<=i) |g_t| (Higham 2002, eq. 3.5), the 1 of (2 L_i + 1) covering a power
    gamma^(i-j) by repeated products; then up to two exponentials and their product (a
    decay split at a chunk boundary), 2 C_LIB + 2 roundings, or, in a recurrence, one
    exponential and one product a token, (C_LIB + 1) N roundings (the state times each
    token's rounded exp(g_t)). In float64, inflated by SAFETY."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        logs = np.arange(1, n + 1) * abs(math.log(float(head.decay)))
    else:  # channel gates: the largest channel's
        logs = np.cumsum(np.abs(head.decay), axis=0).reshape(n, -1).max(axis=1)
    with np.errstate(over="ignore"):
        rounds = gamma((C_LIB + 1) * n + 2 * C_LIB + 2, u)
        rel = _grow(np.expm1(gamma(n + 1, u) * (2 * logs + 1)), rounds)
    return np.where(np.isfinite(rel), rel * SAFETY, np.inf)


def _last_weights(head: Head, spec: Spec) -> np.ndarray:
    """w_(N-1, j) for every key j in float64 (within SAFETY): gamma^(N-1-j) or
    exp(G_(N-1) - G_j), the suffix sums of the log-gates; (N, 1), or (N, d) per channel."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        return np.exp((n - 1 - np.arange(n)) * math.log(float(head.decay)))[:, None]
    gates = head.decay.reshape(n, -1)
    suffix = np.concatenate([np.cumsum(gates[::-1], axis=0)[::-1][1:], gates[:1] * 0])
    return np.exp(suffix)


def _scaled_rows(rows: list[list[arb]], factors: np.ndarray) -> list[list[arb]]:
    """Each row times its factor (an upper bound, as a ball)."""
    return [[t * arb(float(c)) for t in r] for r, c in zip(rows, factors, strict=True)]


def _ratios(rows: list[list[arb]], dens: list[arb]) -> np.ndarray:
    """Upper bounds on row / den, element by element (inf where den may be 0)."""
    return np.array([[_upper(t / den) for t in r] for r, den in zip(rows, dens, strict=True)])


def _upper(t: arb) -> float:
    return float(t.upper()) if t.is_finite() else math.inf


def _fast_sums(head: Head, spec: Spec, u: float) -> HeadSums:
    """HeadSums in float64 for every kernelised spec, the same quantities as _arb_sums' and
    in the same way, only with the sums' own rounding bounded a posteriori: for long
    sequences, where ball arithmetic is too slow. Within about 1e-9 of _arb_sums' (rho and
    the FEW_ROUNDINGS of certified_decay.py, and the features' upper bounds)."""
    q, k, w, name = head.q, head.k, head.w, spec.feature_map
    big_m, stab = max(q.shape[0], k.shape[0]), _stabiliser(q, k, w, name)

    def features(x: np.ndarray, start: int, stop: int):
        """(features, upper bounds on the exact |phi|, psi) of rows start:stop of x."""
        return _features(x[start:stop], np.arange(start, stop), big_m, w, name, u, stab)

    sums = _fast_decayed if spec.decay is not None else _fast_plain
    a, f, den = sums(head, spec, features)
    if spec.decay is not None:  # each weight's own decay error, relative: (A + F) eta
        eta = _decay_errors(head, spec, u)[:, None]
        with np.errstate(invalid="ignore", over="ignore"):  # arb: 0 inf is NaN, then inf
            f = np.where(np.isfinite(eta), (f + (a + f) * eta) * FEW_ROUNDINGS, np.inf)
    m = spec.info.feature_dim(q.shape[1], None if w is None else w.shape[0])
    return _fast_ratios(a, f, den, spec, q.shape[1], u, m)


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


def _fast_decayed(head: Head, spec: Spec, features):
    """_fast_plain's (A, F, den) of a decayed head: A and F upper bounds from
    certified_decay.one_sided_sums (F as psi_q.(|phi(k)| + psi_k) + |phi(q)|.psi_k: chains
    of m features, the decay's channels). The denominator: for non-negative features a
    lower bound on D from the same sums of lower bounds on the features, max(phi^ - err,
    0) (radius 0: eps + c D >= eps + c D_low), within about 1e-12 of D however small the
    weights make it; for signed ones D^ and the bound on |D^ - D| of
    certified_decay.decayed_sums (an interval for the exact D, which cancels)."""
    q, k, v = head.q, head.k, head.v
    n = k.shape[0]
    logs, gamma_e = log_decays(head.decay, spec, n)

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        _, a, psi = features(q, start, stop)
        return [a, psi, a]

    def rights(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        _, a, psi = features(k, start, stop)
        mags = np.concatenate([np.abs(v[start:stop]), np.ones((stop - start, 1))], 1)
        return [(a, mags), ((a + psi) * FEW_ROUNDINGS, mags), (psi, mags)]

    def lows(x: np.ndarray, start: int, stop: int) -> np.ndarray:
        f = features(x, start, stop)[0]  # phi^ - err rounded up by at most u: divided
        return np.maximum(f.phi - f.err, 0.0) / FEW_ROUNDINGS

    with threadpool_limits(1, user_api="blas"):  # small matmuls: as streamed_sums
        blocks = list(one_sided_sums(lefts, rights, logs, gamma_e))
        a, f1, f2 = (np.concatenate([b[2][i] for b in blocks]) for i in range(3))
        f = (f1 + f2) * FEW_ROUNDINGS
        if not spec.normalize:
            return a, f, None
        if spec.info.nonnegative_features:
            low = one_sided_sums(
                lambda start, stop: [lows(q, start, stop)],
                lambda start, stop: [(lows(k, start, stop), np.ones((stop - start, 1)))],
                logs,
                gamma_e,
                upper=False,
            )
            value = np.concatenate([sums[0][:, 0] for _, _, sums in low])
            return a, f, (value, np.zeros_like(value))
        parts = list(decayed_sums(q, k, v[:, :0], head.w, head.decay, spec))
    value, radius = (np.concatenate([p[i][:, -1] for p in parts]) for i in (2, 3))
    return a, f, (value, radius)


def _fast_ratios(a, f, den, spec: Spec, d: int, u: float, m: int) -> HeadSums:
    """HeadSums from the unscaled A, F and den = (D^, r) of _fast_plain or _fast_decayed
    (|eps + c D| >= |eps + c D^| - c r), as _arb_sums' end: a scale c (within LIB of
    1/sqrt(d) for RSQRT_D: certified._finish), A and F times it and u c A added to F;
    unnormalised the sums themselves, the last column 0; normalised over a lower bound on
    |eps + c D|: |eps + c^ D^| less c r, |c - c^| |D^| and the two roundings of eps + c^ D^."""
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    if spec.scale != 1.0:
        with np.errstate(invalid="ignore", over="ignore"):
            a = a * (c * (1 + c_rel) * FEW_ROUNDINGS)
            f = (f * (c * (1 + c_rel)) + u * a) * FEW_ROUNDINGS
    if den is None:
        a[:, -1], f[:, -1] = 0.0, 0.0
        return HeadSums(a, f, np.zeros(a.shape[0], dtype=bool), m)
    value, radius = den
    scaled = c * value
    mid = scaled + spec.eps
    with np.errstate(invalid="ignore", over="ignore"):
        slack = c * ((1 + c_rel) * radius + c_rel * np.abs(value))
        low = np.abs(mid) - (slack + 2 * U64 * (np.abs(scaled) + np.abs(mid))) * SAFETY
    zero = (mid == 0) & (a[:, -1] == 0)  # every term exactly 0, and eps
    resolved = (low > 0)[:, None]  # else inf, as arb's quotient by a ball around 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        over = FEW_ROUNDINGS / low[:, None]
        a, f = (np.where(resolved, t * over, np.inf) for t in (a, f))
    return HeadSums(a, f, zero, m)


def _bound_rows(sums: HeadSums, out, u: float, nk: int, tiny: float, lam: float | None):
    """(scale, bound in units of u s) of one head from its sums (module docstring); out is
    |ref| or None (then s stands in for it). NaN where the denominator is exactly 0."""
    g = gamma(sums.m + nk + 1, u)
    if lam is not None:
        g = min(g, gamma_probabilistic(sums.m + nk + 1, u, lam))
    dv = sums.a.shape[1] - 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = sums.a[:, :dv].copy()  # the sums are kept (_head_sums): never written
        out = s if out is None else out
        err_den = (1 + g) * sums.f[:, -1:] + g * sums.a[:, -1:]
        err_num = (1 + g) * sums.f[:, :dv] + g * sums.a[:, :dv]
        err = (err_num + out * err_den) / (1 - err_den) * (1 + u) + u * out + tiny / 2
        err = np.where(err_den < 1, err * SAFETY, np.inf)
        bound = np.where(err == 0, 0.0, np.where(s > 0, err / (u * s), np.inf))
    s[sums.zero], bound[sums.zero] = np.nan, np.nan
    return s, bound


def scale_and_bound(
    x: AttentionInputs,
    spec: Spec,
    ref: np.ndarray | None,
    u: float,
    tiny: float = 0.0,
    engine: str = "auto",
    lam: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound): the scale s_ic and the a-priori error bound in units of u s_ic.

    ref is the exact output (from the reference engines), or None: then |out| <= s stands
    in for it (|sum_j a_ij v_jc| <= sum_j |a_ij| |v_jc|), a bound no smaller and needing no
    reference. Both arrays are (B, H, Nq, dv).
    tiny is the dtype's smallest subnormal: the output's own rounding may lose half of it
    to underflow (an exact 1e-52 is 0 in float32). Underflow inside the computation is
    outside the standard model and this bound.
    engine: "arb" (the sums in balls), "fast" (in float64 with their rounding bounded, not
    for softmax) or "auto" (fast for kernelised specs past FAST_BOUND_WORK key-query pairs).
    lam: also Higham & Mary's probabilistic bound with that lambda (gamma_probabilistic),
    the smaller of the two; it holds but with the probability its lambda was chosen for.
    """
    if own := family_of(spec).scale_and_bound:  # a family with a model of its own
        return own(x, spec, ref, u, tiny)
    b_, h_, nq, nk, _, dv = x.shape
    if engine == "auto":
        engine = "fast" if spec.info.kernelised and nq * nk > FAST_BOUND_WORK else "arb"
    if engine == "fast" and not spec.info.kernelised:
        raise SpecError(f"the fast bound is for kernelised specs, not {spec}: engine='arb'")
    scale = np.full((b_, h_, nq, dv), np.nan)
    bound = np.full((b_, h_, nq, dv), np.nan)
    for b in range(b_):
        for h in range(h_):
            head = Head.of(x, b, h)
            sums = _head_sums(head, spec, u) if engine == "arb" else _fast_sums(head, spec, u)
            out = None if ref is None else np.abs(ref[b, h])
            scale[b, h], bound[b, h] = _bound_rows(sums, out, u, nk, tiny, lam)
    return scale, bound


_KEPT: OrderedDict[tuple, HeadSums] = OrderedDict()  # _head_sums' least recent first
_kept_bytes = 0  # what _KEPT holds (_nbytes)


def _head_sums(head: Head, spec: Spec, u: float) -> HeadSums:
    """_arb_sums of the head at the lowest precision that resolves its denominators
    (exponents of 1e39 need more than 64 bits), kept (KEPT_BYTES) per the head's content,
    spec, u and the feature model in force (the features' errors depend on it)."""
    key = (_digest(head), spec, u, FEATURE_MODEL.get())
    if (sums := _KEPT.get(key)) is not None:
        _KEPT.move_to_end(key)
        return sums
    prec = BOUND_PREC
    while sums is None:
        with working_precision(prec):
            sums = _arb_sums(head, spec, u, final=prec >= MAX_PREC)
        prec *= 4
    _KEPT[key] = sums
    global _kept_bytes
    _kept_bytes += _nbytes(sums)
    while _kept_bytes > KEPT_BYTES:
        _kept_bytes -= _nbytes(_KEPT.popitem(last=False)[1])
    return sums


def _nbytes(sums: HeadSums) -> int:
    return sums.a.nbytes + sums.f.nbytes + sums.zero.nbytes


def _digest(head: Head) -> bytes:
    """What the head holds: its arrays' shapes and values, and cosFormer's M."""
    arrays = (head.q, head.k, head.v, head.w, head.decay)
    hasher = hashlib.blake2b(
        repr([head.big_m, *(getattr(a, "shape", None) for a in arrays)]).encode()
    )
    for a in arrays:
        if a is not None:
            hasher.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return hasher.digest()


def denominator_condition(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """kappa_i = c sum_j w_ij |phi(q_i)|.|phi(k_j)| / |eps + c D_i| (B, H, Nq, 1), the factor
    by which rounding in the denominator's terms is amplified (1 for non-negative features
    and for softmax, and without a denominator), from float64 sums (a condition number:
    estimated, not bounded); a decay's sums are certified_decay.decayed_sums'."""
    b_, h_, nq, nk, d, _ = x.shape
    kappa = np.ones((b_, h_, nq, 1))
    name = spec.feature_map
    if not spec.info.kernelised or spec.info.nonnegative_features or not spec.normalize:
        return kappa
    eps = spec.eps / spec.scale_for(d)  # kappa = sum |a| / |eps / c + D|
    for b in range(b_):
        for h in range(h_):
            q, k, w = x.q[b, h], x.k[b, h], x.projection
            big_m = max(nq, nk)
            if spec.decay is not None:
                head = Head.of(x, b, h)
                for start, stop, value, _, magnitude in decayed_sums(
                    q, k, x.v[b, h][:, :0], w, head.decay, spec
                ):
                    with np.errstate(divide="ignore", invalid="ignore"):
                        kappa[b, h, start:stop, 0] = magnitude[:, -1] / np.abs(value[:, -1] + eps)
                continue

            def lefts(start: int, stop: int, q=q, w=w, big_m=big_m) -> list[np.ndarray]:
                phi = float_features(q[start:stop], np.arange(start, stop), big_m, w, name).phi
                return [phi, np.abs(phi)]

            def rights(start: int, stop: int, k=k, w=w, big_m=big_m):
                phi = float_features(k[start:stop], np.arange(start, stop), big_m, w, name).phi
                ones = np.ones((stop - start, 1))
                return [(phi, ones), (np.abs(phi), ones)]

            for start, stop, (d, a) in streamed_sums(lefts, rights, nq, nk, spec.causal):
                with np.errstate(divide="ignore", invalid="ignore"):
                    kappa[b, h, start:stop] = a / np.abs(d + eps)
    return kappa


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


def _causal_weight_matrix(head: Head, spec: Spec) -> np.ndarray:
    """w_ij (N, N, 1), or w_ijm (N, N, d) for channel gates, in float64 (within SAFETY), 0
    for j > i: 1, gamma^(i-j) or exp(G_i - G_j)."""
    n = head.q.shape[0]
    gaps = (np.arange(n)[:, None] - np.arange(n)[None, :])[..., None]
    if spec.decay is None:
        return (gaps >= 0).astype(np.float64)
    if spec.decay == "constant":
        logs = gaps * math.log(float(head.decay))
    else:
        prefix = np.cumsum(head.decay.reshape(n, -1), axis=0)
        logs = prefix[:, None, :] - prefix[None, :, :]
    with np.errstate(over="ignore"):
        return np.where(gaps >= 0, np.exp(np.where(gaps >= 0, logs, 0.0)), 0.0)


def _from_start_weights(head: Head, spec: Spec) -> np.ndarray:
    """W_i, the decay from before the first token to token i, in float64 (within SAFETY):
    (N, 1), or (N, d) per channel."""
    n = head.k.shape[0]
    if spec.decay == "constant":
        return np.exp(np.arange(1, n + 1) * math.log(float(head.decay)))[:, None]
    return np.exp(np.cumsum(head.decay.reshape(n, -1), axis=0))
