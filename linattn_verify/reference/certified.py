"""The certified engine: attention in float64 at matmul speed, each element with a rigorous
bound on its error, for the long sequences the ball engines do not reach.

Features are evaluated in float64 with a bound on each one's evaluation error; the sums
sum_j (phi(q_i).phi(k_j)) x_j run as chunked matmuls (the causal state carried between
chunks), whose rounding error is bounded a posteriori by the same sums over |terms|:
any evaluation order of n terms errs by at most gamma_n sum |terms| (Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5), n the summation depth
m + CHUNK + ceil(N / CHUNK) + 2 here. The quotient's error follows Higham's eq. 3.2 style
perturbation as in accuracy/bound.py: |d out| <= (|dN| + |out| |dD|) / (|eps + D| - |dD|).

Assumption, tested against arb (tests/test_certified.py): numpy's exp, sin, cos and a
float's power are within LIB_ULPS ulps. Every bound computed in float64 is multiplied by
SAFETY, which covers the rounding of the bound's own arithmetic (relative n u < 2^-29 for
n < 2^24), and carries an absolute term for gradual underflow.

An element is certified when its bound is below CERTIFIED_SHARE of its scale s (s as in
accuracy/bound.py: sum_j |a_ij| |v_jc| / |eps + D_i|, |phi| products for signed features);
rows with an element that is not are recomputed by the arb engine. The result is then
within CERTIFIED_SHARE s of the exact value: enough to judge float32, bfloat16 and float16,
not float64 (judge float64 against `exact`, which rounds correctly). A caller that judges
some rows by less (the long-context check: rows whose bound is vacuous, left out of the
budget) names the rows to settle, and the others keep their float64 values and bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from ..specs import RSQRT_D, Spec

U64 = 2.0**-53
LIB_ULPS = 2  # numpy's exp, sin, cos, ** within 2 ulps = 4 u
LIB = 2 * LIB_ULPS * U64
SAFETY = 1 + 2.0**-20
UNDERFLOW = 2.0**-1070  # 16 subnormal units: the absolute error one underflowing step adds
SUBNORMAL = 2.0**-1074  # one subnormal unit: a rounding below 2^-1022 errs by half of it
# Below this, a product of three factors (feature, feature, value) may underflow; at or
# above it (every nonzero factor), none does, and a sum that is 0 is exactly 0.
SMALL = 2.0**-300
CERTIFIED_SHARE = 2.0**-34  # 1/1000 of float32's unit roundoff
CHUNK = 128  # rows per chunk of the causal form
GROUP = 64  # chunks per batched matmul (bounds memory at 3 GROUP CHUNK^2 doubles)


def gamma64(n: int) -> float:
    """gamma_n = n u / (1 - n u) in float64 (Higham eq. 3.5), inflated by SAFETY."""
    return n * U64 / (1 - n * U64) * SAFETY


@dataclass(frozen=True)
class Features:
    """phi(x) of the rows of x in float64 and a bound on each element's absolute error."""

    phi: np.ndarray
    err: np.ndarray


def _angles(positions: np.ndarray, big_m: int) -> tuple[np.ndarray, ...]:
    """(cos, sin, their error bounds) of pi i / 2M; cos is sin(pi (M - i) / 2M) past M/2,
    so that each value is a small-argument evaluation: a rounded angle of rel. error 3 u."""
    i = positions.astype(np.float64)
    theta = np.pi * i / (2 * big_m)
    low = positions <= big_m // 2
    theta_c = np.where(low, theta, np.pi * (big_m - i) / (2 * big_m))
    cos = np.where(low, np.cos(theta), np.sin(theta_c))
    sin = np.sin(theta)
    err_c = 3 * U64 * theta_c + LIB * np.abs(cos)
    err_s = 3 * U64 * theta + LIB * np.abs(sin)
    return cos, sin, err_c * SAFETY, err_s * SAFETY


