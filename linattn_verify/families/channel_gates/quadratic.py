"""Channel gates' quadratic form, golden and built-in alike: kernelised attention's weights
(families/kernelised/quadratic.py, which this family builds on) with the gates inside the
products of the features, one factor per key channel."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...specs import Spec
from ..kernelised.quadratic import quadratic_weights

GATED_ELEMENTS = 2**24  # channel gates' factors exp(G_im - G_jm) held at once (128 MiB)


def gated_products(phi_q: torch.Tensor, phi_k: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
    """sum_m phi(q_i)_m phi(k_j)_m exp(G_im - G_jm) for j <= i (0 above the diagonal; Yang et
    al. 2024, sec. 4.1's parallel form in log space): each factor exp(G_im - G_jm) <= 1 from
    the float64 prefix sums G (B, H, N, d) of the log-gates, rounded once to the compute
    dtype. GATED_ELEMENTS bounds the (rows, N, d) factors held at once."""
    n = gates.shape[-2]
    rows = max(1, GATED_ELEMENTS // max(1, gates[..., 0, 0].numel() * n * gates.shape[-1]))
    keep = torch.ones(n, n, dtype=torch.bool, device=gates.device).tril()[..., None]
    parts = []
    for start in range(0, n, rows):
        block = slice(start, start + rows)
        logs = gates[..., block, None, :] - gates[..., None, :, :]
        factors = torch.exp(logs.masked_fill(~keep[block], -math.inf)).to(phi_q.dtype)
        rows_q = phi_q[..., block, :]
        parts.append(torch.einsum("...im,...jm,...ijm->...ij", rows_q, phi_k, factors))
    return torch.cat(parts, dim=-2)


def weights(q, k, spec: Spec, w, decay) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of the quadratic form (implementations.golden.Weights): the gated
    products of the features, from the float64 prefix sums of the log-gates g."""
    gates = torch.cumsum(decay.to(torch.float64), dim=-2)
    return quadratic_weights(q, k, spec, w, partial(gated_products, gates=gates))
