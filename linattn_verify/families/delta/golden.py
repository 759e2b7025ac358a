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

A spec that declares its chunk intermediates stored in the inputs' dtype (Spec.stored,
"input-dtype": fla's chunk kernels) has 16-bit inputs budgeted by golden_delta_stored: the
same rule in chunks of STORED_CHUNK tokens, in float32, rounding to the inputs' dtype what such
a kernel stores between its kernels (and, in the backward, their cotangents), nothing else.
"""

from __future__ import annotations

import torch

from ...specs import Spec, SpecError
from .fields import QK_L2NORM_EPS, STORED
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
    if spec.stored == STORED[0] and q.dtype in (torch.float16, torch.bfloat16):
        return golden_delta_stored(q, k, v, spec, decay, initial_state)
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


# fla's chunk size (BT = 64 in chunk_delta_rule, chunk_gated_delta_rule and chunk_kda): the
# tokens whose intermediates one store holds
STORED_CHUNK = 64


class _Stored(torch.autograd.Function):
    """x as a kernel keeps it in `dtype`: its value rounded once where it is stored
    (`value`), its cotangent rounded alike where the backward rounds it (`cotangent`), each
    else passed on as it is."""

    @staticmethod
    def forward(ctx, x, dtype, value, cotangent):
        ctx.dtype, ctx.cotangent = dtype, cotangent
        return x.to(dtype).to(x.dtype) if value else x.clone()

    @staticmethod
    def backward(ctx, grad):
        rounded = grad.to(ctx.dtype).to(grad.dtype) if ctx.cotangent else grad
        return rounded, None, None, None


def golden_delta_stored(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    decay: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output in the inputs' dtype, S_N in float32) of a 16-bit call under Spec.stored:
    the chunked (UT / WY) form of Yang et al. 2024 (DeltaNet, section 3: the WY representation
    and the UT transform; with gates, Gated DeltaNet section 3.3; channel gates, KDA) in
    float32, with R(x) = x rounded to the
    inputs' dtype wherever a chunk kernel stores x between kernels. Per chunk of C =
    STORED_CHUNK tokens (rows t, j), from the state S carried in float32, G the cumulative
    log-gates inside the chunk (per channel, or one per token; 0 without gates):

        L_tj = sum_m k_tm k_jm exp(G_tm - G_jm) (j < t),   T = R((I + diag(beta) L)^-1);
        W = R(T diag(beta) (K * exp(G))),   U = R(T diag(beta) V),   H = R(S);
        V' = R(U - W H);   O = c ((Q * exp(G)) H + P V'),
        P_tj = q_t . (k_j * exp(G_t - G_j)) (j <= t);
        S <- diag(exp(G_C)) S + (K * exp(G_C - G))^T V'.

    The stored ones are fla's (fla-core 0.6.0): T by solve_tril(output_dtype=k.dtype)
    (delta_rule/wy_fast.py:223-228, gated_delta_rule/chunk_fwd.py:415); w and u
    (torch.empty_like(k / v), wy_fast.py:258-259); the chunk states h (k.new_empty,
    common/chunk_delta_h.py:719-722) while the state itself stays in float32 registers; the new
    values V' (v_new, chunk_delta_h.py:725, read back rounded for the state's update, :288);
    with qk_l2norm, the normalised q and k (l2norm_fwd, delta_rule/chunk.py:171-172). In
    the backward (autograd through this form) the cotangents of w, u, H, V' and of the
    normalised q, k are rounded too: fla stores dw, du (dv2), dh and dv in the inputs' dtype
    (chunk_delta_h.py:792-796, wy_fast.py:300-302); so are the cotangents of T and of
    diag(beta) L, which its backward rounds to the inputs' dtype before its products with T
    (gated_delta_rule/wy_fast.py:218-219 and 225, delta_rule/wy_fast.py:184-186); the value
    of diag(beta) L is not (chunk_scaled_dot_kkt_fwd's output is float32)."""
    # float32 as the kernels compute; float64 inputs (no call of vet's: the form's own test)
    # stay float64, where every R is exact
    stored = q.dtype
    compute = torch.float64 if stored == torch.float64 else torch.float32

    def kept(x: torch.Tensor, value: bool = True, cotangent: bool = True) -> torch.Tensor:
        return _Stored.apply(x, stored, value, cotangent)

    given = delta_arguments(spec, decay)
    qc, kc, vc = (t.to(dtype=compute) for t in (q, k, v))
    beta = given["beta"].to(device=q.device, dtype=compute)
    if spec.qk_l2norm:
        qc, kc = (
            kept(x / torch.sqrt(torch.sum(x * x, -1, keepdim=True) + QK_L2NORM_EPS))
            for x in (qc, kc)
        )
    b, h, n, d = qc.shape
    logs = torch.zeros(b, h, n, 1, dtype=compute, device=q.device)
    if spec.decay is not None:
        g = given["g"].to(device=q.device, dtype=compute)
        logs = g if spec.decay == "channel-gates" else g[..., None]
    state = torch.zeros(b, h, d, vc.shape[-1], dtype=compute, device=q.device)
    if initial_state is not None:
        if tuple(initial_state.shape) != tuple(state.shape):
            raise SpecError(f"initial_state must have shape {tuple(state.shape)} (B, H, d, dv)")
        state = initial_state.to(device=q.device, dtype=compute)
    pieces = []
    for start in range(0, n, STORED_CHUNK):
        end = min(start + STORED_CHUNK, n)
        qt, kt, vt, bt = (
            qc[:, :, start:end],
            kc[:, :, start:end],
            vc[:, :, start:end],
            beta[:, :, start:end],
        )
        gates = torch.cumsum(logs[:, :, start:end], dim=2)  # (b, h, C, d or 1)
        c = end - start
        rows = torch.arange(c, device=q.device)
        inside = rows[:, None] >= rows[None, :]  # j <= t
        apart = gates[:, :, :, None, :] - gates[:, :, None, :, :]  # G_t - G_j, (b, h, C, C, .)
        strict = torch.exp(
            torch.where((rows[:, None] > rows[None, :])[..., None], apart, -torch.inf)
        )
        within = torch.exp(torch.where(inside[..., None], apart, -torch.inf))
        lower = torch.einsum("bhtm,bhjm,bhtjm->bhtj", kt, kt, strict.expand(-1, -1, -1, -1, d))
        eye = torch.eye(c, dtype=compute, device=q.device)
        system = eye + kept(bt[..., None] * lower, value=False)
        ut = torch.linalg.solve_triangular(
            system, eye.expand(b, h, c, c), upper=False, unitriangular=True
        )
        ut = kept(ut)
        w = kept(ut @ (bt[..., None] * kt * torch.exp(gates)))
        u = kept(ut @ (bt[..., None] * vt))
        chunk_state = kept(state)
        new = kept(u - w @ chunk_state)
        attend = torch.einsum("bhtm,bhjm,bhtjm->bhtj", qt, kt, within.expand(-1, -1, -1, -1, d))
        pieces.append(((qt * torch.exp(gates)) @ chunk_state + attend @ new) * spec.scale_for(d))
        last = gates[:, :, -1:]  # G_C, (b, h, 1, .)
        state = (
            torch.exp(last).transpose(-1, -2) * state
            + (kt * torch.exp(last - gates)).transpose(-1, -2) @ new
        )
    out = torch.cat(pieces, dim=2) if pieces else torch.empty_like(vc)
    return out.to(stored), state
