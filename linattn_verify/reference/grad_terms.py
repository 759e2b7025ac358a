"""The per-row terms of the exact gradients (grad.py) at the working precision, each with its
magnitude M: the scale times the weights, c w_ij (the weights w_ij a family's: its
Gradients.rows, e.g. families/decayed/gradients.py; channel gates' A_ij and its terms
A_ijm in families/channel_gates/gradients.py); b_ij = (t_ij - tbar_i) / D_i; the
coefficients e_ij = b_ij c w_ij weight_ij and p_ij = b_ij A_ij; and dL/dg_t = sum_{i >= t >
j} p_ij. Derivation and the rules for M: grad.py's module docstring."""

from __future__ import annotations

import mpmath

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec
from .grad_maps import Kernel


def scale(spec: Spec, d: int):
    """The scale c at the working precision: 1 / sqrt(d) or the spec's number."""
    mp = mpmath.mp
    return 1 / mp.sqrt(d) if spec.scale == RSQRT_D else mp.mpf(spec.scale)


def plain_rows(x: AttentionInputs, spec: Spec, b: int, h: int, kern: Kernel, c):
    """Gradients.rows without weights (w_ij = 1: kernelised, softmax): weighted_rows."""
    return weighted_rows(kern, c)


def weighted_rows(kern: Kernel, c, weights=None):
    """Gradients.rows for weights that are numbers: row(i, js) -> (A_ij = c w_ij a_ij and
    M(A_ij) = c M(w_ij) M(a_ij), the weights c w_ij weight_ij that turn b_ij into e_ij and
    their M, and A_ij again as the terms of p_ij) over the keys js of row i; weights(i) ->
    (w_ij, 1 + M(ln w_ij)) for the keys j <= i (a decay's), None for w_ij = 1."""

    def row(i: int, js: list) -> tuple[list, ...]:
        f, fm = _factors(c, weights, i, len(js))
        a = [kern.a[i][j] * fj for j, fj in zip(js, f)]
        am = [kern.am[i][j] * fj for j, fj in zip(js, fm)]
        wt, wtm = f, fm
        if kern.wt[i] is not None:
            wt = [fn * kern.wt[i][j] for j, fn in zip(js, f)]
            wtm = [fn * kern.wtm[i][j] for j, fn in zip(js, fm)]
        return a, am, wt, wtm, a, am

    return row


def _factors(c, weights, i: int, n_keys: int):
    """(c w_ij, c M(w_ij)) for the n_keys keys j of row i at the working precision: the
    scale times the weights (weighted_rows'; 1 without)."""
    if weights is None:
        return [c] * n_keys, [c] * n_keys
    ws, spreads = weights(i)  # spread: 1 + M(ln w_ij)
    return [c * w for w in ws], [c * w * t for w, t in zip(ws, spreads)]


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
