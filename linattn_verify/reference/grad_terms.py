"""The per-row terms of the exact gradients (grad.py) at the working precision, each with its
magnitude M: the scale times the decay, c w_ij (constant, Sun et al. 2023, RetNet, eq. 5;
gates, Yang et al. 2024, GLA, eq. 3 with scalar gates); channel gates' A_ij and its terms
A_ijm (GLA, sec. 4.1); b_ij = (t_ij - tbar_i) / D_i; the coefficients e_ij = b_ij c w_ij
weight_ij and p_ij = b_ij A_ij; and dL/dg_t = sum_{i >= t > j} p_ij. Derivation and the
rules for M: grad.py's module docstring."""

from __future__ import annotations

import mpmath

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec
from .common import head_decay
from .grad_maps import Kernel
from .mp import channel_factors, channel_prefix, decay_weights


def _factors(x: AttentionInputs, spec: Spec, b: int, h: int, i: int, n_keys: int):
    """(c w_ij, c M(w_ij)) for the n_keys keys j of row i at the working precision: the
    scale times the decay (mp.decay_weights; 1 without one)."""
    mp = mpmath.mp
    c = 1 / mp.sqrt(x.q.shape[3]) if spec.scale == RSQRT_D else mp.mpf(spec.scale)
    if spec.decay is None:
        return [c] * n_keys, [c] * n_keys
    decay = head_decay(x, b, h)
    weights, spreads = decay_weights(decay, i, spec.decay)  # spread: 1 + M(ln w_ij)
    return [c * w for w in weights], [c * w * t for w, t in zip(weights, spreads)]


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
    W_ijm (W_ijm = exp(G_im - G_jm), formed as families/channel_gates/reference.py's
    _channel_gated forms it) and M(A_ij); the weights c W_ijm (lists over m) that turn b_ij
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


def _b_row(t: list, tm: list, den, den_m, tbar, tbar_m, single: int | None) -> tuple[list, list]:
    """b_ij = (t_ij - tbar_i) / D_i and its magnitude over a normalised row's keys (0 at
    the index `single`)."""
    zero = mpmath.mp.zero
    aden = abs(den)
    bs, bms = [], []
    for n, (tn, tmn) in enumerate(zip(t, tm)):
        if n == single:
            bs.append(zero)
            bms.append(zero)
        else:
            bij = (tn - tbar) / den
            bs.append(bij)
            bms.append((tmn + tbar_m + abs(bij) * den_m) / aden)
    return bs, bms


def _times(s, t):
    """s t for a scalar t, [s t_m] for a list t (channel gates' per-feature terms)."""
    return [s * u for u in t] if isinstance(t, list) else s * t


def _row_terms(nk: int, js: list, coefs: tuple, wt: list, wtm: list, a: list, am: list, blank):
    """Row i of e, em, p, pm (over all nk keys, `blank` where not used) from coefs = (b_ij,
    M(b_ij)) over its keys js: e_ij = b_ij wt_ij, p_ij = b_ij A_ij (wt: c w_ij weight_ij).
    Channel gates: wt_ij and A_ij are lists over the features m (c W_ijm and A_ijm), and so
    are e_ij and p_ij; blank is then a list of zeros."""
    bs, bms = coefs
    e, em, p, pm = ([blank] * nk for _ in range(4))
    for n, j in enumerate(js):
        e[j], em[j] = _times(bs[n], wt[n]), _times(bms[n], wtm[n])
        p[j], pm[j] = _times(bs[n], a[n]), _times(bms[n], am[n])
    return e, em, p, pm


def _channel(rows: list, m: int) -> list:
    """Feature m of rows of per-feature lists (channel gates' p_ijm as p_ij)."""
    return [[t[m] for t in row] for row in rows]


def _gate_gradients(p: list, pm: list) -> tuple[list, list]:
    """dL/dg_t = sum_{i >= t} R_i(t), R_i(t) = sum_{j < t} p_ij (p_ij = b_ij A_ij), in
    O(N^2), and the magnitude of this sum (one channel m of channel gates: p_ijm)."""
    zero = mpmath.mp.zero
    n = len(p)
    dg, direct = [zero] * n, [zero] * n
    for i in range(n):
        row = row_m = zero
        for t in range(1, i + 1):
            row, row_m = row + p[i][t - 1], row_m + pm[i][t - 1]
            dg[t], direct[t] = dg[t] + row, direct[t] + row_m
    return dg, direct


def _gate_magnitudes(pm: list) -> list:
    """The magnitude of dL/dg_t through the prefix sums' backward (the general
    evaluation's), sum_{s >= t} (sum_j |p_sj| + sum_i |p_is|) in magnitudes pm (per
    channel for channel gates)."""
    mp = mpmath.mp
    through, after = [mp.zero] * len(pm), mp.zero
    for s in reversed(range(len(pm))):
        after += mp.fsum(pm[s]) + mp.fsum(r[s] for r in pm)
        through[s] = after
    return through
