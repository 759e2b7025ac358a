"""The SSD layer's inputs in the suite's contract, their validation and the draws of a case.

The mapping (docs/ssd.md, "The mapping"): the suite's q, k, v (B, H, N, d | dv) are SSD's C,
B and x (mamba_ssm's (B, T, G, N), (B, T, G, N), (B, T, H, P) are the layout bnhd, --layout
bnhd; d = N the state size, dv = P the head dimension); C and B may have G heads that divide x's H
(ngroups: head h reads group h // (H / G)). Beside them a kernel takes dt (B, H, N), A, D,
dt_bias (H,) and, with Spec.z_gate, z (B, H, N, dv). They travel through the checks as one
per-token tensor (pack_ssd: (B, H, N, 4 [+ dv]), token axis 2, the last axis [dt, A, D,
dt_bias, z]), A, D and dt_bias repeated over batch and tokens; validate_ssd refuses a pack
where they vary.

The draws, as Mamba-2 initialises and feeds them (Dao & Gu 2024, the reference code's
Mamba2 module): A = -U(1, 16) per head, dt_bias = softplus^-1 of dt drawn log-uniform in
[0.001, 0.1], D ~ U(0.5, 1.5), the raw dt (a projection's output) N(0, 1/4) per token, z
N(0, 1). Without dt_softplus the kernel is handed dt already positive: dt' = softplus(raw +
that bias) and dt_bias ~ U(0, 0.001) (the bias is still added, as mamba_ssm adds it). A, D
and dt_bias are drawn per head from a fixed seed (HEAD_SEED), the same in every case of a
head count, so that a check that joins the tokens or rows of two cases (causality,
packed batches) joins consistent packs; dt and z come from the case's seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ...cases import Case
from ...inputs import AttentionInputs, as_float64, exact_tensors
from ...specs import Spec, SpecError

_F64 = {"dtype": torch.float64}
SEED_SALT = 5  # the draws of dt and z: their own generator, seed * 7919 + SEED_SALT
HEAD_SEED = 2024  # A, D and dt_bias: one generator for every case (module docstring)
SCALARS = 4  # dt, A, D, dt_bias ahead of z on the packed last axis
DT_RANGE = (0.001, 0.1)  # Mamba-2's dt_min, dt_max: dt_bias's draw


def pack_ssd(dt: Any, a: Any, d: Any, dt_bias: Any, z: Any = None) -> torch.Tensor:
    """dt (B, H, N), A, D, dt_bias (H,) and z (B, H, N, dv) or None as one (B, H, N, 4 [+
    dv]) tensor."""
    heads = [t.reshape(1, -1, 1, 1).expand(*dt.shape, 1) for t in (a, d, dt_bias)]
    return torch.cat([dt[..., None], *heads, *([] if z is None else [z])], -1)


def ssd_arguments(spec: Spec, packed: Any, head_axis: int = 1) -> dict[str, Any]:
    """The keywords dt, A, D, dt_bias (and z with Spec.z_gate) from pack_ssd's tensor or
    array, whose head axis is 1 ((B, H, N, 4 [+ dv])) or 2 ((B, N, H, 4 [+ dv]))."""
    if getattr(packed, "ndim", None) != 4 or (packed.shape[-1] > SCALARS) != spec.z_gate:
        got = tuple(getattr(packed, "shape", ()))
        raise SpecError(f"{spec} takes {' and '.join(names(spec))} packed: pack_ssd, got {got}")
    first = packed[0, :, 0] if head_axis == 1 else packed[0, 0]
    given = {"dt": packed[..., 0], "A": first[:, 1], "D": first[:, 2], "dt_bias": first[:, 3]}
    return given | ({"z": packed[..., SCALARS:]} if spec.z_gate else {})


def names(spec: Spec) -> tuple[str, ...]:
    """The keywords a kernel of `spec` takes beside C, B and x."""
    return ("dt", "A", "D", "dt_bias", *("z",) * spec.z_gate)


def width(spec: Spec, dv: int) -> int:
    """The pack's last axis: 4, and dv more with z."""
    return SCALARS + dv * spec.z_gate


