"""Kernelised attention's quadratic form, golden and built-in alike: the (Nq, Nk)
similarities phi(q_i) . phi(k_j) materialised from the golden feature maps
(golden_features.py), for implementations/golden.py's quadratic form. The decayed families
build on it: they pass their products (channel gates) or multiply in their decay (scalar
decays)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ...implementations.golden import (
    GOLDEN_FORMS,
    Weights,
    causal_mask,
    check_call,
    quadratic,
    total,
)
from ...inputs import ArgumentCheck, no_decay
from ...specs import Spec
from .golden_features import at_one_scale, golden_features, shifted_form


def dot_products(phi_q: torch.Tensor, phi_k: torch.Tensor) -> torch.Tensor:
    """phi(q_i) . phi(k_j), (Nq, Nk)."""
    return phi_q @ phi_k.transpose(-2, -1)


def quadratic_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    spec: Spec,
    w: torch.Tensor | None,
    products: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = dot_products,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weights, shift): sim_ij = exp(shift_i) * weights_ij, masked (zero) where j > i.

    shift is None when the weights are the similarities themselves. products(phi_q, phi_k):
    the products of the features (the channel gates pass theirs, with their decay inside).
    """
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    mask = causal_mask(spec, nq, nk, q.device)
    name = spec.feature_map

    if name == "taylor":
        # Arora et al. 2024 (Based), sec. 3: sim = 1 + s + s^2/2, s = q.k / sqrt(d).
        s = (q @ k.transpose(-2, -1)) * d**-0.5
        weights, shift = 1.0 + s + 0.5 * (s * s), None
    elif name == "cosformer":
        # Qin et al. 2022, eq. 9-11: relu(q_i).relu(k_j) cos(pi (i - j) / (2M)),
        # M = max(Nq, Nk); the position difference is formed exactly, in integers.
        diff = torch.arange(nq, device=q.device)[:, None] - torch.arange(nk, device=q.device)
        reweight = torch.cos(diff.to(q.dtype) * (math.pi / (2 * max(nq, nk))))
        weights = (torch.relu(q) @ torch.relu(k).transpose(-2, -1)) * reweight
        shift = None
    else:
        shifted = shifted_form(spec, q, k)
        phi_q, shift_q = golden_features(q, spec, w, max(nq, nk), shifted)
        body_k, scale_k = golden_features(k, spec, w, max(nq, nk), shifted)
        if scale_k is None:
            weights, shift_k = products(phi_q, body_k), None
        elif mask is None:
            phi_k, shift_k = at_one_scale(body_k, scale_k)
            weights = phi_q @ phi_k.transpose(-2, -1)
        else:  # each query's own scale: the largest over the keys it sees (j <= i)
            shift_k = torch.cummax(scale_k, dim=-2).values  # (B, H, N, 1)
            gap = (scale_k.transpose(-2, -1) - shift_k).masked_fill(~mask, -math.inf)
            weights = products(phi_q, body_k) * torch.exp(gap)
        shift = total(shift_q, shift_k)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights, shift


def weights(q, k, spec: Spec, w, decay) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The kernelised family's weights of the quadratic form (implementations.golden.Weights):
    no decay."""
    return quadratic_weights(q, k, spec, w)


def quadratic_form(
    q,
    k,
    v,
    spec: Spec,
    projection,
    decay=None,
    weighted: Weights = weights,
    check: ArgumentCheck = no_decay,
):
    """The quadratic form of `spec` (implementations.golden.quadratic) with the call's
    checks; weighted: the weights with a decay in them, check: the decay's check (the
    decayed families')."""
    check_call(q, k, v, spec, projection, "quadratic", decay, GOLDEN_FORMS, check)
    return quadratic(q, k, v, spec, projection, decay, weighted)
