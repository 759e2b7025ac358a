"""Softmax attention's one form, quadratic, golden and built-in alike
(implementations/golden.py's quadratic form with the softmax weights)."""

from __future__ import annotations

import math

import torch

from ...implementations.golden import causal_mask, check_call, quadratic
from ...specs import Spec

FORMS = ("quadratic",)


def weights(q, k, spec: Spec, w, decay) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, shift) with sim_ij = exp(shift_i) weights_ij, 0 where j > i
    (implementations.golden.Weights). Vaswani et al. 2017, eq. 1: sim = exp(q.k / sqrt(d));
    the row max is subtracted from the (masked) logits, so every weight is in [0, 1] and the
    largest is 1."""
    d = q.shape[-1]
    mask = causal_mask(spec, q.shape[-2], k.shape[-2], q.device)
    logits = (q @ k.transpose(-2, -1)) * d**-0.5
    if mask is not None:
        logits = logits.masked_fill(~mask, -math.inf)
    row_max = logits.amax(dim=-1, keepdim=True)  # finite: key j = i is never masked
    return torch.exp(logits - row_max), row_max


def softmax_attention(q, k, v, spec: Spec, projection=None, form="quadratic", decay=None):
    """The quadratic form of `spec` with the call's checks (implementations.golden)."""
    check_call(q, k, v, spec, projection, form, decay, FORMS)
    return quadratic(q, k, v, spec, projection, decay, weights)
