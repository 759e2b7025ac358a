"""The golden IPLR rule: the recurrence itself, token by token, the reference point of the
IPLR budget. It shares no code with the built-in forms (forms.py) it budgets.

Per batch b and head h, c = spec.scale_for(d) (reference.py's definition; fla's
iplr/naive.py, iplr_recurrence):

    S <- S + b_t (a_t^T S) + k_t v_t^T;    o_t = c (S^T q_t),

from S = 0 (or a given S_0). float16/bfloat16/float32 inputs are computed in float32, float64
in float64: the state never leaves the compute dtype, and the output is rounded once, to the
inputs' dtype, at the end.
"""

from __future__ import annotations

import torch

from ...specs import Spec, SpecError
from .inputs import iplr_arguments, validate_iplr

GOLDEN_IPLR_FORMS: tuple[str, ...] = ("recurrent",)


def golden_iplr(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    projection: object = None,
    form: str = "recurrent",
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """The IPLR `spec`'s output (B, H, N, dv) in the inputs' dtype and device; decay is a and
    b packed (inputs.pack_iplr). SpecError for bad inputs."""
    return golden_iplr_with_state(q, k, v, spec, decay, form=form, projection=projection)[0]


def golden_iplr_with_state(
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
    if form not in GOLDEN_IPLR_FORMS:
        raise SpecError(f"the IPLR rule's golden form is 'recurrent', not {form!r}")
    validate_iplr(q, k, v, spec, projection, decay)  # shapes, finite values, a and b
    for name, t in (("q", q), ("k", k), ("v", v), ("decay", decay)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise SpecError("q, k, v must share one dtype and one device")
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    given = iplr_arguments(spec, decay)
    qc, kc, vc = (t.to(device=q.device, dtype=compute) for t in (q, k, v))
    a, b = (given[name].to(device=q.device, dtype=compute) for name in ("a", "b"))
    batch, heads, n, d = qc.shape
    state = torch.zeros(batch, heads, d, vc.shape[-1], dtype=compute, device=q.device)
    if initial_state is not None:
        if tuple(initial_state.shape) != tuple(state.shape):
            raise SpecError(f"initial_state must have shape {tuple(state.shape)} (B, H, d, dv)")
        state = initial_state.to(device=q.device, dtype=compute)
    out = torch.empty_like(vc)
    for t in range(n):
        removed = torch.einsum("bhm,bhmc->bhc", a[:, :, t], state)  # a_t^T S_(t-1)
        low_rank = torch.einsum("bhm,bhc->bhmc", b[:, :, t], removed)
        state = state + low_rank + torch.einsum("bhm,bhc->bhmc", kc[:, :, t], vc[:, :, t])
        out[:, :, t] = torch.einsum("bhm,bhmc->bhc", qc[:, :, t], state) * spec.scale_for(d)
    return out.to(q.dtype), state
