"""The scalar decays' part of the shared exact engines (reference/similarity.py): kernelised
attention's similarities (families/kernelised/reference.py, which this family builds on)
times the weights w_ij = gamma^(i - j) ("constant": Sun et al. 2023, eq. 6) or exp(G_i -
G_j), G the prefix sums of the log-gates ("gates"; families/decayed/fields.py): in mpmath
(mp.decay_weights), in arb (decay_weights), in the certified engine's decayed sums
(certified_decay.decayed_sums, which the channel gates share), the state's, and the exact
gradients' (gradients.py). None imports an implementation.
"""

from __future__ import annotations

import mpmath
import numpy as np
from flint import arb, arb_mat

from ...inputs import AttentionInputs
from ...reference.balls import Head
from ...reference.certified import _finish
from ...reference.certified_decay import decayed_sums
from ...reference.common import head_decay
from ...reference.final_state import floats
from ...reference.mp import decay_weights as mp_decay_weights
from ...reference.mp import sim_rows
from ...reference.similarity import Similarity
from ...specs import Spec
from ..kernelised import reference as kernelised
from .gradients import GRADIENTS


def mp_rows(x: AttentionInputs, spec: Spec, b: int, h: int, keys: list, w: list | None):
    """Similarity.mp: c w_ij sim(q_i, k_j), the magnitudes times w_ij c (1 + |ln w_ij|)."""
    plain = sim_rows(x, spec, keys, w)
    decay = head_decay(x, b, h)

    def row(i: int, qi: list, c) -> tuple[list, list]:
        sims, mags = plain(i, qi)
        wts, logs = mp_decay_weights(decay, i, spec.decay)
        sims = [s * t * c for s, t in zip(sims, wts)]
        mags = [a * t * c * e for a, t, e in zip(mags, wts, logs)]
        return sims, mags

    return row


def arb_sims(head: Head, spec: Spec, rows: list[int]) -> list[list[arb]]:
    """Similarity.arb: w_ij sim(q_i, k_j), kernelised.arb_sims times decay_weights."""
    sims = kernelised.arb_sims(head, spec, rows)
    weights = decay_weights(head, rows, spec.decay)
    return [[a * b for a, b in zip(r, w, strict=True)] for r, w in zip(sims, weights)]


def decay_weights(head: Head, rows: list[int], kind: str) -> list[list[arb]]:
    """w_ij for the query rows `rows` and every key j <= i (0 beyond), exactly at the working
    precision: gamma^(i - j) ("constant") or exp(g_(j+1) + ... + g_i) = exp(G_i) / exp(G_j),
    G the prefix sums of the log-gates ("gates"; families/decayed/fields.py)."""
    nk, zero = head.k.shape[0], arb(0)
    if kind == "constant":
        powers = [arb(1)]
        for _ in range(nk - 1):
            powers.append(powers[-1] * arb(float(head.decay)))
        return [[powers[i - j] if j <= i else zero for j in range(nk)] for i in rows]
    total, growth = arb(0), []
    for g in head.decay.tolist():
        total += g
        growth.append(total.exp())
    return [[growth[i] / growth[j] if j <= i else zero for j in range(nk)] for i in rows]


def certified_head(q, k, v, w, decay, spec: Spec, outs, at) -> None:
    """Similarity.certified: one head of a decayed (or channel-gated) spec into outs
    (values, bound, scale) at (b, h), from certified_decay.decayed_sums."""
    values, bound, scale = outs
    b, h = at
    d = q.shape[1]
    for start, stop, value, total, magnitude in decayed_sums(q, k, v, w, decay, spec):
        out = _finish(value, total, magnitude, spec.eps, 0.0, spec, d)
        values[b, h, start:stop], bound[b, h, start:stop] = out[:2]
        scale[b, h, start:stop] = out[2]


def state_keys(head: Head, spec: Spec, fk: list[list[arb]]) -> list[list[arb]]:
    """Similarity.state_keys: w_(N-1, j) phi(k_j)."""
    last = decay_weights(head, [head.k.shape[0] - 1], spec.decay)[0]
    return [[t * w for t in row] for row, w in zip(fk, last, strict=True)]


def from_start(head: Head, spec: Spec, f: int) -> list[list[arb]]:
    """Similarity.from_start: gamma^(i + 1) or exp(G_i), one value for every channel."""
    n = head.q.shape[0]
    if spec.decay == "constant":
        gamma, out = arb(float(head.decay)), []
        for _ in range(n):
            out.append((out[-1] if out else arb(1)) * gamma)
        return [[t] * f for t in out]
    total, out = arb(0), []
    for g in head.decay.tolist():
        total += g
        out.append(total.exp())
    return [[t] * f for t in out]


def causal_sims(head: Head, spec: Spec, fq, fk) -> tuple[list, list]:
    """Similarity.causal_sims: (phi(q_i) . phi(k_j), w_ij for j <= i and 0 beyond)."""
    weights = decay_weights(head, list(range(head.q.shape[0])), spec.decay)
    return (arb_mat(fq) * arb_mat(fk).transpose()).tolist(), weights


def final_weights(x: AttentionInputs, spec: Spec, b: int, h: int, n: int, f: int):
    """Similarity.final_weights: w_(N-1, j) (mp.decay_weights), the largest 1 + M(ln w)
    for every key, and W_(N-1) = gamma^N or exp(G_(N-1)), the same for every feature."""
    mp = mpmath.mp
    decay = head_decay(x, b, h)
    weights, spreads = mp_decay_weights(decay, n - 1, spec.decay)
    if spec.decay == "constant":
        into = mp.mpf(float(decay)) ** n
    else:
        into = mp.exp(mp.fsum(mp.mpf(t) for t in decay))
    return [[w] * f for w in weights], [max(spreads)] * n, [into] * f


def final_gates(spec: Spec):
    """Similarity.final_gates: dL_S/dg per token, the sum over the features, for gates;
    None for a constant decay (gamma is held fixed)."""
    return _token_gates if spec.decay == "gates" else None


def _token_gates(dg: list, dg_m: list) -> tuple[np.ndarray, np.ndarray]:
    mp = mpmath.mp
    dg, dg_m = [[mp.fsum(row)] for row in dg], [[mp.fsum(row)] for row in dg_m]
    return floats(dg)[:, 0], floats(dg_m)[:, 0]


DECAYED = Similarity(
    mp=mp_rows,
    arb=arb_sims,
    linear=lambda spec, head: False,
    certified=certified_head,
    state_keys=state_keys,
    from_start=from_start,
    causal_sims=causal_sims,
    final_weights=final_weights,
    final_gates=final_gates,
    gradients=GRADIENTS,
)
