"""The delta rule's inputs: beta (B, H, N) and its gates packed as the one per-token argument
the checks carry (pack_delta), their validation, and the draws of a case.

A case's inputs have unit-norm keys, as the rule's layers hand them to the kernel (for a
kernel that normalises them itself, Spec.qk_l2norm, the normal kind's keys are drawn raw),
beta ~ U(0, 1), and its own kinds (DELTA_KINDS, drawn as normal otherwise; cases.py's
docstring has the others); the magnitude scales q alone (the keys are normalised, v is
N(0, 1) as for every kind):
- beta-near-two: beta in (2 - 2^-4, 2): I - beta k k^T nearly a reflection;
- long-keys: every key of norm exp(U(-1, 1)) (0.37 to 2.7): I - beta k k^T expands by up to
  |1 - beta |k|^2| (the kernel is still given them as they are);
- parallel-keys: every key of a head k_0 + 10^-3 N(0, 1), normalised: nearly parallel
  consecutive keys, the UT transform's ill-conditioned case (fla #537).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ...cases import Case, constant_decay, rated_decay
from ...inputs import AttentionInputs, as_float64, exact_tensors
from ...specs import Spec, SpecError
from ..decayed.values import check_decay

DELTA_KINDS = ("beta-near-two", "long-keys", "parallel-keys")
_F64 = {"dtype": torch.float64}


def pack_delta(beta: Any, g: Any = None) -> Any:
    """beta (B, H, N) and the log-gates g, none, (B, H, N) or (B, H, N, d), stacked along a
    last axis (B, H, N, 1 + F) (torch tensors), so that slicing tokens slices both."""
    parts = [beta[..., None]] + ([] if g is None else [g if g.dim() == 4 else g[..., None]])
    return torch.cat(parts, -1)


def delta_arguments(spec: Spec, packed: Any) -> dict[str, Any]:
    """The keywords beta= and (with a decay) g= of a delta-rule spec from pack_delta's
    packed tensor or array, in its layout ((B, H, N, 1 + F) or (B, N, H, 1 + F))."""
    if getattr(packed, "ndim", None) != 4:
        raise SpecError(f"{spec} takes beta (and g) packed (B, H, N, 1 + F): pack_delta")
    if spec.decay is None:
        return {"beta": packed[..., 0]}
    g = packed[..., 1] if spec.decay == "gates" else packed[..., 1:]
    return {"beta": packed[..., 0], "g": g}


def validate_delta(
    q: Any, k: Any, v: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> AttentionInputs:
    """inputs.validate for the delta rule: decay is beta with its gates packed."""
    x = exact_tensors(q, k, v, spec, projection)
    qa = x.q
    if decay is None:
        raise SpecError(f"{spec} needs beta (B, H, N)")
    width = 1 + {None: 0, "gates": 1, "channel-gates": qa.shape[3]}[spec.decay]
    if getattr(decay, "ndim", None) != 4 or decay.shape[-1] != width:
        got = tuple(getattr(decay, "shape", ()))
        raise SpecError(f"{spec} takes beta and its gates packed (B, H, N, {width}), got {got}")
    given = delta_arguments(spec, decay)
    beta, _ = as_float64(given["beta"], "beta")
    if beta.shape != qa.shape[:3]:
        raise SpecError(f"beta must have shape {qa.shape[:3]}, got {beta.shape}")
    return replace(x, decay=check_decay(given.get("g"), spec, qa.shape), beta=beta)


def case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    """(q, k, v, W, beta with its gates packed) of a case: keys as cases.py's docstring says
    (unit norm; raw for the normal kind under qk_l2norm), beta ~ U(0, 1), from the case's
    seed."""
    q, k, v, w = case.float64_tensors()
    gen = torch.Generator().manual_seed(case.seed * 7919 + 2)
    if case.kind == "parallel-keys":  # at any magnitude: from the unit first key
        first = k[..., :1, :] / k[..., :1, :].norm(dim=-1, keepdim=True).clamp(min=1e-300)
        k = first + 1e-3 * torch.randn(k.shape, generator=gen, **_F64)
    if not spec.qk_l2norm or case.kind != "normal":
        norms = torch.ones(k.shape[:-1], **_F64)
        if case.kind == "long-keys":
            norms = torch.exp(2 * torch.rand(k.shape[:-1], generator=gen, **_F64) - 1)
        k = k * (norms / k.norm(dim=-1).clamp(min=1e-300))[..., None]
    beta = torch.rand(k.shape[:-1], generator=gen, **_F64)
    if case.kind == "beta-near-two":
        beta = 2 - beta / 16
    q, k, v, w = case.rounded(q, k, v, w)
    (beta,) = case.rounded(beta)
    return q, k, v, w, pack_delta(beta, case.decay(spec.decay))


def long_arguments(spec: Spec, k: torch.Tensor, rates: torch.Tensor, seed: int, dtype: Any):
    """The long-context check's keys, unit-norm as the rule's layers hand them over (raw where
    the kernel normalises them itself, qk_l2norm), and beta ~ U(0, 1) packed with the gates
    of `rates` (cases.rated_decay), as case_arguments draws them."""
    gates = rated_decay(spec.decay, rates, tuple(k.shape), seed)
    if not spec.qk_l2norm:
        k = k / k.norm(dim=-1, keepdim=True)
    gen = torch.Generator().manual_seed(seed * 7919 + 2)
    beta = torch.rand(k.shape[:-1], generator=gen, **_F64)
    return k, pack_delta(beta, gates)


def default_arguments(spec: Spec, q: torch.Tensor) -> torch.Tensor:
    """The argument of inputs that come from no case (the scaling runs): beta = 1 / d (beta
    |k|^2 about 1 for N(0, 1) keys: I - beta k k^T stays near a projection) with the cases'
    constant gates (cases.constant_decay)."""
    beta = torch.full(q.shape[:3], 1 / q.shape[-1], dtype=q.dtype, device=q.device)
    return pack_delta(beta, constant_decay(spec.decay, q))
