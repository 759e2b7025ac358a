"""The SSD layer's built-in forms: recurrent and chunked.

Per batch b and head h, S_0 the initial state (d, dv) or 0 (reference.py's definition; Dao &
Gu 2024, the SSD layer), with dt_t = clamp(softplus(dt'_t + dt_bias), dt_min, dt_max)
(without softplus: of dt'_t + dt_bias) and a_t = dt_t A:

- recurrent: token by token, vectorised over B and H: S <- exp(a_t) S + B_t (dt_t x_t)^T,
  y_t = S^T C_t + D x_t, times silu(z_t) with z;
- chunked: the SSD algorithm (Dao & Gu 2024, sec. 6, "Hardware-efficient algorithm for
  SSD"): chunks of C tokens (the last one ragged), G the chunk's inclusive prefix sums of a,
  L_tj = exp(G_t - G_j) for j <= t (0 above the diagonal), X = dt . x:
      Y = (C B^T . L) X + (exp(G) . C) S,    S <- exp(G_C) S + (exp(G_C - G) . B)^T X,
  then y = (Y + D x) . silu(z) (without z: Y + D x).

float16/bfloat16/float32 inputs are computed in float32 and float64 in float64; the output
has the inputs' dtype and device, the final state the compute dtype. C and B may have G
heads dividing x's H (head h reads group h // (H / G)). A packed batch (cu_seqlens, the
FlashAttention convention) is each sequence by itself, its states one per sequence.
"""

from __future__ import annotations

import torch

from ...implementations.recurrence import run_sequences
from ...specs import Spec, SpecError
from ..delta.forms import grouped
from .inputs import SCALARS

SSD_FORMS = ("recurrent", "chunked")


def ssd_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    packed: torch.Tensor | None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y (B, H, N, dv) in x's dtype, S after the last token (B, H, d, dv) in the compute
    dtype) of the SSD `spec` in `form` (SSD_FORMS); q, k, v are C, B, x (checked by the
    caller) and `packed` the pack (inputs.pack_ssd) on x's heads."""
    if form not in SSD_FORMS:
        raise SpecError(f"unknown form {form!r} of the SSD layer; forms: {', '.join(SSD_FORMS)}")
    if form == "chunked" and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    want = (*v.shape[:3], SCALARS + v.shape[3] * spec.z_gate)
    if not isinstance(packed, torch.Tensor) or tuple(packed.shape) != want:
        got = tuple(getattr(packed, "shape", ()))
        raise SpecError(f"the SSD layer of {spec} needs its pack {want}, got {got}")
    q, k = grouped(q, k, v)
    if q.shape[1] != v.shape[1] or k.shape[1] != v.shape[1]:
        raise SpecError(f"C and B need G heads dividing x's {v.shape[1]}, got {q.shape[1]}")

    def evaluate(q, k, v, packed, state):
        q, k, v, packed = (t.to(state.dtype) for t in (q, k, v, packed))
        dt = packed[..., 0] + packed[..., 3]
        dt = torch.nn.functional.softplus(dt) if spec.dt_softplus else dt
        dt = dt.clamp(spec.dt_min, spec.dt_max)
        a = dt * packed[..., 1]
        if form == "recurrent":
            y, state = _recurrent(q, k, v * dt[..., None], a, state)
        else:
            y, state = _chunked(q, k, v * dt[..., None], a, state, chunk_size)
        y = y + packed[..., 2:3] * v
        if spec.z_gate:
            y = y * torch.nn.functional.silu(packed[..., SCALARS:])
        return y, state

    return run_sequences(evaluate, q, k, v, (packed,), initial_state, cu_seqlens)


def _recurrent(c, b, x, a, state):
    """Y (B, H, N, dv) without the skip and gate, and S: token by token (x already dt x)."""
    rows = []
    for t in range(c.shape[-2]):
        state = torch.exp(a[..., t, None, None]) * state
        state = state + b[..., t, :, None] * x[..., t, None, :]
        rows.append(c[..., t, None, :] @ state)
    return torch.cat(rows, dim=-2), state


def _chunked(c, b, x, a, state, size: int):
    """Y without the skip and gate, and S: the chunked SSD algorithm (module docstring)."""
    rows = []
    for start in range(0, c.shape[-2], size):
        part = slice(start, start + size)
        cc, bc, xc, ac = c[..., part, :], b[..., part, :], x[..., part, :], a[..., part]
        g = torch.cumsum(ac, -1)
        below = torch.ones(g.shape[-1], g.shape[-1], dtype=torch.bool, device=g.device).tril()
        gap = (g[..., :, None] - g[..., None, :]).masked_fill(~below, float("-inf"))
        inner = (cc @ bc.transpose(-2, -1)) * torch.exp(gap)
        rows.append(inner @ xc + (torch.exp(g)[..., None] * cc) @ state)
        last = g[..., -1:]
        state = torch.exp(last)[..., None] * state
        state = state + (torch.exp(last - g)[..., None] * bc).transpose(-2, -1) @ xc
    return torch.cat(rows, dim=-2), state
