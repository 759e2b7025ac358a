"""Feature maps in torch, shared by the fast forms (the golden one has its own).

phi(x) is returned scaled, with the log of the factor taken out, so that no exponential
overflows the compute dtype: a per-query factor cancels between numerator and denominator,
a factor common to all keys of a (b, h) too (eps is rescaled to match, `scaled_eps`).
Positions (cosFormer) are absolute: row r of x is token start + r of a sequence whose
cosFormer length is n_pos = M = max(Nq, Nk).
"""

from __future__ import annotations

import math

import torch

from ...specs import Spec, SpecError
from . import native

# Maps whose features are exp(a(x) + c(x)): evaluated as log-features, shifted before exp.
EXP_FEATURES = ("performer-positive", "performer-hyperbolic")
# elu features are taken in shifted form when some coordinate of q or k is below this:
# without a shift every feature is >= e^-30 ~ 1e-13, so each product of two and their sums
# stay far above float32's smallest normal (1e-38); with one, an entirely negative row
# (e.g. -60000 in float16, whose exp(x) underflows from x ~ -87) keeps its largest feature
# at 1, and a query and a key with large negative coordinates in different places keep
# products e^(-spread) instead of underflowing to 0/0 (q = (-29, -80), k = (-80, -29)).
ELU_SHIFT_BELOW = -30.0


def needs_shift(spec: Spec, *xs: torch.Tensor) -> bool:
    """Whether the features of xs are taken in shifted form (scaled_features' `shifted`):
    always for the Performer maps, for elu when some coordinate is very negative."""
    name = spec.feature_map
    if name.startswith("performer"):
        return True
    if name != "elu":
        return False
    return any(bool(x.amin() < ELU_SHIFT_BELOW) for x in xs)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x by torch's exp (within C_LIB units). The faster 2^(x log2 e) adds a relative
    error u |x| from the rounding of x log2 e, 86 units for the exponents of an extreme
    performer-trig row, more than the budget allows (README, "Built-in implementations")."""
    return torch.exp(x)


def scaled_features(
    x: torch.Tensor,
    spec: Spec,
    w: torch.Tensor | None,
    n_pos: int,
    start: int = 0,
    shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(body, log_scale) with phi(x_i) = exp(log_scale_i) body_i, one log-scale per row
    (None for the maps that need none; elu has one when `shifted`, see needs_shift). body
    is bounded: the exp maps' largest feature is 1, the trig map's body is [sin, cos]. A
    per-query factor cancels between numerator and denominator; for keys the forms bring
    the rows to a common or running scale."""
    name = spec.feature_map
    if name == "elu" and shifted:
        # elu(x) + 1 = exp(min(x, 0)) + max(x, 0); a row with no positive coordinate is
        # exp(x) = exp(max x) exp(x - max x), the largest body feature 1.
        log_scale = torch.clamp(x.amax(dim=-1, keepdim=True), max=0.0)
        return exp(torch.clamp(x, max=0.0) - log_scale) + torch.relu(x), log_scale
    if name in EXP_FEATURES:
        a, c = performer_exponent(x, name, w)
        a_max = a.amax(dim=-1, keepdim=True)
        # exp(a - max a): the large per-row term c = -|x'|^2/2 never enters the difference.
        return exp(a - a_max), a_max + c
    if name == "performer-trig":
        return trig_parts(x, w)
    return plain_features(x, name, n_pos, start), None


