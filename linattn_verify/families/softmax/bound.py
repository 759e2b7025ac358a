"""Softmax attention's terms of the shared a-priori bound (accuracy/bound.py): one head's
sums in arb balls (no float64 engine, no state).

Softmax is a single exponential (m = 1): a_ij = exp(s_ij), s = q.k / sqrt(d), with |ds| <=
gamma_{d + C_LIB + 2} sum_l |q_l k_l| / sqrt(d) + u (|s_ij| + max_j |s_ij|) (the last term:
a stabilising max subtraction), so |da_ij| <= a_ij (e^{|ds|}(1 + gamma_{C_LIB}) - 1)
(Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., Lemma 3.1 and eq. 3.5).
"""

from __future__ import annotations

import numpy as np
from flint import arb, arb_mat

from ...reference.balls import Head, balls, direct_sims, masked
from ...rounding import C_LIB, gamma, grow
from ...specs import Spec


def ball_sums(head: Head, spec: Spec, u: float, x: list[list[arb]]):
    """(N and D, A, F, 1) of a head in arb balls (accuracy/ball_sums.py takes it on): N and D
    the sums of a_ij times v (none) and 1, A = D's, F the sums of the |da_ij| bounds (module
    docstring), both with x = [|v|, 1] as columns."""
    name, causal = spec.feature_map, spec.causal
    rows = list(range(head.q.shape[0]))
    sims = masked(direct_sims(head, rows, name), rows, causal)
    d = head.q.shape[1]
    absdot = arb_mat(balls(np.abs(head.q))) * arb_mat(balls(np.abs(head.k))).transpose()
    s = (arb_mat(balls(head.q)) * arb_mat(balls(head.k)).transpose()) * arb(d).rsqrt()
    g_dot, g_lib = gamma(d + C_LIB + 2, u), gamma(C_LIB, u)
    rel = []
    for i, (ar, sr) in enumerate(zip(absdot.tolist(), s.tolist(), strict=True)):
        big = max(abs(t).upper() for t in (sr[: i + 1] if causal else sr))
        ds = [g_dot * a * arb(d).rsqrt() + u * (abs(t) + big) for a, t in zip(ar, sr, strict=True)]
        rel.append([grow(e.exp() - 1, g_lib) for e in ds])
    f = [[a * r for a, r in zip(ar, rr, strict=True)] for ar, rr in zip(sims, rel, strict=True)]
    xm = arb_mat(x)
    a_sums = (arb_mat(sims) * xm).tolist()
    return a_sums, a_sums, (arb_mat(f) * xm).tolist(), 1
