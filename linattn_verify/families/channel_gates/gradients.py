"""Channel gates' part of the exact gradients (reference/grad.py, through
reference/similarity.Gradients): the rows of A_ij = c sum_m phi(q_i)_m phi(k_j)_m W_ijm,
W_ijm = exp(G_im - G_jm), with their terms per feature m (Yang et al. 2024, GLA, sec. 4.1;
families/channel_gates/fields.py), and dL/dg per token and channel. Built on kernelised attention's
features (grad_maps.Kernel). Derivation and the rules for M: reference/grad.py's module
docstring. None imports an implementation.
"""

from __future__ import annotations

import mpmath

from ...inputs import AttentionInputs
from ...reference.grad_maps import Kernel
from ...reference.mp import channel_factors, channel_prefix
from ...reference.similarity import Gradients
from ...specs import Spec


def rows(x: AttentionInputs, spec: Spec, b: int, h: int, kern: Kernel, c):
    """Gradients.rows: _channel_row of head (b, h)'s channel gates (_channel_gates)."""
    gated = _channel_gates(x, b, h)
    return lambda i, js: _channel_row(kern, gated, c, i, js)


def _channel_gates(x: AttentionInputs, b: int, h: int) -> tuple[list, list]:
    """((exp(G_t), exp(-G_t)), t = 0 .. N-1: mp.channel_factors of the prefix sums of head
    (b, h)'s channel gates, and per row i the spread 2 max_m sum_{t <= i} |g_tm| + 1, a
    bound on 1 + M(ln W_ijm) for its keys j <= i: channel_prefix's spread over the rows
    that row i reaches, as decay_weights' for scalar gates) at the working precision."""
    mp = mpmath.mp
    gates = x.decay[b, h].tolist()
    prefix, _ = channel_prefix(gates)
    spreads, running = [], [mp.zero] * len(gates[0])
    for row in gates:
        running = [a + abs(mp.mpf(t)) for a, t in zip(running, row, strict=True)]
        spreads.append(2 * max(running) + 1)
    return channel_factors(prefix), spreads


def _channel_row(kern: Kernel, gated: tuple, c, i: int, js: list) -> tuple[list, ...]:
    """Row i of a channel-gated spec over its keys js: A_ij = c sum_m phi(q_i)_m phi(k_j)_m
    W_ijm (W_ijm = exp(G_im - G_jm), formed as reference.py's _channel_gated forms it) and
    M(A_ij); the weights c W_ijm (lists over m) that turn b_ij
    into e_ijm and their magnitudes c W_ijm (1 + M(ln W)); and the terms A_ijm = c
    phi(q_i)_m phi(k_j)_m W_ijm of A_ij (lists over m), b_ij times which are dL/dG's p_ijm,
    with their magnitudes."""
    mp = mpmath.mp
    (ups, downs), spreads = gated
    spread = spreads[i]
    fq, fqm = kern.f["q"][i], kern.fm["q"][i]
    a, am, wt, wtm, terms, terms_m = ([] for _ in range(6))
    for j in js:
        fk, fkm = kern.f["k"][j], kern.fm["k"][j]
        weights = [a * z for a, z in zip(ups[i], downs[j], strict=True)]
        wq = [f * t for f, t in zip(fq, weights)]
        wqm = [f * t for f, t in zip(fqm, weights)]
        a.append(mp.fdot(wq, fk) * c)
        am.append(mp.fdot(wqm, fkm) * c * spread)
        cw = [c * t for t in weights]
        wt.append(cw)
        wtm.append([t * spread for t in cw])
        terms.append([c * s * t for s, t in zip(wq, fk)])
        terms_m.append([c * spread * s * t for s, t in zip(wqm, fkm)])
    return a, am, wt, wtm, terms, terms_m


GRADIENTS = Gradients(
    rows=rows, per_feature=True, weight_roundings=lambda nk: 3 * nk + 8, gates=lambda spec: True
)
