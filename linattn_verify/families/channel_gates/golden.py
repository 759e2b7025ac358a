"""Channel gates' golden forms: kernelised attention's (families/kernelised/golden.py, which
this family builds on) with the log-gates per key channel, in the scan's blocks in GLA's
chunk form (Yang et al. 2024, sec. 4.2)."""

from __future__ import annotations

import torch

from ...specs import Spec
from ..decayed.values import check_decay
from ..kernelised.golden import GoldenDecay, golden_forms, long_form
from ..kernelised.golden import golden_attention as kernelised_golden
from .quadratic import gated_products, weights

# Channel gates inside a block of the scan in GLA's factored form (q e^a)(k e^-a)^T where the
# block's decay spans at most this: its float64 operands stay within e^256 = 2^369 of the
# features (float64 reaches 2^1023), pairwise factors (N x N x d exps) beyond
FACTORED_SPAN = 256.0


# this family's golden forms are kernelised attention's (the quadratic form alone: a decayed
# spec is not plain), its long-context form the linear one
__all__ = ["golden_attention", "golden_forms", "long_form"]


def log_decays(decay: torch.Tensor, spec: Spec, n: int, device: torch.device) -> torch.Tensor:
    """The log-gates g (B, H, N, d) in float64, for the scan to sum inside its blocks."""
    return decay.to(device=device, dtype=torch.float64)


def gated_block(q: torch.Tensor, k: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """sum_m q_im k_jm exp(a_im - a_jm) for j <= i (0 above), a (.., L, F) the block's
    float64 prefix sums of the channel gates, formed in float64 and rounded once to q's
    dtype: as (q_i exp(a_i)) . (k_j exp(-a_j)), GLA's chunk form (Yang et al. 2024, sec.
    4.2), where the block's decay spans at most FACTORED_SPAN, else factor by factor
    (gated_products, whose exp(a_im - a_jm) <= 1 cannot overflow)."""
    q64, k64 = q.to(torch.float64), k.to(torch.float64)
    if bool((a[..., -1, :] >= -FACTORED_SPAN).all()):  # a decreases: its last row is least
        inner = ((q64 * torch.exp(a)) @ (k64 * torch.exp(-a)).transpose(-2, -1)).tril()
    else:
        inner = gated_products(q64, k64, a)
    return inner.to(q.dtype)


GATED = GoldenDecay(weights, log_decays, check_decay, gated_block)


def golden_attention(q, k, v, spec: Spec, projection=None, form=None, decay=None) -> torch.Tensor:
    """Kernelised attention's golden_attention with this family's gates."""
    return kernelised_golden(q, k, v, spec, projection, form, decay, GATED)
