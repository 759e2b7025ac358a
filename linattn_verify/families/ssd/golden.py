"""The golden SSD layer: the recurrence itself, token by token, the reference point of the
SSD budget. It shares no code with the built-in forms (forms.py) it budgets.

Per batch b and head h (reference.py's definition; Dao & Gu 2024, the SSD layer):

    dt = clamp(softplus(dt' + dt_bias) [or dt' + dt_bias], dt_min, dt_max);
    S <- exp(dt A) S + dt B_t x_t^T;   y_t = (S^T C_t + D x_t) [* silu(z_t)],

from S = 0 (or a given S_0). float16/bfloat16/float32 inputs are computed in float32, float64
in float64: the state never leaves the compute dtype (mamba_ssm keeps its chunk states in
float32), and the output is rounded once, to the inputs' dtype, at the end.
"""

from __future__ import annotations

import torch

from ...specs import Spec, SpecError
from .inputs import ssd_arguments, validate_ssd

GOLDEN_SSD_FORMS: tuple[str, ...] = ("recurrent",)


def golden_ssd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    projection: object = None,
    form: str = "recurrent",
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """The SSD `spec`'s output (B, H, N, dv) in the inputs' dtype and device; q, k, v are C,
    B, x and decay the pack (inputs.pack_ssd). SpecError for bad inputs."""
    return golden_ssd_with_state(q, k, v, spec, decay, form=form, projection=projection)[0]


def golden_ssd_with_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    decay: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    form: str = "recurrent",
    projection: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, S_N (B, H, d, dv)) from S = initial_state (None: 0), S_N in the compute
    dtype (float32 for float16, bfloat16 and float32 inputs)."""
    if form not in GOLDEN_SSD_FORMS:
        raise SpecError(f"the SSD layer's golden form is 'recurrent', not {form!r}")
    validate_ssd(q, k, v, spec, projection, decay)  # shapes, finite values, the pack
    if not (q.dtype == k.dtype == v.dtype == decay.dtype):
        raise SpecError("C, B, x and the pack must share one dtype")
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    given = {
        name: t.to(device=q.device, dtype=compute) for name, t in ssd_arguments(spec, decay).items()
    }
    groups = v.shape[1] // q.shape[1]
    cc, bc = (t.to(device=q.device, dtype=compute).repeat_interleave(groups, 1) for t in (q, k))
    xc = v.to(device=q.device, dtype=compute)
    batch, heads, n, d = cc.shape
    state = torch.zeros(batch, heads, d, xc.shape[-1], dtype=compute, device=q.device)
    if initial_state is not None:
        if tuple(initial_state.shape) != tuple(state.shape):
            raise SpecError(f"initial_state must have shape {tuple(state.shape)} (B, H, d, dv)")
        state = initial_state.to(device=q.device, dtype=compute)
    dt = given["dt"] + given["dt_bias"][:, None]
    if spec.dt_softplus:
        dt = torch.nn.functional.softplus(dt)
    dt = dt.clamp(spec.dt_min, spec.dt_max)
    a, skip = given["A"][:, None], given["D"][:, None]
    out = torch.empty_like(xc)
    for t in range(n):
        step = dt[:, :, t, None, None]
        state = torch.exp(step * a[..., None]) * state
        state = state + step * torch.einsum("bhm,bhc->bhmc", bc[:, :, t], xc[:, :, t])
        y = torch.einsum("bhm,bhmc->bhc", cc[:, :, t], state) + skip * xc[:, :, t]
        out[:, :, t] = y * torch.nn.functional.silu(given["z"][:, :, t]) if spec.z_gate else y
    return out.to(q.dtype), state
