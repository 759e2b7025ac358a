"""The golden implementation's machinery that every family's golden form shares: the call's
checks, the quadratic form given a family's weights, and the careful quotient.

The golden forms set the accuracy budget (docs/accuracy.md, "The budget"): an
implementation's error is judged against k times the error of the golden one in the same
dtype on the same inputs. So they are written for accuracy, not speed:

- wide accumulation: float16/bfloat16/float32 inputs are computed in float32, float64
  inputs in float64; the output is rounded once, to the input dtype, at the end;
- exponentials are evaluated in shifted form so that nothing overflows the compute dtype
  (the shifts cancel between numerator and denominator, and scale `eps` accordingly);
- nothing shared with the fast forms they budget (no C kernel, no exp2).

Output row i = sum_j sim(q_i, k_j) v_j / (eps + sum_j sim(q_i, k_j)), key j used by query i
iff j <= i when causal (docs/contract.md, "The specs"). Each family's golden forms are its
folder's (families/<f>/golden.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..inputs import ArgumentCheck, no_decay, validate
from ..specs import Spec, SpecError

if TYPE_CHECKING:
    import numpy as np

GOLDEN_FORMS: tuple[str, ...] = ("quadratic", "linear")
# weights(q, k, spec, w, decay): a family's (Nq, Nk) weights in the compute dtype, masked
# (zero) where j > i, with their log-scale per row (sim_ij = exp(shift_i) weights_ij; None:
# the weights are the similarities), the spec's scale c not yet in them
Weights = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def check_call(
    q, k, v, spec, projection, form, decay, forms: tuple[str, ...], check: ArgumentCheck = no_decay
) -> None:
    """Raise SpecError for anything a golden form cannot evaluate as the spec says; forms:
    the golden forms of the spec's family, check: its argument's (a decay's, the decayed
    families'; inputs.ArgumentCheck)."""
    if not isinstance(spec, Spec):
        raise SpecError(f"spec must be a linattn_verify.Spec, got {type(spec).__name__}")
    if form not in GOLDEN_FORMS:
        raise SpecError(f"unknown form {form!r}; golden forms: {', '.join(GOLDEN_FORMS)}")
    if form not in forms:
        raise SpecError(f"{spec} has no golden {form} form: use form='quadratic'")
    validate(q, k, v, spec, projection, decay, check)  # shapes, dtypes, values, W, decay
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise SpecError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise SpecError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def computed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    projection: torch.Tensor | np.ndarray | None,
) -> tuple[torch.Tensor, ...]:
    """(q, k, v, W) in the compute dtype (W None where not given, else on q's device)."""
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = (t.to(compute) for t in (q, k, v))
    w = None
    if projection is not None:
        w = torch.as_tensor(projection).to(device=q.device, dtype=compute)
    return qc, kc, vc, w


def causal_mask(spec: Spec, nq: int, nk: int, device: torch.device) -> torch.Tensor | None:
    """The keys query i sees, j <= i, (Nq, Nk) booleans; None for a non-causal spec."""
    if not spec.causal:
        return None
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril()


def quadratic(q, k, v, spec: Spec, projection, decay, weights: Weights) -> torch.Tensor:
    """The quadratic form (the (Nq, Nk) weights materialised, masked, times V) of checked
    inputs, with the weights of the spec's family (Weights); c taken into the weights."""
    qc, kc, vc, w = computed(q, k, v, projection)
    sims, shift = weights(qc, kc, spec, w, decay)
    sims = sims * spec.scale_for(q.shape[-1])
    return finish(sims @ vc, sims.sum(dim=-1, keepdim=True), spec, 1.0, shift, q.dtype)


def finish(num, den, spec: Spec, scale: float, shift, dtype: torch.dtype) -> torch.Tensor:
    """The output in `dtype` of num and den in units exp(shift) per row (None: 1), their
    scale c not yet taken: c N / (c D + eps) as N / (D + eps / c) normalised (c cancels but
    against eps), c N exp(shift) unnormalised."""
    if not spec.normalize:  # c N exp(shift)
        num = num * scale
        return (num if shift is None else num * torch.exp(shift)).to(dtype)
    return (num / (den + eps_in_units(spec.eps / scale, shift))).to(dtype)


def total(first: torch.Tensor | None, second: torch.Tensor | None) -> torch.Tensor | None:
    """The sum of two log-scales, either of which may be absent."""
    if first is None or second is None:
        return second if first is None else first
    return first + second


def eps_in_units(eps: float, log_scale: torch.Tensor | None) -> torch.Tensor | float:
    """eps exp(-log_scale): eps in the units of the scaled sums (0 stays 0)."""
    if eps == 0.0 or log_scale is None:
        return eps
    return torch.exp(math.log(eps) - log_scale)
