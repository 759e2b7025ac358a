"""The golden delta rule: the recurrence itself, token by token, the reference point of the
delta rule's budget. It shares no code with the fast forms (delta.py) it budgets.

Per batch b and head h, c = spec.scale_for(d) (families/delta/fields.py, Yang et al. 2024, eq. 1-2;
Gated DeltaNet, eq. 10; KDA, eq. 1):

    S <- A_t S with A_t = exp(g_t) (gates) or diag(exp(g_t)) (channel gates), or S;
    S <- S + beta_t k_t (v_t - S^T k_t)^T;    o_t = c (S^T q_t),

from S = 0 (or a given S_0); q and k first x / sqrt(|x|^2 + QK_L2NORM_EPS) with
qk_l2norm. float16/bfloat16/float32 inputs are computed in float32, float64 in float64: the
state never leaves the compute dtype, and the output is rounded once, to the inputs'
dtype, at the end.
"""

from __future__ import annotations

import torch

from ...specs import Spec, SpecError
from .fields import QK_L2NORM_EPS
from .inputs import delta_arguments, validate_delta

GOLDEN_DELTA_FORMS: tuple[str, ...] = ("recurrent",)


def golden_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    projection: object = None,
    form: str = "recurrent",
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """The delta-rule `spec`'s output (B, H, N, dv) in the inputs' dtype and device; decay
    is beta with its gates packed (inputs.pack_delta). SpecError for bad inputs."""
    return golden_delta_with_state(q, k, v, spec, decay, form=form, projection=projection)[0]


def golden_delta_with_state(
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
    dtype (float32 for float16, bfloat16 and float32 inputs: as a kernel carries it)."""
    if form not in GOLDEN_DELTA_FORMS:
        raise SpecError(f"the delta rule's golden form is 'recurrent', not {form!r}")
    validate_delta(q, k, v, spec, projection, decay)  # shapes, dtypes, finite values, beta, g
    for name, t in (("q", q), ("k", k), ("v", v), ("decay", decay)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise SpecError("q, k, v must share one dtype and one device")
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    given = delta_arguments(spec, decay)
    qc, kc, vc = (t.to(device=q.device, dtype=compute) for t in (q, k, v))
    beta = given["beta"].to(device=q.device, dtype=compute)
    if spec.qk_l2norm:
        qc, kc = (
            x / torch.sqrt(torch.sum(x * x, -1, keepdim=True) + QK_L2NORM_EPS) for x in (qc, kc)
        )
    b, h, n, d = qc.shape
    factors = None  # A_t's diagonal, (B, H, N, d) or (B, H, N, 1)
    if spec.decay is not None:
        g = given["g"].to(device=q.device, dtype=compute)
        factors = torch.exp(g if spec.decay == "channel-gates" else g[..., None])
    state = torch.zeros(b, h, d, vc.shape[-1], dtype=compute, device=q.device)
    if initial_state is not None:
        if tuple(initial_state.shape) != tuple(state.shape):
            raise SpecError(f"initial_state must have shape {tuple(state.shape)} (B, H, d, dv)")
        state = initial_state.to(device=q.device, dtype=compute)
    out = torch.empty_like(vc)
    for t in range(n):
        if factors is not None:
            state = factors[:, :, t, :, None] * state
        key = kc[:, :, t]
        error = vc[:, :, t] - torch.einsum("bhm,bhmc->bhc", key, state)
        state = state + torch.einsum("bhm,bhc->bhmc", key, beta[:, :, t, None] * error)
        out[:, :, t] = torch.einsum("bhm,bhmc->bhc", qc[:, :, t], state) * spec.scale_for(d)
    return out.to(q.dtype), state
