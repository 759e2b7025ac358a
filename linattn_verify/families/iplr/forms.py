"""The IPLR rule's built-in forms: recurrent and chunked.

Per batch b and head h, c = spec.scale_for(d), S_0 the initial state (d, dv) or 0
(reference.py's definition; fla's iplr/naive.py):

    S_t = (I + b_t a_t^T) S_(t-1) + k_t v_t^T,    o_t = c S_t^T q_t.

- recurrent: token by token, vectorised over B and H: w_t = a_t^T S, S <- S + b_t w_t +
  k_t v_t^T, o_t = S^T (c q_t);
- chunked: chunks of C tokens (the last one ragged). With S the state entering the chunk
  and the pseudo-values u_t = a_t^T S_(t-1) (the rows of U), S_(t-1) = S + sum_(j<t)
  (b_j u_j + k_j v_j^T), so
      (I - tril(A B^T, -1)) U = A S + tril(A K^T, -1) V,
      O = (cQ) S + tril(cQ B^T) U + tril(cQ K^T) V,     S <- S + B^T U + K^T V,
  the unit lower triangular system solved by forward substitution
  (torch.linalg.solve_triangular, no inverse formed): the WY / UT form of Yang et al. 2024
  ("Parallelizing linear transformers with the delta rule", sec. 3) for I + b a^T
  transitions, as fla's iplr_chunkwise writes it (there with the inverse formed row by row).

float16/bfloat16/float32 inputs are computed in float32 and float64 in float64; the output
has the inputs' dtype and device, the final state the compute dtype. A packed batch
(cu_seqlens, the FlashAttention convention) is each sequence by itself, its states one per
sequence (S_count, H, d, dv), as fla's kernels take them.
"""

from __future__ import annotations

import torch

from ...implementations.recurrence import run_sequences
from ...specs import Spec, SpecError

IPLR_FORMS = ("recurrent", "chunked")


def iplr_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, dv) in q's dtype, S after the last token (B, H, d, dv) in the compute
    dtype) of the IPLR `spec` in `form` (IPLR_FORMS), from initial_state (None: 0). q, k, v
    checked by the caller; a and b (B, H, N, d). With cu_seqlens (B = 1), each sequence by
    itself, initial_state and the state returned (S_count, H, d, dv)."""
    if form not in IPLR_FORMS:
        raise SpecError(f"unknown form {form!r} of the IPLR rule; forms: {', '.join(IPLR_FORMS)}")
    if form == "chunked" and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    for name, t in (("a", a), ("b", b)):
        _check_low_rank(name, t, q)

    def evaluate(q, k, v, a, b, state):
        return _evaluate(q, k, v, a, b, spec, form, chunk_size, state)

    return run_sequences(evaluate, q, k, v, (a, b), initial_state, cu_seqlens)


def _check_low_rank(name: str, t: object, q: torch.Tensor) -> None:
    """SpecError unless t is a finite floating tensor shaped as q, on q's device."""
    want = tuple(q.shape)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise SpecError(f"the IPLR rule needs {name}, a floating tensor {want} (B, H, N, d)")
    if tuple(t.shape) != want:
        raise SpecError(f"{name} must have shape {want} (B, H, N, d), got {tuple(t.shape)}")
    if t.device != q.device:
        raise SpecError(f"{name} must be on q's device, {q.device}, not {t.device}")
    if not bool(torch.isfinite(t).all()):
        raise SpecError(f"{name} has a non-finite value")


def _evaluate(q, k, v, a, b, spec: Spec, form: str, chunk_size: int, state):
    """(out, state) of one batch of sequences, in the state's (compute) dtype."""
    qc, kc, vc, ac, bc = (t.to(state.dtype) for t in (q, k, v, a, b))
    qc = qc * spec.scale_for(q.shape[-1])
    if form == "recurrent":
        return _recurrent(qc, kc, vc, ac, bc, state)
    return _chunked(qc, kc, vc, ac, bc, state, chunk_size)


def _recurrent(q, k, v, a, b, state):
    """Token by token (the module docstring); q already scaled by c."""
    rows = []
    for t in range(q.shape[-2]):
        w = a[..., t : t + 1, :] @ state  # (B, H, 1, dv): a_t^T S_(t-1)
        state = state + b[..., t : t + 1, :].transpose(-2, -1) @ w
        state = state + k[..., t : t + 1, :].transpose(-2, -1) @ v[..., t : t + 1, :]
        rows.append(q[..., t : t + 1, :] @ state)
    return torch.cat(rows, dim=-2), state


def _chunked(q, k, v, a, b, state, size: int):
    """Chunks of `size` tokens in the WY / UT form (the module docstring); q scaled by c."""
    rows = []
    for start in range(0, q.shape[-2], size):
        part = slice(start, start + size)
        qc, kc, vc, ac, bc = (t[..., part, :] for t in (q, k, v, a, b))
        system = -(ac @ bc.transpose(-2, -1)).tril(-1)  # its unit diagonal unread
        rhs = ac @ state + (ac @ kc.transpose(-2, -1)).tril(-1) @ vc
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        inner_b, inner_k = ((qc @ t.transpose(-2, -1)).tril() for t in (bc, kc))
        rows.append(qc @ state + inner_b @ u + inner_k @ vc)
        state = state + bc.transpose(-2, -1) @ u + kc.transpose(-2, -1) @ vc
    return torch.cat(rows, dim=-2), state
