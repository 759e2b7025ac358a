"""The certified engine's output for every spec that sums its similarities: attention in
float64 with a rigorous bound per element, each head by its family's hook
(Similarity.certified: the feature maps' sums of families/kernelised/reference.py and
softmax's of families/softmax/reference.py through plain_head; the decays' from
certified_decay.py), and the rows it hands to the arb engine (settle_rows)."""

from __future__ import annotations

import numpy as np

from ..inputs import AttentionInputs
from ..specs import Spec, summing
from .arb import arb_attention
from .certified import (
    CERTIFIED_SHARE,
    RELATIVE,
    SAFETY,
    SUBNORMAL,
    U64,
    UNDERFLOW,
    Certified,
    _finish,
    gamma64,
)
from .common import ReferenceAccuracyError, head_decay
from .similarity import Similarity


def certified_attention(
    x: AttentionInputs, spec: Spec, similarity: Similarity, settle: np.ndarray | None = None
) -> Certified:
    """Attention within CERTIFIED_SHARE s of the exact value, element by element (module
    docstring), in the rows `settle` marks ((B, H, Nq), every row by default); the others
    keep the float64 pass's values, within `bound` of the exact ones, and go to arb only
    where that bound is infinite (the pass lost the row's denominator). Every spec that sums
    its similarities (Spec.sums_similarities); NaN where the value is 0/0 exactly (relu
    rows with eps = 0). Each head by the family's `similarity`, settled by the arb engine
    with it."""
    summing(spec, "certified engine and references")
    if np.array([SUBNORMAL]) * 1.0 == 0:  # the bounds assume gradual underflow
        raise ReferenceAccuracyError("flush-to-zero is on (torch.set_flush_denormal(True))")
    b_, h_, nq, _, _, dv = x.shape
    values, bound, scale = (np.empty((b_, h_, nq, dv)) for _ in range(3))
    for b in range(b_):
        for h in range(h_):
            q, k, v = x.q[b, h], x.k[b, h], x.v[b, h]
            decay = head_decay(x, b, h)
            outs = (values, bound, scale)
            similarity.certified(q, k, v, x.projection, decay, spec, outs, (b, h))
    result = Certified(values, bound, scale)
    lost = ~np.isfinite(bound).all(axis=-1)
    settle_rows(
        x, spec, result, np.ones_like(lost) if settle is None else settle | lost, similarity
    )
    return result


def settle_rows(
    x: AttentionInputs, spec: Spec, c: Certified, rows: np.ndarray, similarity: Similarity
) -> int:
    """Recompute with the arb engine, in place, the rows of c that `rows` marks (B, H, Nq)
    and whose elements are not all within CERTIFIED_SHARE of their
    scale (0 <= 0 where 0/0 exactly; an infinite bound never is): each is then within one
    ulp of the exact value, or half a subnormal unit (the arb engine with the family's
    `similarity`, Family.similarity). Returns how many rows it settled."""
    ok = ((c.bound <= CERTIFIED_SHARE * c.scale) & np.isfinite(c.bound)).all(axis=-1)
    pending = {
        (b, h): found
        for b in range(ok.shape[0])
        for h in range(ok.shape[1])
        if (found := np.flatnonzero(rows[b, h] & ~ok[b, h]).tolist())
    }
    if not pending:
        return 0
    exact = arb_attention(x, spec, similarity, pending=pending)
    for (b, h), found in pending.items():
        c.values[b, h, found] = exact[b, h, found]
        c.bound[b, h, found] = np.maximum(np.abs(exact[b, h, found]) * 2 * U64, SUBNORMAL)
    settled = sum(map(len, pending.values()))
    c.recomputed += settled
    return settled


def plain_head(q, k, v, w, spec: Spec, outs: tuple[np.ndarray, ...], at: tuple[int, int], sums):
    """One head of a spec without a decay into outs (values, bound, scale) at (b, h), its
    sums by the family's sums(q, k, v, w, spec, relative, lost) (the kernelised maps' or
    softmax's): per block of query rows, (start, stop, (value sums [num, den], |term| sums,
    error sums, their depths, eps, its relative error, small)), lost[0] set where the
    features' errors were not relative after all (then run again without `relative`)."""
    later = np.append(np.maximum(np.abs(v).max(axis=0, initial=0.0), 1.0), 1.0)
    for relative in (spec.feature_map in RELATIVE, False):
        lost = [False]
        for start, stop, block in sums(q, k, v, w, spec, relative, lost):
            value, magnitude, errors, n_value, n_errors, eps, eps_rel, small = block
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
