"""Kernelised attention's part of the shared exact engines (reference/similarity.py):
sim(q, k) = phi(q) . phi(k) (Katharopoulos et al. 2020, eq. 2-6; cosFormer's and Taylor's
from their formulas, specs.FEATURE_MAPS) times the scale, no weights: mpmath's rows
(mp.scaled_rows), the arb products of the features, the linear form where the features are
fewer than the keys, the certified engine's feature sums, the state's pieces, and the
exact gradients' rows (grad_terms.plain_rows). The
decayed and channel-gated families build on it (families/decayed/, families/channel_gates/).
None imports an implementation.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
from flint import arb, arb_mat

from ...inputs import AttentionInputs
from ...reference.balls import Head, direct_sims, features
from ...reference.certified import SAFETY, SMALL, Features, depth, float_features, streamed_sums
from ...reference.certified_engine import plain_head
from ...reference.grad_terms import plain_rows
from ...reference.mp import scaled_rows
from ...reference.similarity import Gradients, Similarity
from ...specs import Spec


def arb_sims(head: Head, spec: Spec, rows: list[int]) -> list[list[arb]]:
    """sim(q_i, k_j) for the query rows `rows` and every key: phi(Q) phi(K)^T, Taylor's
    straight from s = q.k / sqrt(d) (balls.direct_sims)."""
    name = spec.feature_map
    if name == "taylor":
        return direct_sims(head, rows, name)
    fq = features(head.q[rows], rows, head, name)
    fk = features(head.k, range(head.k.shape[0]), head, name)
    return (arb_mat(fq) * arb_mat(fk).transpose()).tolist()


def prefers_linear(spec: Spec, head: Head) -> bool:
    """The linear form when the spec's features are fewer than the keys."""
    m = None if head.w is None else head.w.shape[0]
    return spec.info.feature_dim(head.q.shape[1], m) < head.k.shape[0]


def certified_head(q, k, v, w, decay, spec: Spec, outs, at) -> None:
    """Similarity.certified: certified_engine.plain_head with the feature maps' sums."""
    plain_head(q, k, v, w, spec, outs, at, feature_sums)


def state_keys(head: Head, spec: Spec, fk: list[list[arb]]) -> list[list[arb]]:
    """Similarity.state_keys: phi(k_j), no weights."""
    return fk


def from_start(head: Head, spec: Spec, f: int) -> list[list[arb]]:
    """Similarity.from_start: 1 for every token and channel."""
    return [[arb(1)] * f] * head.q.shape[0]


def causal_sims(head: Head, spec: Spec, fq, fk) -> tuple[list, list]:
    """Similarity.causal_sims: (phi(q_i) . phi(k_j), 1 for j <= i and 0 beyond)."""
    n = head.q.shape[0]
    weights = [[arb(1) if j <= i else arb(0) for j in range(n)] for i in range(n)]
    return (arb_mat(fq) * arb_mat(fk).transpose()).tolist(), weights


def final_weights(x: AttentionInputs, spec: Spec, b: int, h: int, n: int, f: int):
    """Similarity.final_weights: 1 for every key, feature and token."""
    mp = mpmath.mp
    return [[mp.one] * f] * n, [mp.one] * n, [mp.one] * f


def final_gates(spec: Spec) -> None:
    """Similarity.final_gates: no log-gates."""
    return None


KERNELISED = Similarity(
    mp=scaled_rows,
    arb=arb_sims,
    linear=prefers_linear,
    certified=certified_head,
    state_keys=state_keys,
    from_start=from_start,
    causal_sims=causal_sims,
    final_weights=final_weights,
    final_gates=final_gates,
    gradients=Gradients(rows=plain_rows),
)


def feature_sums(q, k, v, w, spec: Spec, relative: bool, lost: list[bool]):
    """Per block of query rows: (start, stop, (value sums [num, den], |term| sums [num,
    den], error sums [num, den], their depths, eps, its relative error, small)) of one head:
    the numerator and denominator, bounds on their error, eps in the sums' units; small is
    the query features' largest |value| (at least 1) once a factor below SMALL was met, else
    0. With `relative`, the error sums come from the largest relative error r met so far;
    lost[0] is set if a feature's error was not relative after all (an underflow): the sums
    are then not certified, and the caller runs the head again without `relative`."""
    name, causal = spec.feature_map, spec.causal
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
