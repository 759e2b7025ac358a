"""The golden implementation's own feature maps, written plainly from each formula with
torch's exp, sin and cos: no C kernel, no exp2, nothing shared with the fast forms'
features.py, so that a fault in the fast path cannot move the budget that judges it.

phi(x) = exp(log_scale) body, one log-scale per row where a map needs one (the exponential
maps, and elu for very negative rows), so that nothing overflows or underflows the compute
dtype; the scales cancel between numerator and denominator (eps is rescaled to match).
"""

from __future__ import annotations

import math

import torch

from ...specs import Spec

# elu features of a row are shifted when a coordinate of q or k is below this: unshifted,
# every feature is >= e^-30, so products of two and their sums stay far above float32's
# smallest normal
ELU_SHIFTED_BELOW = -30.0


def shifted_form(spec: Spec, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the features are taken with a log-scale per row."""
    if spec.feature_map.startswith("performer"):
        return True
    lowest = min(float(q.detach().min()), float(k.detach().min()))
    return spec.feature_map == "elu" and lowest < ELU_SHIFTED_BELOW


def golden_features(
    x: torch.Tensor,
    spec: Spec,
    w: torch.Tensor | None,
    big_m: int,
    shifted: bool,
    divide: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(body, log_scale) of the rows of x (positions 0, 1, ... for cosFormer, whose M is
    big_m); log_scale None where the map needs none. x' = x d^(-1/4) is formed as x times
    d^(-1/4), or with `divide` as x / d^(1/4): the two ways a careful kernel writes it, whose
    constants round differently. The exponents of the Performer maps amplify that one
    rounding by |x'|^2 (a fifth of the error of a performer-trig row at d = 2, in either
    direction), so the golden forms take one each and the budget the worse of them."""
    name, d = spec.feature_map, x.shape[-1]
    if name == "elu":  # Katharopoulos et al. 2020, eq. 7: x + 1 above 0, exp(x) below
        if not shifted:
            return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0.0))), None
        top = torch.clamp(x.amax(dim=-1, keepdim=True), max=0.0)  # 0 where some x > 0
        return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0.0) - top)), top
    if name == "relu":  # torch.relu's backward takes the subgradient 0 at 0, as reference/grad.py
        return torch.relu(x), None
    if name == "identity":
        return x, None
    if name == "cosformer":  # Qin et al. 2022, eq. 10: [relu(x_i) cos a_i, relu(x_i) sin a_i]
        a = torch.arange(x.shape[-2], device=x.device, dtype=x.dtype) * (math.pi / (2 * big_m))
        r = torch.relu(x)
        return torch.cat((r * a.cos().unsqueeze(-1), r * a.sin().unsqueeze(-1)), dim=-1), None
    scaled = x / d**0.25 if divide else x * d**-0.25  # x' = x d^(-1/4)
    if name == "taylor":  # Arora et al. 2024: [1, x', vec(x' x'^T) / sqrt(2)]
        pairs = torch.einsum("...i,...j->...ij", scaled, scaled).flatten(-2) / math.sqrt(2.0)
        return torch.cat((torch.ones_like(scaled[..., :1]), scaled, pairs), dim=-1), None
    projected = scaled @ w.transpose(-2, -1)  # W x', Choromanski et al. 2021, Lemma 1
    norm = (scaled * scaled).sum(dim=-1, keepdim=True) / 2  # |x'|^2 / 2
    m = w.shape[0]
    if name == "performer-trig":  # exp(|x'|^2 / 2) / sqrt(m) [sin W x', cos W x']
        return torch.cat((projected.sin(), projected.cos()), dim=-1), norm - math.log(m) / 2
    if name == "performer-hyperbolic":  # exp(-|x'|^2 / 2) / sqrt(2m) [exp(W x'), exp(-W x')]
        exponent, log_norm = torch.cat((projected, -projected), dim=-1), math.log(2 * m) / 2
    else:  # performer-positive: exp(W x' - |x'|^2 / 2) / sqrt(m)
        exponent, log_norm = projected, math.log(m) / 2
    top = exponent.amax(dim=-1, keepdim=True)
    return torch.exp(exponent - top), top - norm - log_norm


def at_one_scale(
    body: torch.Tensor, log_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every row of a (b, h) at the largest log-scale among them: phi = exp(top) body'."""
    if log_scale is None:
        return body, None
    top = log_scale.amax(dim=-2, keepdim=True)
    return body * torch.exp(log_scale - top), top
