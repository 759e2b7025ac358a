"""What the built-in forms of a rule with a matrix state share (the delta rule's, the IPLR
rule's, the SSD layer's: S (B, H, d, dv), one update a token): the state to start from, and
a packed batch evaluated sequence by sequence, each from its own initial state (the FlashAttention
convention, inputs.check_cu_seqlens)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from ..inputs import check_cu_seqlens
from ..specs import SpecError

# (q, k, v, *per-token tensors, state) -> (rows in the compute dtype, state after them)
Evaluate = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def initial_state(initial, q, v, dtype: torch.dtype, rows: int) -> torch.Tensor:
    """The state to start from, (rows, H, d, dv) in `dtype` on q's device (None: zero)."""
    want = (rows, q.shape[1], q.shape[-1], v.shape[-1])
    if initial is None:
        return torch.zeros(want, dtype=dtype, device=q.device)
    if not isinstance(initial, torch.Tensor) or not initial.is_floating_point():
        raise SpecError(f"initial_state must be a floating tensor S {want}")
    if tuple(initial.shape) != want:
        raise SpecError(f"initial_state must be S {want}, got {tuple(initial.shape)}")
    if not bool(torch.isfinite(initial).all()):
        raise SpecError("initial_state has a non-finite value")
    return initial.to(device=q.device, dtype=dtype)


def run_sequences(
    evaluate: Evaluate,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    per_token: Sequence[torch.Tensor | None],
    initial,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, N, dv) in q's dtype, the state after the last token in the compute dtype)
    of `evaluate` from `initial` (None: 0); with cu_seqlens (B = 1) each sequence by itself,
    its slice of the per-token tensors (None kept), initial and the state returned
    (S_count, H, d, dv)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if cu_seqlens is None:
        out, state = evaluate(q, k, v, *per_token, initial_state(initial, q, v, dtype, len(q)))
        return out.to(q.dtype), state
    if q.shape[0] != 1:
        raise SpecError(f"a packed batch is one row (1, H, T, d), got q {tuple(q.shape)}")
    offsets = check_cu_seqlens(cu_seqlens, q.shape[-2])
    states = initial_state(initial, q, v, dtype, len(offsets) - 1)
    out, finals = q.new_empty((*q.shape[:-1], v.shape[-1])), []
    for s, (start, stop) in enumerate(itertools.pairwise(offsets)):
        state = states[s : s + 1]
        if stop > start:
            pieces = [None if t is None else t[:, :, start:stop] for t in (q, k, v, *per_token)]
            out[:, :, start:stop], state = evaluate(*pieces, state)
        finals.append(state)
    return out, torch.cat(finals)
