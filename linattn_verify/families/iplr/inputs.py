"""The identity-plus-low-rank (IPLR) rule's inputs: a and b (B, H, N, d) packed as the one
per-token argument the checks carry (pack_iplr: (B, H, N, 2 d), token axis 2), their
validation, and the draws of a case.

The draws. The transition is I + b_t a_t^T (family.py's formula). Typical inputs are what a
model hands the kernel: RWKV-7's "in-context learning rate" form (Peng et al. 2025, "RWKV-7
Goose", eq. 4-5, without its diagonal decay: the IPLR special case of its DPLR transition)
a_t = -kappa_t, b_t = alpha_t . kappa_t, kappa_t a unit "removal key" and alpha_t ~ U(0, 1)
per channel, so that I + b a^T = I - (alpha . kappa) kappa^T: DeltaNet's I - beta k k^T when
alpha is one number, non-expansive up to the non-normality alpha's spread gives it. kappa is
drawn apart from the key k (k enters the injected k v^T as the case draws it), and a is not
parallel to b: a kernel that swaps a and b, or a and k, computes another thing. The stress
kinds reuse the delta rule's names (delta/inputs.DELTA_KINDS, regime stress), with their meaning
carried over: beta-near-two (alpha in (2 - 2^-4, 2): nearly a reflection, no contraction),
long-keys (|a| and |b| each exp(U(-1, 1)): the transition expands by up to 1 + |a| |b|),
parallel-keys (kappa_t = kappa_0 + 10^-3 N(0, 1), normalised: the chunk form's unit
triangular system I - tril(A B^T, -1) is ill-conditioned).
"""

from __future__ import annotations

from typing import Any

import torch

from ...cases import Case
from ...inputs import AttentionInputs, as_float64, exact_tensors
from ...specs import Spec, SpecError

_F64 = {"dtype": torch.float64}
SEED_SALT = 3  # the draws of a and b: their own generator, seed * 7919 + SEED_SALT
PARALLEL_SPREAD = 1e-3  # parallel-keys: kappa_t = kappa_0 + PARALLEL_SPREAD N(0, 1)


def pack_iplr(a: Any, b: Any) -> Any:
    """a and b (B, H, N, d) side by side along the last axis, (B, H, N, 2 d) (torch tensors),
    so that slicing tokens slices both."""
    return torch.cat([a, b], -1)


def iplr_arguments(spec: Spec, packed: Any) -> dict[str, Any]:
    """The keywords a= and b= from pack_iplr's packed tensor or array, in its layout
    ((B, H, N, 2 d) or (B, N, H, 2 d))."""
    if getattr(packed, "ndim", None) != 4 or packed.shape[-1] % 2:
        got = tuple(getattr(packed, "shape", ()))
        raise SpecError(f"{spec} takes a and b packed (B, H, N, 2 d): pack_iplr, got {got}")
    d = packed.shape[-1] // 2
    return {"a": packed[..., :d], "b": packed[..., d:]}


def validate_iplr(
    q: Any, k: Any, v: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> AttentionInputs:
    """inputs.validate for the IPLR rule: `decay` is a and b packed (pack_iplr); they are
    carried as AttentionInputs.beta (B, H, N, 2 d), sliced by token as beta is."""
    if projection is not None:
        raise SpecError(f"{spec} takes no projection")
    x = exact_tensors(q, k, v, spec)
    if decay is None:
        raise SpecError(f"{spec} needs a and b (B, H, N, d)")
    packed, _ = as_float64(decay, "a and b")
    want = (*x.q.shape[:3], 2 * x.q.shape[3])
    if packed.shape != want:
        raise SpecError(f"{spec} takes a and b packed {want} (B, H, N, 2 d), got {packed.shape}")
    return AttentionInputs(x.q, x.k, x.v, None, x.dtype, None, packed)


def _directions(shape: tuple[int, ...], kind: str, gen: torch.Generator) -> torch.Tensor:
    """Unit removal keys kappa (B, H, N, d) of `kind` (module docstring)."""
    kappa = torch.randn(shape, generator=gen, **_F64)
    if kind == "parallel-keys":
        kappa = kappa[..., :1, :] + PARALLEL_SPREAD * torch.randn(shape, generator=gen, **_F64)
    return kappa / kappa.norm(dim=-1, keepdim=True).clamp(min=1e-300)


def draw_ab(shape: tuple[int, ...], kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) float64 (B, H, N, d) of a case of `kind` (module docstring), from `seed`."""
    gen = torch.Generator().manual_seed(seed * 7919 + SEED_SALT)
    kappa = _directions(shape, kind, gen)
    alpha = torch.rand(shape, generator=gen, **_F64)
    if kind == "beta-near-two":
        alpha = 2 - alpha / 16
    a, b = -kappa, alpha * kappa
    if kind == "long-keys":  # independent norms exp(U(-1, 1)) for a and b
        a = a * torch.exp(2 * torch.rand(shape[:-1], generator=gen, **_F64) - 1)[..., None]
        b = b * torch.exp(2 * torch.rand(shape[:-1], generator=gen, **_F64) - 1)[..., None]
    return a, b


def case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    """(q, k, v, None, a and b packed) of a case: q, k, v as the case draws them, a and b as
    the module docstring says, all rounded once to the case's dtype."""
    q, k, v = case.tensors()[:3]
    a, b = draw_ab((case.b, case.h, case.n, case.d), case.kind, case.seed)
    a, b = case.rounded(a, b)
    return q, k, v, None, pack_iplr(a, b)


def long_arguments(spec: Spec, k: torch.Tensor, rates: torch.Tensor, seed: int, dtype: Any):
    """The long-context check's keys as given and a and b drawn as the typical cases'."""
    a, b = draw_ab(tuple(k.shape), "normal", seed)
    return k, pack_iplr(a.to(k.dtype), b.to(k.dtype))


def default_arguments(spec: Spec, q: torch.Tensor) -> torch.Tensor:
    """The argument of inputs that come from no case (the scaling runs): a = -e, b = e / 2,
    e = (1, ..., 1) / sqrt(d), every token: I - e e^T / 2, non-expansive."""
    unit = torch.full(q.shape, q.shape[-1] ** -0.5, dtype=q.dtype, device=q.device)
    return pack_iplr(-unit, unit / 2)
