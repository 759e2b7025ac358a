"""Channel gates' terms of the shared a-priori bound (accuracy/bound.py), built on the scalar
decays' (families/decayed/bound.py, whose log-gates' weights, errors and float64 sums take a
gate per token and key channel as well), and so on kernelised attention's: only the sums in
balls are their own, the weights w_ijm = exp(G_im - G_jm) per key channel m.
"""

from __future__ import annotations

from flint import arb, arb_mat

from ...reference.balls import Head, masked
from ...specs import Spec
from ..decayed.bound import decayed_ball_sums
from .reference import channel_gated


def ball_sums(head: Head, spec: Spec, u: float, x: list[list[arb]]):
    """decayed_ball_sums with the channel gates' sums: (fq . B)(fk / B)^T, masked
    (balls.channel_gated; Yang et al. 2024, GLA, sec. 4.1)."""
    rows = list(range(head.q.shape[0]))

    def gated(fq, fk, x, causal: bool) -> list[list[arb]]:
        up, down = channel_gated(fq, fk, head)
        sims = masked((arb_mat(up) * arb_mat(down).transpose()).tolist(), rows, True)
        return (arb_mat(sims) * arb_mat(x)).tolist()

    return decayed_ball_sums(head, spec, u, x, gated)
