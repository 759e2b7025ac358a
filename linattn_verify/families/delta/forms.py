"""The delta rule's built-in forms (DeltaNet, Gated DeltaNet, KDA): recurrent and chunked.

Per batch b and head h, c = spec.scale_for(d), S_0 the initial state (d, dv) or 0
(families/delta/fields.py):

    S_t = (I - beta_t k_t k_t^T) D_t S_(t-1) + beta_t k_t v_t^T,    o_t = c S_t^T q_t,

D_t = I without a decay, exp(g_t) I for "gates", diag(exp(g_t)) for "channel-gates"; with
qk_l2norm, q and k are first x / sqrt(|x|^2 + QK_L2NORM_EPS).

- recurrent: token by token, vectorised over B and H: S <- D_t S, u_t = beta_t (v_t -
  S^T k_t), S <- S + k_t u_t^T, o_t = S^T (c q_t);
- chunked: chunks of C tokens (the last one ragged) in the WY / UT form (Yang et al. 2024,
  DeltaNet, sec. 3; with decays Yang, Kautz, Hatamizadeh 2025, Gated DeltaNet, sec. 3.3,
  eq. 10's chunkwise form, per key channel for KDA). With G_i = g_1 + ... + g_i the chunk's
  prefix sums (per key channel; none without a decay), kept in log space in the compute
  dtype, and E_ij = exp(G_i - G_j) formed for j <= i only (every factor <= 1):

      L = tril(diag(beta) (K K^T . E), -1)          (channel gates: sum_m k_im k_jm E_ijm)
      [U | W] = (I + L)^-1 diag(beta) [V | exp(G) . K]
      U <- U - W S,    O = (exp(G) . cQ) S + tril(cQ K^T . E) U,
      S <- exp(G_C) . S + (exp(G_C - G) . K)^T U,

  S the state entering the chunk (row m of S scaled by exp(G_Cm)); the unit lower
  triangular system solved by forward substitution (torch.linalg.solve_triangular, no
  inverse formed), the channel gates' factors E in blocks (SUB_CHUNK).

float16/bfloat16/float32 inputs are computed in float32 and float64 in float64; the output
has the inputs' dtype and device, the final state the compute dtype. A packed batch
(cu_seqlens, the FlashAttention convention) is each sequence by itself, its states one per
sequence (S_count, H, d, dv), as fla's kernels take them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...implementations.recurrence import run_sequences
from ...specs import Spec, SpecError
from ..decayed.values import check_decay
from .fields import QK_L2NORM_EPS

DELTA_FORMS = ("recurrent", "chunked")
# Channel gates' factors exp(G_im - G_jm) are materialised in diagonal blocks of SUB_CHUNK
# tokens only; a block's earlier keys enter through one matmul, both sides scaled to the
# key just before the block, r: exp(G_i - G_r) exp(G_r - G_j), each factor <= 1 (Yang et
# al. 2024, GLA, sec. 4.2's secondary chunking): (C / SUB_CHUNK) times less memory and work
SUB_CHUNK = 16


def delta_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    beta: torch.Tensor | None,
    g: torch.Tensor | None = None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, dv) in q's dtype, the state S after the last token (B, H, d, dv) in
    the compute dtype) of the delta-rule `spec` in `form` (DELTA_FORMS), from initial_state
    (None: 0). q, k, v checked by the caller (forms.check_tensors, check_finite); beta
    (B, H, N), g (B, H, N) or (B, H, N, d) as the spec's decay. With cu_seqlens (B = 1),
    each sequence by itself, initial_state and the state returned (S_count, H, d, dv)."""
    if form not in DELTA_FORMS:
        raise SpecError(f"unknown form {form!r} of the delta rule; forms: {', '.join(DELTA_FORMS)}")
    if form == "chunked" and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    _check_beta(beta, q)
    check_decay(g, spec, tuple(q.shape))
    if g is not None and (not isinstance(g, torch.Tensor) or g.device != q.device):
        raise SpecError(f"g must be a torch tensor on q's device, {q.device}")

    def evaluate(q, k, v, beta, g, state):
        return _evaluate(q, k, v, beta, g, spec, form, chunk_size, state)

    return run_sequences(evaluate, q, k, v, (beta, g), initial_state, cu_seqlens)


