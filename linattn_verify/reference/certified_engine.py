"""The certified engine's output for every spec of reference/'s families: attention in
float64 with a rigorous bound per element (certified.py's features and sums; decayed specs'
sums from certified_decay.py), and the rows it hands to the arb engine (settle_rows)."""

from __future__ import annotations

import math

import numpy as np

from ..inputs import AttentionInputs
from ..specs import Spec, summing
from .arb import arb_attention
from .certified import (
    CERTIFIED_SHARE,
    LIB,
    RELATIVE,
    SAFETY,
    SMALL,
    SUBNORMAL,
    U64,
    UNDERFLOW,
    Certified,
    Features,
    _finish,
    depth,
    float_features,
    gamma64,
    streamed_sums,
)
from .certified_decay import decayed_sums
from .common import ReferenceAccuracyError


def certified_attention(
    x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None
) -> Certified:
    """Attention within CERTIFIED_SHARE s of the exact value, element by element (module
    docstring), in the rows `settle` marks ((B, H, Nq), every row by default); the others
    keep the float64 pass's values, within `bound` of the exact ones, and go to arb only
    where that bound is infinite (the pass lost the row's denominator). Every spec that sums
    its similarities (Spec.sums_similarities); NaN where the value is 0/0 exactly (relu
    rows with eps = 0). Decayed specs: certified_decay.py."""
    summing(spec, "certified engine and references")
    if np.array([SUBNORMAL]) * 1.0 == 0:  # the bounds assume gradual underflow
        raise ReferenceAccuracyError("flush-to-zero is on (torch.set_flush_denormal(True))")
    b_, h_, nq, _, d, dv = x.shape
    values, bound, scale = (np.empty((b_, h_, nq, dv)) for _ in range(3))
    for b in range(b_):
        for h in range(h_):
            q, k, v = x.q[b, h], x.k[b, h], x.v[b, h]
            if spec.decay is not None:
                decay = x.decay[h] if x.decay.ndim == 1 else x.decay[b, h]
                for start, stop, value, total, magnitude in decayed_sums(
                    q, k, v, x.projection, decay, spec
                ):
                    out = _finish(value, total, magnitude, spec.eps, 0.0, spec, d)
                    values[b, h, start:stop], bound[b, h, start:stop] = out[:2]
                    scale[b, h, start:stop] = out[2]
            else:
                _plain_head(q, k, v, x.projection, spec, (values, bound, scale), (b, h))
    result = Certified(values, bound, scale)
    lost = ~np.isfinite(bound).all(axis=-1)
    settle_rows(x, spec, result, np.ones_like(lost) if settle is None else settle | lost)
    return result


def settle_rows(x: AttentionInputs, spec: Spec, c: Certified, rows: np.ndarray) -> int:
    """Recompute with the arb engine, in place, the rows of c that `rows` marks (B, H, Nq)
    and whose elements are not all within CERTIFIED_SHARE of their
    scale (0 <= 0 where 0/0 exactly; an infinite bound never is): each is then within one
    ulp of the exact value, or half a subnormal unit. Returns how many rows it settled."""
    ok = ((c.bound <= CERTIFIED_SHARE * c.scale) & np.isfinite(c.bound)).all(axis=-1)
    pending = {
        (b, h): found
        for b in range(ok.shape[0])
        for h in range(ok.shape[1])
        if (found := np.flatnonzero(rows[b, h] & ~ok[b, h]).tolist())
    }
    if not pending:
        return 0
    exact = arb_attention(x, spec, pending=pending)
    for (b, h), found in pending.items():
        c.values[b, h, found] = exact[b, h, found]
        c.bound[b, h, found] = np.maximum(np.abs(exact[b, h, found]) * 2 * U64, SUBNORMAL)
    settled = sum(map(len, pending.values()))
    c.recomputed += settled
    return settled


def _plain_head(q, k, v, w, spec: Spec, outs: tuple[np.ndarray, ...], at: tuple[int, int]):
    """One head of a spec without a decay into outs (values, bound, scale) at (b, h)."""
    later = np.append(np.maximum(np.abs(v).max(axis=0, initial=0.0), 1.0), 1.0)
    for relative in (spec.feature_map in RELATIVE, False):
        lost = [False]
        for start, stop, sums in _head_sums(q, k, v, w, spec, relative, lost):
            value, magnitude, errors, n_value, n_errors, eps, eps_rel, small = sums
            g = gamma64(n_value)
            # the computed sums of non-negative terms err by gamma_n: divide by 1 - gamma
            total = magnitude * (g / (1 - g) * SAFETY) + errors * (SAFETY / (1 - gamma64(n_errors)))
            # a product below 2^-1022 may underflow: its error times the factors after it,
            # |v| and (`small`, 0 where no factor is that small) the query features' max
            total += n_value * UNDERFLOW * small * later * SAFETY
            out = _finish(value, total, magnitude / (1 - g), eps, eps_rel, spec, q.shape[1])
            for array, part in zip(outs, out):
                array[(*at, slice(start, stop))] = part
        if not lost[0]:
            return


