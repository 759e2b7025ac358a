"""The mpmath engine: the literal quadratic definition, the ground truth for small cases.

For every query i and allowed key j, sim(q_i, k_j) is evaluated from its formula (specs.py) in
binary precision p (see `similarities` for the sources); out_i = sum_j sim v_j / (eps + sum_j sim).
Precision control: each element is computed at p and 2p bits; where the two are more
than one ulp apart, or where a first-order error estimate at 2p (which grows with
the cancellation in the sums) is not below 2^-64 of the value, the row is recomputed at
4p, 8p, ... until both hold, or `max_prec` is passed (ReferenceAccuracyError). Agreement
alone is not enough: 1e300 + 1 - 1e300 gives 0 at 113 and at 226 bits alike. O(N^2 (d + dv)) mpf
operations: use it for N up to about a hundred.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
from mpmath.libmp import to_float

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec
from .common import MAX_PREC, allowed_keys, refine
from .similarity import Similarity

DEFAULT_PREC = 113  # IEEE binary128's significand: the first precision
# Scalar operations on the longest path besides the sums: the d^(1/4) and sqrt(d) scalings,
# exp/sin/cos, 1/sqrt(m), the product with v, adding eps, the division: at most 8.
SCALAR_OPS = 8


def nearest(x: mpmath.mpf) -> float:
    """x rounded to the nearest float64 (mpmath's own float() truncates); shared with grad.py."""
    return to_float(x._mpf_, rnd="n")


def features(x: list, w: list | None, kind: str) -> list:
    """phi(x) for the kernelised maps; the Performer formulas of Choromanski et al. 2021.
    Shared on purpose with grad.py, which differentiates exactly this forward."""
    mp = mpmath.mp
    if kind == "elu":  # elu(x) + 1
        return [t + 1 if t > 0 else mp.exp(t) for t in x]
    if kind == "relu":
        return [t if t > 0 else mp.zero for t in x]
    if kind == "identity":
        return list(x)
    d = len(x)
    xs = [t / mp.root(d, 4) for t in x]  # x' = x d^(-1/4)
    half_sq = mp.fdot(xs, xs) / 2
    proj = [mp.fdot(row, xs) for row in w]
    m = len(w)
    if kind == "performer-positive":
        return [mp.exp(p - half_sq) / mp.sqrt(m) for p in proj]
    if kind == "performer-hyperbolic":
        scale = mp.exp(-half_sq) / mp.sqrt(2 * m)
        return [scale * mp.exp(p) for p in proj] + [scale * mp.exp(-p) for p in proj]
    if kind == "performer-trig":
        scale = mp.exp(half_sq) / mp.sqrt(m)
        return [scale * mp.sin(p) for p in proj] + [scale * mp.cos(p) for p in proj]
    raise AssertionError(kind)


def similarities(
    qi: list, fq: list | None, i: int, keys: list, key_feats: list | None, spec, big_m
):
    """sim(q_i, k_j) for every key j of a kernelised map (see specs.FEATURE_MAPS for each
    formula's source; softmax's is families/softmax/reference.py's).

    fq, key_feats: phi(q_i) and phi(k_j) for the maps defined by features (else None);
    big_m is cosFormer's M.
    """
    mp = mpmath.mp
    name = spec.feature_map
    d = len(qi)
    if name == "taylor":
        s = [mp.fdot(qi, kj) / mp.sqrt(d) for kj in keys]
        return [1 + t + t * t / 2 for t in s]
    if name == "cosformer":
        rq = [t if t > 0 else mp.zero for t in qi]
        return [
            mp.fdot(rq, [t if t > 0 else mp.zero for t in kj])
            * mp.cospi(mp.mpf(i - j) / (2 * big_m))
            for j, kj in enumerate(keys)
        ]
    return [mp.fdot(fq, fk) for fk in key_feats]


def _magnitudes(qi: list, fq: list | None, abs_keys: list, key_feats: list | None, sims, spec):
    """A bound on |sim_j| and on what its evaluation cancels, for the error estimate
    (abs_keys: abs_rows of the keys)."""
    mp = mpmath.mp
    name = spec.feature_map
    if key_feats is not None:  # signed features (trig) cancel inside the dot product
        aq = [abs(t) for t in fq]
        return [mp.fdot(aq, [abs(t) for t in fk]) for fk in key_feats]
    if name == "taylor":
        return [1 + t + t * t / 2 for t in abs_logits(qi, abs_keys)]
    return [abs(a) for a in sims]  # cosformer: a non-negative product


def abs_rows(rows: list) -> list:
    """|x| of every element of a list of mpf rows (a head's keys: once, not once a query)."""
    return [[abs(t) for t in row] for row in rows]


def abs_logits(qi: list, abs_keys: list) -> list:
    """|q_i| . |k_j| / sqrt(d) for every key j (abs_keys: abs_rows of the keys), a bound on
    |s_ij| and on what its evaluation cancels (s_ij = q_i . k_j / sqrt(d), the logit)."""
    mp = mpmath.mp
    aq, sqrt_d = [abs(t) for t in qi], mp.sqrt(len(qi))
    return [mp.fdot(aq, akj) / sqrt_d for akj in abs_keys]


def decay_weights(decay, i: int, kind: str) -> tuple[list, list]:
    """(w_ij, a bound on |ln w_ij| plus 1 for the error estimate) for every key j <= i:
    gamma^(i - j) or exp(G_i - G_j), G_i = g_0 + ... + g_i (families/*/fields.py); decay is
    gamma (a float) or the head's log-gates (channel gates: channel_prefix)."""
    mp = mpmath.mp
    if kind == "constant":
        gamma = mp.mpf(decay)
        log_gamma = abs(mp.log(gamma))
        logs = [(i - j) * log_gamma + 1 for j in range(i + 1)]
        return [gamma ** (i - j) for j in range(i + 1)], logs
    gates = [mp.mpf(t) for t in decay[: i + 1]]
    prefix = [mp.zero]
    for g in gates:
        prefix.append(prefix[-1] + g)  # prefix[j + 1] = G_j
    spread = 2 * mp.fsum(abs(g) for g in gates) + 1
    return [mp.exp(prefix[i + 1] - prefix[j + 1]) for j in range(i + 1)], [spread] * (i + 1)


def channel_prefix(gates) -> tuple[list[list], object]:
    """(G_t, t = 0 .. N-1, each the d channels' g_0m + ... + g_tm, and 2 max_m sum_t |g_tm|
    + 1, a bound on |ln w_ijm| plus 1 for the error estimate) of one head's channel gates
    (N, d) (families/*/fields.py); shared with grad.py."""
    mp = mpmath.mp
    prefix, running = [], [mp.zero] * len(gates[0])
    for row in gates:
        running = [a + mp.mpf(t) for a, t in zip(running, row, strict=True)]
        prefix.append(running)
    spread = 2 * max(mp.fsum(abs(mp.mpf(t)) for t in col) for col in zip(*gates)) + 1
    return prefix, spread


def channel_factors(prefix: list) -> tuple[list, list]:
    """(exp(G_tm), exp(-G_tm)) of channel_prefix's prefix sums at the working precision:
    W_ijm = exp(G_im) exp(-G_jm), 2 N d exponentials for the N^2 d / 2 weights (an mpf's
    exponent has no range to leave), each weight within two roundings of its value."""
    mp = mpmath.mp
    return [[mp.exp(t) for t in row] for row in prefix], [
        [mp.exp(-t) for t in row] for row in prefix
    ]


def sim_rows(x: AttentionInputs, spec: Spec, keys: list, w: list | None):
    """row(i, qi) -> (sim(q_i, k_j), _magnitudes' bound) for every key j of a head, from
    the map's formula (`similarities`) at the working precision, before any scale or
    weight; keys and w: the head's keys and the projection as mpf rows."""
    key_feats = key_features(spec, keys, w)
    big_m = max(x.q.shape[2], len(keys))
    abs_keys = abs_rows(keys)

    def row(i: int, qi: list) -> tuple[list, list]:
        fq = None if key_feats is None else features(qi, w, spec.feature_map)
        sims = similarities(qi, fq, i, keys, key_feats, spec, big_m)
        return sims, _magnitudes(qi, fq, abs_keys, key_feats, sims, spec)

    return row


def key_features(spec: Spec, keys: list, w: list | None) -> list | None:
    """phi(k_j) of every key for the maps that `similarities` takes as features (else
    None)."""
    if spec.feature_map in ("elu", "relu", "identity") or spec.info.needs_projection:
        return [features(kj, w, spec.feature_map) for kj in keys]
    return None


def scaled_rows(x: AttentionInputs, spec: Spec, b: int, h: int, keys: list, w: list | None):
    """Similarity.mp without weights: sim_rows times the scale c (kernelised)."""
    return scaled(sim_rows(x, spec, keys, w))


def scaled(plain):
    """row(i, qi, c) from plain(i, qi) -> (sims, magnitudes): both times the scale c (a
    Similarity.mp without weights: scaled_rows, softmax's)."""

    def row(i: int, qi: list, c) -> tuple[list, list]:
        sims, mags = plain(i, qi)
        if c != 1:
            sims, mags = [s * c for s in sims], [a * c for a in mags]
        return sims, mags

    return row


def _head_rows(
    x: AttentionInputs, spec: Spec, b: int, h: int, rows, prec: int, similarity: Similarity
):
    """Rows `rows` of head (b, h) at `prec` bits: (output, error estimate), both float64.

    The estimate is n 2^-prec (sum_j |a_j| |v_j| + |out| sum_j |a_j|) / |den| with n the
    number of roundings on any path to an output (Higham's gamma_n to first order: the sum
    over Nk keys, a dot product over d for an exponent and another for |x'|^2, one over the
    features, and SCALAR_OPS scalar operations) and |a_j| the magnitudes of the family's
    rows (similarity.mp: `_magnitudes` times the decay and 1 + |ln w|, whose prefix sums
    err in proportion); it grows with the cancellation in the sums. Unnormalised: the
    numerator and its estimate alone.
    """
    out = np.empty((len(rows), x.v.shape[3]))
    err = np.empty_like(out)
    with mpmath.workprec(prec):
        mp = mpmath.mp
        keys = [[mp.mpf(t) for t in row] for row in x.k[b, h].tolist()]
        vals = [[mp.mpf(t) for t in row] for row in x.v[b, h].tolist()]
        w = None if x.projection is None else [[mp.mpf(t) for t in r] for r in x.projection]
        row_sims = similarity.mp(x, spec, b, h, keys, w)
        n_features = 2 * len(w) if w else 2 * x.q.shape[3] + 1
        n_roundings = len(keys) + 2 * x.q.shape[3] + n_features + SCALAR_OPS
        rounding = mp.mpf(2) ** -prec * n_roundings
        for r, i in enumerate(rows):
            qi = [mp.mpf(t) for t in x.q[b, h, i].tolist()]
            c = 1 / mp.sqrt(x.q.shape[3]) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
            sims, mags = row_sims(i, qi, c)
            js = allowed_keys(i, len(keys), spec.causal)
            den = mp.fsum(sims[j] for j in js) + spec.eps
            den_err = rounding * mp.fsum(mags[j] for j in js)
            for col in range(out.shape[1]):
                num = mp.fsum(sims[j] * vals[j][col] for j in js)
                num_err = rounding * mp.fsum(mags[j] * abs(vals[j][col]) for j in js)
                if not spec.normalize:
                    out[r, col], err[r, col] = nearest(num), nearest(num_err)
                elif den == 0:
                    out[r, col], err[r, col] = math.nan, 0.0
                else:
                    out[r, col] = nearest(num / den)
                    err[r, col] = nearest((num_err + abs(num / den) * den_err) / abs(den))
    return out, err


def _settled(low: np.ndarray, high: np.ndarray, high_err: np.ndarray) -> np.ndarray:
    """Rows whose elements at p and 2p are within one ulp of each other (an exact value on
    a rounding boundary may round either way at any precision) and whose error estimate
    at 2p is below 2^-64 of the value (faithful rounding) or half the smallest subnormal."""
    with np.errstate(invalid="ignore"):
        close = np.abs(low - high) <= np.spacing(np.abs(high))
    same = (low == high) | close | (np.isnan(low) & np.isnan(high))
    small = np.isnan(high) | (high_err <= np.fmax(np.abs(high) * 2.0**-64, 2.0**-1076))
    return np.all(same & small, axis=1)


def mp_attention(
    x: AttentionInputs,
    spec: Spec,
    similarity: Similarity,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
) -> np.ndarray:
    """Exact attention (B, H, Nq, dv) in float64 by the literal definition in mpmath, the
    similarities by the family's `similarity` (similarity.py)."""
    previous: dict[tuple[int, int, int], np.ndarray] = {}  # (b, h, row) -> value at p

    def settle(b: int, h: int, rows: list[int], p: int) -> tuple[np.ndarray, np.ndarray]:
        if p == prec:
            low, _ = _head_rows(x, spec, b, h, rows, p, similarity)
        else:
            low = np.array([previous[b, h, i] for i in rows])
        high, high_err = _head_rows(x, spec, b, h, rows, 2 * p, similarity)
        previous.update(((b, h, i), row) for i, row in zip(rows, high))
        return high, _settled(low, high, high_err)

    return refine(x, settle, prec, max_prec // 2, "mpmath")
