"""Channel gates' part of the shared exact engines (reference/similarity.py): kernelised
attention's features (families/kernelised/, which this family builds on) weighted per key
channel, w_ijm = exp(G_im - G_jm), G the prefix sums of the log-gates per channel (Yang et
al. 2024 (GLA), sec. 4.1; families/channel_gates/fields.py): in mpmath (mp.channel_prefix,
channel_factors), in arb (GLA's parallel form (Q . B)(K / B)^T, channel_gated), the
certified engine's decayed sums (the scalar decays' head, families/decayed/, which takes
channel gates too), the state's, and the exact gradients' (gradients.py). None imports an
implementation.
"""

from __future__ import annotations

import mpmath
from flint import arb, arb_mat

from ...inputs import AttentionInputs
from ...reference.balls import Head, features, masked
from ...reference.final_state import floats
from ...reference.mp import channel_factors, channel_prefix, key_features
from ...reference.mp import features as mp_features
from ...reference.similarity import Similarity
from ...specs import Spec
from ..decayed.reference import certified_head
from .gradients import GRADIENTS


def mp_rows(x: AttentionInputs, spec: Spec, b: int, h: int, keys: list, w: list | None):
    """Similarity.mp: each feature m times exp(G_im - G_jm) and c, the magnitudes times c
    and channel_prefix's bound on 1 + |ln w_ijm|."""
    key_feats = key_features(spec, keys, w)
    prefix, spread = channel_prefix(x.decay[b, h].tolist())
    factors = channel_factors(prefix)

    def row(i: int, qi: list, c) -> tuple[list, list]:
        fq = None if key_feats is None else mp_features(qi, w, spec.feature_map)
        sims, mags = _channel_gated(fq, key_feats, factors, i)
        return [s * c for s in sims], [a * c * spread for a in mags]

    return row


def _channel_gated(fq: list, key_feats: list, factors: tuple, i: int) -> tuple[list, list]:
    """(sim_ij, |phi(q_i)| . |phi(k_j)| weighted alike) for keys j <= i (0 beyond) of a
    channel-gated spec: sum_m phi(q_i)_m phi(k_j)_m exp(G_im) exp(-G_jm) (channel_factors)."""
    mp = mpmath.mp
    ups, downs = factors
    sims, mags = [], []
    for j, fk in enumerate(key_feats):
        if j > i:
            sims.append(mp.zero)
            mags.append(mp.zero)
            continue
        wq = [f * a * z for f, a, z in zip(fq, ups[i], downs[j], strict=True)]
        sims.append(mp.fdot(wq, fk))
        mags.append(mp.fdot([abs(t) for t in wq], [abs(t) for t in fk]))
    return sims, mags


def arb_sims(head: Head, spec: Spec, rows: list[int]) -> list[list[arb]]:
    """Similarity.arb: (phi(Q) . B)(phi(K) / B)^T for the query rows `rows` (GLA sec. 4.1)."""
    name = spec.feature_map
    fk = features(head.k, range(head.k.shape[0]), head, name)
    every = features(head.q, range(head.q.shape[0]), head, name)
    up, fk = channel_gated(every, fk, head)
    fq = [up[i] for i in rows]
    return (arb_mat(fq) * arb_mat(fk).transpose()).tolist()


def channel_growth(head: Head) -> list[list[arb]]:
    """exp(G_tm) (N, d) for a channel-gated head, G the prefix sums of its log-gates per
    channel (families/channel_gates/fields.py): w_ijm = exp(G_im) / exp(G_jm), exact at the working
    precision (a ball's exponent has no range to leave)."""
    totals, out = [arb(0)] * head.decay.shape[1], []
    for row in head.decay.tolist():
        totals = [a + g for a, g in zip(totals, row, strict=True)]
        out.append([t.exp() for t in totals])
    return out


def channel_gated(fq: list[list[arb]], fk: list[list[arb]], head: Head) -> tuple[list, list]:
    """(fq_im exp(G_im), fk_jm / exp(G_jm)): the features whose products, over keys j <= i,
    are a channel-gated spec's weighted similarities (GLA's parallel form, Yang et al.
    2024, sec. 4.1: (Q . B)(K / B)^T)."""
    growth = channel_growth(head)
    up = [[f * e for f, e in zip(r, g, strict=True)] for r, g in zip(fq, growth, strict=True)]
    down = [[f / e for f, e in zip(r, g, strict=True)] for r, g in zip(fk, growth, strict=True)]
    return up, down


def state_keys(head: Head, spec: Spec, fk: list[list[arb]]) -> list[list[arb]]:
    """Similarity.state_keys: phi(k_j)_m exp(G_(N-1)m - G_jm)."""
    last = channel_growth(head)[-1]
    _, rows = channel_gated(fk, fk, head)
    return [[t * e for t, e in zip(row, last, strict=True)] for row in rows]


def from_start(head: Head, spec: Spec, f: int) -> list[list[arb]]:
    """Similarity.from_start: exp(G_im) per channel."""
    return channel_growth(head)


def causal_sims(head: Head, spec: Spec, fq, fk) -> tuple[list, list]:
    """Similarity.causal_sims: the channel-weighted products, masked, and weights of 1."""
    n = head.q.shape[0]
    up, down = channel_gated(fq, fk, head)
    sims = masked((arb_mat(up) * arb_mat(down).transpose()).tolist(), range(n), True)
    return sims, [[arb(1)] * n] * n


def final_weights(x: AttentionInputs, spec: Spec, b: int, h: int, n: int, f: int):
    """Similarity.final_weights: exp(G_(N-1)m - G_jm) per key and feature,
    channel_prefix's bound for every key, and exp(G_(N-1)m) per feature."""
    mp = mpmath.mp
    prefix, spread = channel_prefix(x.decay[b, h].tolist())
    last = [[mp.exp(e - t) for e, t in zip(prefix[-1], row, strict=True)] for row in prefix]
    return last, [spread] * n, [mp.exp(t) for t in prefix[-1]]


def final_gates(spec: Spec):
    """Similarity.final_gates: dL_S/dg per token and channel."""
    return lambda dg, dg_m: (floats(dg), floats(dg_m))


CHANNEL_GATES = Similarity(
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
