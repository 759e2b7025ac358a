"""The scalar decays' quadratic form, golden and built-in alike: kernelised attention's
weights (families/kernelised/quadratic.py, which this family builds on) times the decay's
w_ij."""

from __future__ import annotations

import math

import torch

from ...specs import Spec
from ..kernelised.quadratic import quadratic_weights


def decay_matrix(decay: torch.Tensor, spec: Spec, shape: torch.Size) -> torch.Tensor:
    """w_ij in float64, (H, N, N) for gamma and (B, H, N, N) for gates, 0 for j > i:
    gamma^(i - j) = exp((i - j) ln gamma) or exp(G_i - G_j), G the float64 prefix sums of
    the log-gates (Sun et al. 2023, eq. 5; Yang et al. 2024, eq. 3)."""
    n = shape[-2]
    steps = torch.arange(n, device=decay.device, dtype=torch.float64)
    if spec.decay == "constant":
        log_w = (steps[:, None] - steps) * torch.log(decay.to(torch.float64))[:, None, None]
    else:
        prefix = torch.cumsum(decay.to(torch.float64), dim=-1)
        log_w = prefix[..., :, None] - prefix[..., None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=decay.device).tril()
    return torch.exp(log_w.masked_fill(~keep, -math.inf))


def weights(q, k, spec: Spec, w, decay) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights of the quadratic form (implementations.golden.Weights): the similarities
    times w_ij (decay_matrix) rounded to the compute dtype."""
    sims, shift = quadratic_weights(q, k, spec, w)
    return sims * decay_matrix(decay, spec, q.shape).to(q.dtype), shift