# Maps whose features' error bounds are relative (err <= r |phi|), so that the features'
# error sums are (2 r + r^2) times the |term| sums and need no matmuls of their own
def _head_sums(q, k, v, w, spec: Spec, relative: bool, lost: list[bool]):
    """Per block of query rows: (start, stop, (value sums [num, den], |term| sums [num,
    den], error sums [num, den], their depths, eps, its relative error, small)) of one head:
    the numerator and denominator, bounds on their error, eps in the sums' units; small is
    the query features' largest |value| (at least 1) once a factor below SMALL was met, else
    0. With `relative`, the error sums come from the largest relative error r met so far;
    lost[0] is set if a feature's error was not relative after all (an underflow): the sums
    are then not certified, and the caller runs the head again without `relative`."""
    name, causal = spec.feature_map, spec.causal
    if name == "softmax":
        yield from _softmax_sums(q, k, v, causal, spec.eps)
        return
    nq, nk, dv = q.shape[0], k.shape[0], v.shape[1]
    big_m = max(nq, nk)
    positive = spec.info.nonnegative_features
    smallest = [math.inf]  # the least nonzero |factor| met so far
    largest_q = [1.0]  # the largest |phi(q)| met so far, at least 1
    worst = [0.0]  # the largest relative error of a feature met so far

    def features(x: np.ndarray, start: int, stop: int) -> Features:
        f = float_features(x[start:stop], np.arange(start, stop), big_m, w, name)
        smallest[0] = min(smallest[0], _least_nonzero(f.phi))
        if relative:
            a = np.abs(f.phi)
            lost[0] |= bool(np.any((a == 0) & (f.err > 0)))
            with np.errstate(divide="ignore", invalid="ignore"):
                worst[0] = max(worst[0], float(np.max(f.err / a, where=a > 0, initial=0.0)))
        return f

    def lefts(start: int, stop: int) -> list[np.ndarray]:
        f = features(q, start, stop)
        a = np.abs(f.phi)
        largest_q[0] = max(largest_q[0], float(a.max(initial=0.0)))
        error = [] if relative else [np.concatenate([f.err, a], 1)]
        return [f.phi] + ([] if positive else [a]) + error

    def rights(start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        f = features(k, start, stop)
        vb = v[start:stop]
        av, ones = np.abs(vb), np.ones((stop - start, 1))
        smallest[0] = min(smallest[0], _least_nonzero(vb))
        a, mags = np.abs(f.phi), np.concatenate([av, ones], 1)
        if positive:  # |terms| from the same sums
            chains = [(f.phi, np.concatenate([vb, av, ones], 1))]
        else:
            chains = [(f.phi, np.concatenate([vb, ones], 1)), (a, mags)]
        return chains if relative else [*chains, (np.concatenate([a + f.err, f.err], 1), mags)]

    m = spec.info.feature_dim(q.shape[1], None if w is None else w.shape[0])
    depths = depth(m, nk), depth(2 * m, nk)
    for start, stop, sums in streamed_sums(lefts, rights, nq, nk, causal):
        if positive:
            value, magnitude = sums[0][:, [*range(dv), 2 * dv]], sums[0][:, dv:]
        else:
            value, magnitude = sums[0], sums[1]
        r = worst[0] * SAFETY
        errors = (2 * r + r * r) * magnitude if relative else sums[-1]
        lost[0] |= relative and smallest[0] < SMALL
        small = largest_q[0] if smallest[0] < SMALL else 0.0
        yield start, stop, (value, magnitude, errors, *depths, spec.eps, 0.0, small)


def _least_nonzero(a: np.ndarray) -> float:
    nonzero = np.abs(a[a != 0])
    return float(nonzero.min()) if nonzero.size else math.inf


def _softmax_sums(q, k, v, causal: bool, eps: float):
    """The quadratic form of softmax, exp(q.k / sqrt(d) - row max), in blocks of rows; the
    max shifts eps too (exp(-max) eps, within LIB + u of its value)."""
    nq, nk, d = q.shape[0], k.shape[0], q.shape[1]
    cols = np.concatenate([v, np.abs(v), np.ones((nk, 1))], 1)
    dv = v.shape[1]
    c = d**-0.5
    for start in range(0, nq, 256):
        rows = np.arange(start, min(start + 256, nq))
        logits = (q[rows] @ k.T) * c
        err = (gamma64(d + 1) + LIB + U64) * (np.abs(q[rows]) @ np.abs(k).T) * c * SAFETY
        if causal:
            logits = np.where(np.arange(nk) <= rows[:, None], logits, -np.inf)
        top = logits.max(axis=1, keepdims=True)
        arg = logits - top
        weights = np.exp(arg)
        rel = np.expm1(err + U64 * np.abs(np.where(weights > 0, arg, 0.0)))
        rel = (rel * (1 + U64) + LIB) * SAFETY
        both = weights @ cols
        errors = (rel * weights + UNDERFLOW) @ cols[:, dv:]
        value, magnitude = both[:, [*range(dv), 2 * dv]], both[:, dv:]
        shifted_eps = eps * np.exp(-top)  # the exponential and the product
        sums = (value, magnitude, errors, nk + 2, nk + 2, shifted_eps, LIB + U64, 1.0)
        yield start, rows[-1] + 1, sums