def performer_arguments(x: np.ndarray, w: np.ndarray):
    """(W x', |x'|^2 / 2 and their absolute error bounds), x' = x d^(-1/4)."""
    d = x.shape[1]
    scaled = x * d**-0.25  # relative error LIB + u per element
    rel_x = LIB + U64
    proj = scaled @ w.T
    abs_proj = np.abs(scaled) @ np.abs(w).T
    err_proj = (gamma64(d + 1) + rel_x) * (1 + rel_x) * abs_proj * SAFETY
    half_sq = np.sum(scaled * scaled, axis=1, keepdims=True) / 2
    err_half = (gamma64(d + 1) + 2 * rel_x) * (1 + rel_x) ** 2 * half_sq * SAFETY
    return proj, err_proj, half_sq, err_half


def _underflow(phi: np.ndarray, possible) -> np.ndarray:
    """UNDERFLOW where the computed feature is below SMALL and its exact value need not
    be what was computed (`possible`): exact zeros stay errorless."""
    return np.where(possible & (np.abs(phi) < SMALL), UNDERFLOW, 0.0)


def _exp_features(arg: np.ndarray, err_arg: np.ndarray, factor: float) -> Features:
    """exp(arg) factor, factor = 1/sqrt(m) (relative error 2u): a relative error of
    expm1(|d arg| + u |arg|) plus the exponential's own and the factor's."""
    with np.errstate(over="ignore"):  # an infinite feature has an infinite bound
        phi = np.exp(arg) * factor
        rel = np.expm1(err_arg + U64 * np.abs(arg)) * (1 + U64) + LIB + 3 * U64
    return Features(phi, (rel * phi + _underflow(phi, True)) * SAFETY)


def float_features(
    x: np.ndarray, positions: np.ndarray, big_m: int, w: np.ndarray | None, name: str
) -> Features:
    """phi(x_i) for the rows of x (n, d) at `positions` (formulas: specs.FEATURE_MAPS)."""
    if name == "elu":  # x + 1 (one rounding) above 0, exp(x) below
        phi = np.where(x > 0, x + 1, np.exp(np.minimum(x, 0.0)))
        err = np.where(x > 0, U64 * phi, LIB * phi + _underflow(phi, True))
        return Features(phi, err * SAFETY)
    if name == "relu":
        return Features(np.maximum(x, 0.0), np.zeros_like(x))
    if name == "identity":
        return Features(np.array(x, copy=True), np.zeros_like(x))
    if name == "cosformer":  # relu(x_i) [cos(pi i / 2M), sin(pi i / 2M)]
        cos, sin, err_c, err_s = (t[:, None] for t in _angles(positions, big_m))
        r = np.maximum(x, 0.0)
        phi = np.concatenate([r * cos, r * sin], axis=1)
        err = np.concatenate([r * err_c, r * err_s], axis=1) * (1 + U64) + U64 * np.abs(phi)
        err += _underflow(phi, np.concatenate([r, r], axis=1) > 0)
        return Features(phi, err * SAFETY)
    if name == "taylor":  # [1, x', vec(x' x'^T) / sqrt(2)], x' = x d^(-1/4)
        n, d = x.shape
        scaled = x * d**-0.25
        quad = (scaled[:, :, None] * scaled[:, None, :]).reshape(n, d * d) * np.sqrt(0.5)
        phi = np.concatenate([np.ones((n, 1)), scaled, quad], axis=1)
        rel = np.concatenate(
            [np.zeros((n, 1)), np.full((n, d), LIB + U64), np.full((n, d * d), 2 * LIB + 5 * U64)],
            axis=1,
        )
        return Features(phi, (rel * np.abs(phi) + _underflow(phi, rel > 0)) * SAFETY)
    m = w.shape[0]
    proj, err_proj, half_sq, err_half = performer_arguments(x, w)
    err_arg = err_proj + err_half
    if name == "performer-positive":  # exp(W x' - |x'|^2/2) / sqrt(m)
        return _exp_features(proj - half_sq, err_arg, 1 / math.sqrt(m))
    if name == "performer-hyperbolic":  # exp(-|x'|^2/2) / sqrt(2m) [exp(W x'), exp(-W x')]
        plus = _exp_features(proj - half_sq, err_arg, 1 / math.sqrt(2 * m))
        minus = _exp_features(-proj - half_sq, err_arg, 1 / math.sqrt(2 * m))
        return Features(
            np.concatenate([plus.phi, minus.phi], 1), np.concatenate([plus.err, minus.err], 1)
        )
    # performer-trig: exp(|x'|^2/2) / sqrt(m) [sin(W x'), cos(W x')]
    scale = _exp_features(half_sq, err_half, 1 / math.sqrt(m))
    trig = np.concatenate([np.sin(proj), np.cos(proj)], 1)
    err_trig = np.concatenate([err_proj, err_proj], 1) + LIB * np.abs(trig)
    with np.errstate(over="ignore", invalid="ignore"):  # inf scale: NaN bounds, never certified
        rel_scale = scale.err / scale.phi
        phi = scale.phi * trig
        err = scale.phi * err_trig * (1 + rel_scale) + rel_scale * np.abs(phi) + U64 * np.abs(phi)
    return Features(phi, (err + _underflow(phi, True)) * SAFETY)