def common_scale(
    body: torch.Tensor, log_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(phi_scaled, shift): all rows of a (b, h) brought to one scale, the largest, so that
    phi(x_j) = exp(shift) phi_scaled_j. Right for keys that every query sees (non-causal);
    causal forms use a running maximum instead, or early queries lose their keys."""
    if log_scale is None:
        return body, None
    shift = log_scale.amax(dim=-2, keepdim=True)
    return body * exp(log_scale - shift), shift


def performer_exponent(
    x: torch.Tensor, name: str, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, c) with phi(x) = exp(a + c): a (..., F) depends on the feature, c (..., 1) not.

    Choromanski et al. 2021 (FAVOR+), Lemma 1, x' = x d^(-1/4), W (m, d):
      positive:   phi(x) = exp(W x' - |x'|^2/2) / sqrt(m)
                  -> a = W x',           c = -|x'|^2/2 - log(m)/2
      hyperbolic: phi(x) = exp(-|x'|^2/2) / sqrt(2m) [exp(W x'), exp(-W x')]
                  -> a = [W x', -W x'],  c = -|x'|^2/2 - log(2m)/2
    """
    xs = x * x.shape[-1] ** -0.25
    proj = xs @ w.transpose(-2, -1)
    half_sq_norm = 0.5 * (xs * xs).sum(dim=-1, keepdim=True)
    m = w.shape[0]
    if name == "performer-positive":
        return proj, -half_sq_norm - 0.5 * math.log(m)
    return torch.cat([proj, -proj], dim=-1), -half_sq_norm - 0.5 * math.log(2 * m)


def trig_parts(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(body, c) with phi(x) = exp(c) body, not positive.

    Choromanski et al. 2021, sec. 2.3: phi(x) = exp(|x'|^2/2) / sqrt(m) [sin(W x'), cos(W x')]
    -> body = [sin(W x'), cos(W x')], c = |x'|^2/2 - log(m)/2.
    """
    xs = x * x.shape[-1] ** -0.25
    proj = xs @ w.transpose(-2, -1)
    c = 0.5 * (xs * xs).sum(dim=-1, keepdim=True) - 0.5 * math.log(w.shape[0])
    return torch.cat([torch.sin(proj), torch.cos(proj)], dim=-1), c


def plain_features(x: torch.Tensor, name: str, n_pos: int, start: int = 0) -> torch.Tensor:
    """phi(x) for the maps that need no shift: elu, relu, identity, cosformer, taylor."""
    if name == "elu":
        return elu_features(x)
    if name == "relu":
        return torch.relu(x)
    if name == "identity":
        return x
    if name == "cosformer":
        # Qin et al. 2022, eq. 10: cos(pi (i-j)/(2M)) = cos(a_i) cos(a_j) + sin(a_i) sin(a_j)
        # with a_i = pi i / (2M), so phi(x_i) = [relu(x_i) cos(a_i), relu(x_i) sin(a_i)].
        n = x.shape[-2]
        positions = torch.arange(start, start + n, device=x.device, dtype=x.dtype)
        angle = positions * (math.pi / (2 * n_pos))
        r = torch.relu(x)
        return torch.cat([r * torch.cos(angle)[:, None], r * torch.sin(angle)[:, None]], dim=-1)
    if name == "taylor":
        # Arora et al. 2024 (Based): phi(x) = [1, x', vec(x' x'^T) / sqrt(2)], x' = x d^(-1/4),
        # so phi(q).phi(k) = 1 + s + s^2/2 with s = q'.k' = q.k / sqrt(d).
        xs = x * x.shape[-1] ** -0.25
        outer = (xs.unsqueeze(-1) * xs.unsqueeze(-2)).flatten(-2) * 0.5**0.5
        return torch.cat([torch.ones_like(xs[..., :1]), xs, outer], dim=-1)
    raise SpecError(f"feature map {name!r} has no plain feature expansion")  # pragma: no cover


def records_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records operations on these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def elu_features(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1 = exp(min(x, 0)) + max(x, 0) (Katharopoulos et al. 2020, eq. 7): x + 1 or
    exp(x), with no cancellation, for x >= ELU_SHIFT_BELOW. On the CPU in float32 without
    autograd from native.c (one pass, about one unit in the last place); elsewhere in
    torch (in place when no gradient is recorded). The golden implementation has its own
    (golden_features.py)."""
    recording = records_grad(x)
    if not recording and native.usable(x) and x.dim() >= 2 and x.numel():
        out = torch.empty(x.shape, dtype=x.dtype)
        rows = (-1, *x.shape[-2:])
        if native.elu_features(x.reshape(rows), out.view(rows), native.DOMAIN_MIN):
            return out
    if recording:
        return exp(torch.clamp(x, max=0.0)) + torch.relu(x)
    return exp(torch.clamp(x, max=0.0)).add_(torch.relu(x))


def add_shifts(shift_q: torch.Tensor | None, shift_k: torch.Tensor | None) -> torch.Tensor | None:
    """Total log-scale of sim_ij: query shift (per row) plus key shift (per (b, h))."""
    if shift_q is None:
        return shift_k
    if shift_k is None:
        return shift_q
    return shift_q + shift_k


def scaled_eps(eps: float, shift: torch.Tensor | None) -> torch.Tensor | float:
    """eps in the units of the shifted sums: eps exp(-shift), formed as one exp.

    If eps exp(-shift) overflows, the similarities are negligible next to eps (their sum
    is below eps times the smallest positive number) and the output is num / inf = 0.
    """
    if eps == 0.0:
        return 0.0
    if shift is None:
        return eps
    return torch.exp(math.log(eps) - shift)