def grouped(q: np.ndarray, k: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray]:
    """C and B of G groups repeated to `heads` heads (head h reads group h // (heads / G));
    SpecError unless G divides heads."""
    groups = q.shape[1]
    if k.shape[1] != groups or heads % max(groups, 1):
        raise SpecError(f"C and B need G heads dividing x's {heads}, got {groups} and {k.shape[1]}")
    return np.repeat(q, heads // groups, 1), np.repeat(k, heads // groups, 1)


def validate_ssd(
    q: Any, k: Any, v: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> AttentionInputs:
    """inputs.validate for the SSD layer: `decay` is pack_ssd's tensor, carried as
    AttentionInputs.beta (B, H, N, 4 + dv), sliced by token as beta is; C and B of G groups
    repeated to x's heads."""
    if projection is not None:
        raise SpecError(f"{spec} takes no projection")
    if decay is None:
        raise SpecError(f"{spec} needs {' and '.join(names(spec))} (pack_ssd)")
    qa, _ = as_float64(q, "q (C)")
    ka, _ = as_float64(k, "k (B)")
    va, _ = as_float64(v, "v (x)")
    if qa.ndim == 4 and va.ndim == 4 and qa.shape[1] != va.shape[1]:
        qa, ka = grouped(qa, ka, va.shape[1])
        q, k = (torch.from_numpy(t).to(q.dtype) if torch.is_tensor(q) else t for t in (qa, ka))
    x = exact_tensors(q, k, v, spec)
    packed, _ = as_float64(decay, " and ".join(names(spec)))
    want = (*x.q.shape[:3], width(spec, x.v.shape[3]))
    if packed.shape != want:
        raise SpecError(f"{spec} takes {', '.join(names(spec))} packed {want}, got {packed.shape}")
    heads = packed[..., 1:SCALARS]
    if packed.size and not np.array_equal(heads, np.broadcast_to(heads[:1, :, :1], heads.shape)):
        raise SpecError(f"{spec}: A, D and dt_bias vary over batch or tokens (one per head)")
    if not np.isfinite(packed).all():
        raise SpecError(f"{spec}: {' or '.join(names(spec))} has a non-finite value")
    return AttentionInputs(x.q, x.k, x.v, None, x.dtype, None, packed)


def head_parameters(heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A, D, dt_bias (softplus^-1 of a dt) and a small bias (H,) float64, drawn from
    HEAD_SEED (module docstring)."""
    gen = torch.Generator().manual_seed(HEAD_SEED)
    a = -(1 + 15 * torch.rand(heads, generator=gen, **_F64))
    d = 0.5 + torch.rand(heads, generator=gen, **_F64)
    low, high = (math.log(t) for t in DT_RANGE)
    dt = torch.exp(low + (high - low) * torch.rand(heads, generator=gen, **_F64))
    small = DT_RANGE[0] * torch.rand(heads, generator=gen, **_F64)
    return a, d, dt + torch.log(-torch.expm1(-dt)), small


def draw(spec: Spec, b: int, h: int, n: int, dv: int, seed: int) -> torch.Tensor:
    """pack_ssd's tensor of `spec` in float64 (module docstring)."""
    gen = torch.Generator().manual_seed(seed * 7919 + SEED_SALT)
    dt = torch.randn(b, h, n, generator=gen, **_F64) / 2
    z = torch.randn(b, h, n, dv, generator=gen, **_F64)
    a, d, bias, small = head_parameters(h)
    if not spec.dt_softplus:  # dt handed over positive, a small bias still added
        dt, bias = torch.nn.functional.softplus(dt + bias[:, None]), small
    return pack_ssd(dt, a, d, bias, z if spec.z_gate else None)


def case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    """(C, B, x, None, the pack) of a case, all rounded once to the case's dtype."""
    q, k, v = case.tensors()[:3]
    (packed,) = case.rounded(draw(spec, case.b, case.h, case.n, case.dv, case.seed))
    return q, k, v, None, packed


def long_arguments(spec: Spec, k: torch.Tensor, rates: torch.Tensor, seed: int, dtype: Any):
    """The long-context check's keys as given and the pack drawn as the typical cases'."""
    b, h, n, _ = k.shape
    return k, draw(spec, b, h, n, k.shape[-1], seed).to(k.dtype)


def default_arguments(spec: Spec, q: torch.Tensor) -> torch.Tensor:
    """The pack of inputs from no case (the scaling runs): the typical draws at seed 0, z
    as wide as q's head dimension (the scaling runs take dv = d)."""
    b, h, n, d = q.shape
    return draw(spec, b, h, n, d, 0).to(device=q.device, dtype=q.dtype)