def depth(m: int, n_keys: int) -> int:
    """The summation depth of `kernel_sums`, the roundings a term meets: the product with
    x (1), CHUNK keys in a chunk, the chunks' partial sums, the product with fq (1), m
    features, and the state's part added to the chunk's own (1)."""
    return m + CHUNK + -(-n_keys // CHUNK) + 3


STEP = CHUNK * GROUP  # rows per step of the streamed sums

# A chain: left (query-side) features and, per key, right features and columns x_j.
Lefts = Callable[[int, int], list[np.ndarray]]
Rights = Callable[[int, int], list[tuple[np.ndarray, np.ndarray]]]


def streamed_sums(
    lefts: Lefts, rights: Rights, n_q: int, n_k: int, causal: bool
) -> Iterator[tuple[int, int, list[np.ndarray]]]:
    """(start, stop, [sum_j (l_i . r_j) x_j for each chain]) for the query rows
    start:stop, STEP at a time, in float64; lefts(start, stop) and rights(start, stop) give
    the chains' features of those rows, so no whole-sequence intermediate is kept.

    Non-causal: each chain's state sum_j r_j x_j^T as the sum of CHUNK-row partial
    products, then the queries times it. Causal (queries and keys share positions): per
    chunk, the queries times the state of the chunks before, plus the masked product inside.
    """
    # an infinite feature makes NaN sums, whose bounds are NaN: never certified
    with threadpool_limits(1, user_api="blas"), np.errstate(over="ignore", invalid="ignore"):
        yield from _streamed(lefts, rights, n_q, n_k, causal)


def _streamed(lefts: Lefts, rights: Rights, n_q: int, n_k: int, causal: bool):
    """streamed_sums on one BLAS thread: OpenBLAS's threads, woken for every small matmul,
    stall when another process holds the other core (the limit holds until it is exhausted)."""
    if not causal:
        states = None
        for start in range(0, n_k, STEP):
            parts = [
                np.matmul(_chunks(r).transpose(0, 2, 1), _chunks(x)).sum(axis=0)
                for r, x in rights(start, min(start + STEP, n_k))
            ]
            states = parts if states is None else [a + b for a, b in zip(states, parts)]
        for start in range(0, n_q, STEP):
            stop = min(start + STEP, n_q)
            yield start, stop, [left @ st for left, st in zip(lefts(start, stop), states)]
        return
    mask = np.tril(np.ones((CHUNK, CHUNK)))
    states = None
    for start in range(0, n_q, STEP):
        stop = min(start + STEP, n_q)
        sums, new_states = [], []
        for i, (left, (right, x)) in enumerate(zip(lefts(start, stop), rights(start, stop))):
            lc, rc, xc = _chunks(left), _chunks(right), _chunks(x)
            partial = np.matmul(rc.transpose(0, 2, 1), xc)  # (chunks, features, columns)
            before = np.cumsum(partial, axis=0)  # the state before each chunk: exclusive
            before = np.concatenate([np.zeros_like(partial[:1]), before[:-1]])
            if states is not None:
                before += states[i]
            inner = np.matmul(lc, rc.transpose(0, 2, 1)) * mask
            block = np.matmul(lc, before) + np.matmul(inner, xc)
            sums.append(block.reshape(-1, x.shape[1])[: stop - start])
            new_states.append(before[-1] + partial[-1])
        states = new_states
        yield start, stop, sums


def kernel_sums(fq: np.ndarray, fk: np.ndarray, x: np.ndarray, causal: bool) -> np.ndarray:
    """sum_j (fq_i . fk_j) x_j over allowed j, (n_q, columns): one chain of streamed_sums."""
    blocks = streamed_sums(
        lambda a, b: [fq[a:b]], lambda a, b: [(fk[a:b], x[a:b])], fq.shape[0], fk.shape[0], causal
    )
    return np.concatenate([sums[0] for _, _, sums in blocks])


def _chunks(a: np.ndarray) -> np.ndarray:
    """Rows of a as (chunks, CHUNK, columns), the last chunk padded with zero rows."""
    n = a.shape[0]
    pad = -n % CHUNK
    if pad:
        a = np.concatenate([a, np.zeros((pad, a.shape[1]))])
    return a.reshape(-1, CHUNK, a.shape[1])


@dataclass
class Certified:
    """The engine's output (B, H, Nq, dv): values, a bound on each one's absolute error,
    the scale s of each element, and how many rows the arb engine settled instead."""

    values: np.ndarray
    bound: np.ndarray
    scale: np.ndarray
    recomputed: int = 0


RELATIVE = ("elu", "relu", "identity", "performer-positive", "performer-hyperbolic", "taylor")


def _finish(value, total, magnitude, eps, eps_rel: float, spec: Spec, d: int):
    """(out, bound, scale) from the unscaled sums `value` [N, D] (the spec's out: c N /
    (eps + c D) = N / (eps / c + D), or c N unnormalised), `total`, a bound on their errors,
    and `magnitude`, on sum_j |a_ij| [|v_j|, 1]; eps within eps_rel of its value (an array
    per row for softmax's shifted eps). c = spec.scale_for(d) is within LIB of 1/sqrt(d) for
    RSQRT_D and exact otherwise. The quotient: |d out| <= (|dN| + |out| |dD|) / (|eps / c +
    D| - |dD|) (1 + u) + u |out| (Higham eq. 3.2 style, as accuracy/bound.py); c N: |c^ N^ -
    c N| <= |c^ - c| |N^| + c |dN|, one rounding more. Per-row factors first: few passes."""
    dv = total.shape[1] - 1
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if not spec.normalize:
            out = c * value[:, :dv]
            bound = c / (1 - c_rel) * (total[:, :dv] + c_rel * np.abs(value[:, :dv]))
            bound = bound * ((1 + U64) * SAFETY) + _rounding(out, bound)
            scale = c * magnitude[:, :dv]
            bound[~np.isfinite(bound) | ~np.isfinite(out)] = np.inf
            return out, bound, scale
        eps_c = eps / c if c != 1.0 else eps
        eps_rel = (1 + eps_rel) * (1 + U64) / (1 - c_rel) - 1 if c != 1.0 else eps_rel
        den = value[:, dv] + np.ravel(eps_c)
        err_den = total[:, dv] + np.ravel(np.abs(eps_c)) * eps_rel * SAFETY + U64 * np.abs(den)
        slack = np.abs(den) - err_den
        zero = (den == 0) & (err_den == 0)  # every weight exactly 0: 0/0
        out = value[:, :dv] / den[:, None]
        a_out = np.abs(out) * (1 + U64)
        per_row = np.where(slack > 0, (1 + U64) * SAFETY / slack, np.inf)[:, None]
        bound = (total[:, :dv] + a_out * err_den[:, None]) * per_row
        bound += _rounding(out, bound)
        scale = magnitude[:, :dv] * (1 / np.abs(den))[:, None]
    out[zero], bound[zero], scale[zero] = np.nan, 0.0, 0.0
    unresolved = ~np.isfinite(bound) | ~np.isfinite(out)
    bound[unresolved & ~zero[:, None]] = np.inf
    return out, bound, scale


def _rounding(out: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """The last operation's rounding: u |out|, or a subnormal unit where the result is
    below 2^-1022 and may be inexact (its error bound or its value nonzero)."""
    with np.errstate(invalid="ignore"):
        subnormal = (np.abs(out) < 2.0**-1022) & ((bound > 0) | (out != 0))
    return np.where(subnormal, SUBNORMAL, U64 * np.abs(out) * SAFETY)
