"""The scalar decays' golden forms: kernelised attention's (families/kernelised/golden.py,
which this family builds on) with the decay's float64 log-decays and w_ij."""

from __future__ import annotations

import torch

from ...specs import Spec
from ..kernelised.golden import GoldenDecay, golden_forms, long_form
from ..kernelised.golden import golden_attention as kernelised_golden
from .quadratic import weights
from .values import check_decay

# this family's golden forms are kernelised attention's (the quadratic form alone: a decayed
# spec is not plain), its long-context form the linear one
__all__ = ["golden_attention", "golden_forms", "long_form"]


def log_decays(decay: torch.Tensor, spec: Spec, n: int, device: torch.device) -> torch.Tensor:
    """The log-decay of each token in float64, (H, N, 1) ln gamma or (B, H, N, 1) g, for the
    scan to sum inside its blocks."""
    logs = decay.to(device=device, dtype=torch.float64)
    if spec.decay == "constant":
        return torch.log(logs)[:, None, None].expand(-1, n, 1)
    return logs[..., None]


DECAYED = GoldenDecay(weights, log_decays, check_decay)


def golden_attention(q, k, v, spec: Spec, projection=None, form=None, decay=None) -> torch.Tensor:
    """Kernelised attention's golden_attention with this family's decay."""
    return kernelised_golden(q, k, v, spec, projection, form, decay, DECAYED)