def grouped(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Grouped value heads (fla's HV = G H): q and k of H heads where v has G H, repeated so
    that value head hv reads head hv // G; as given otherwise (check_tensors then names a
    mismatch)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return q, k
    h, hv = q.shape[1], v.shape[1]
    if h in (0, hv) or k.shape[1] != h or hv % h:
        return q, k
    return q.repeat_interleave(hv // h, dim=1), k.repeat_interleave(hv // h, dim=1)


def _check_beta(beta: object, q: torch.Tensor) -> None:
    """SpecError unless beta is a finite floating tensor (B, H, N) on q's device."""
    want = tuple(q.shape[:3])
    if beta is None:
        raise SpecError(f"the delta rule needs beta {want} (B, H, N)")
    if not isinstance(beta, torch.Tensor) or not beta.is_floating_point():
        raise SpecError(f"beta must be a floating torch tensor, got {type(beta).__name__}")
    if tuple(beta.shape) != want:
        raise SpecError(f"beta must have shape {want} (B, H, N), got {tuple(beta.shape)}")
    if beta.device != q.device:
        raise SpecError(f"beta must be on q's device, {q.device}, not {beta.device}")
    if not bool(torch.isfinite(beta).all()):
        raise SpecError("beta has a non-finite value")


def _evaluate(q, k, v, beta, g, spec: Spec, form: str, chunk_size: int, state):
    """(out, state) of one batch of sequences, in the state's (compute) dtype."""
    dtype = state.dtype
    qc, kc, vc, bc = (t.to(dtype) for t in (q, k, v, beta))
    if spec.qk_l2norm:
        qc, kc = (x * torch.rsqrt((x * x).sum(-1, keepdim=True) + QK_L2NORM_EPS) for x in (qc, kc))
    qc = qc * spec.scale_for(q.shape[-1])
    logs = None  # ln of D_t's diagonal, (B, H, N, 1) for gates, (B, H, N, d) per channel
    if g is not None:
        logs = g.to(dtype) if spec.decay == "channel-gates" else g.to(dtype)[..., None]
    if form == "recurrent":
        return _recurrent(qc, kc, vc, bc, logs, state)
    return _chunked(qc, kc, vc, bc, logs, state, chunk_size)


def _recurrent(q, k, v, beta, logs, state):
    """Token by token (the module docstring); q already scaled by c."""
    rows = []
    for t in range(q.shape[-2]):
        if logs is not None:
            state = state * torch.exp(logs[..., t, :, None])
        key = k[..., t : t + 1, :]  # (B, H, 1, d)
        u = beta[..., t, None, None] * (v[..., t : t + 1, :] - key @ state)
        state = state + key.transpose(-2, -1) @ u
        rows.append(q[..., t : t + 1, :] @ state)
    return torch.cat(rows, dim=-2), state


def _chunked(q, k, v, beta, logs, state, size: int):
    """Chunks of `size` tokens in the WY / UT form (the module docstring); q scaled by c."""
    dv, rows = v.shape[-1], []
    for start in range(0, q.shape[-2], size):
        part = slice(start, start + size)
        qc, kc, vc, bc = q[..., part, :], k[..., part, :], v[..., part, :], beta[..., part, None]
        prefix = None if logs is None else torch.cumsum(logs[..., part, :], dim=-2)
        gram, inner = _products(torch.stack([kc, qc]), kc, prefix)
        lower = gram.tril(-1) * bc  # L, its diagonal unread
        heads = kc if prefix is None else kc * torch.exp(prefix)
        rhs = bc * torch.cat([vc, heads], dim=-1)
        solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        u = solved[..., :dv] - solved[..., dv:] @ state
        entering = qc if prefix is None else qc * torch.exp(prefix)
        rows.append(entering @ state + inner @ u)
        if prefix is None:
            state = state + kc.transpose(-2, -1) @ u
        else:
            last = prefix[..., -1:, :]  # G_C, (B, H, 1, 1 or d)
            tails = kc * torch.exp(last - prefix)
            state = state * torch.exp(last).transpose(-2, -1) + tails.transpose(-2, -1) @ u
    return torch.cat(rows, dim=-2), state


def _ratios(prefix: torch.Tensor) -> torch.Tensor:
    """E_ijm = exp(G_im - G_jm) for j <= i, 0 above (B, H, C, C, 1 or d): the differences
    masked before exp, so that no factor overflows."""
    n = prefix.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool, device=prefix.device).tril()[..., None]
    logs = prefix[..., :, None, :] - prefix[..., None, :, :]
    return torch.exp(logs.masked_fill(~keep, -math.inf))


def _products(x: torch.Tensor, k: torch.Tensor, prefix: torch.Tensor | None) -> torch.Tensor:
    """sum_m x_im k_jm exp(G_im - G_jm) for j <= i, 0 above (..., B, H, C, C), G the chunk's
    prefix sums (B, H, C, 1 or d); x_i . k_j without a decay. x: (..., B, H, C, d), rows
    of several products at once (the factors formed once for all)."""
    if prefix is None:
        return (x @ k.transpose(-2, -1)).tril()
    if prefix.shape[-1] == 1:
        return (x @ k.transpose(-2, -1)) * _ratios(prefix)[..., 0]
    n = x.shape[-2]
    out = x.new_zeros(*x.shape[:-1], n)
    for start in range(0, n, SUB_CHUNK):
        rows = slice(start, start + SUB_CHUNK)
        here = prefix[..., rows, :]
        if start:  # the keys before the block through r = start - 1: two factors <= 1
            ref = prefix[..., start - 1 : start, :]
            left = x[..., rows, :] * torch.exp(here - ref)
            right = k[..., :start, :] * torch.exp(ref - prefix[..., :start, :])
            out[..., rows, :start] = left @ right.transpose(-2, -1)
        terms = x[..., rows, None, :] * (k[..., None, rows, :] * _ratios(here))
        out[..., rows, rows] = terms.sum(dim=-1)
    return out
