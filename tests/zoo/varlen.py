"""Kernels that take packed batches (--varlen: fn(q, k, v, cu_seqlens=None) with B = 1 when
cu_seqlens is given): broken ones of the classes of the public reports, and correct ones
written two ways. Causal elu attention, careful otherwise (zoo/state.py's prefix sums)."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from . import Entry
from .broken import _elu1, _elu1_row_scaled, _widen
from .state import state_cumsum

TILE = 16  # tokens per tile of the tiled kernel


def _causal(q, k, v):
    return state_cumsum(q, k, v)[0]


def _offsets(cu_seqlens: Tensor) -> list[int]:
    return [int(t) for t in cu_seqlens.tolist()]


def varlen_loop(q, k, v, cu_seqlens=None):
    """Each packed sequence run by itself (empty ones skipped)."""
    if cu_seqlens is None:
        return _causal(q, k, v)
    out = torch.empty_like(v, dtype=q.dtype)
    cu = _offsets(cu_seqlens)
    for a, b in itertools.pairwise(cu):
        if b > a:
            out[..., a:b, :] = _causal(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :])
    return out


def _segment_ids(cu: list[int], total: int, device) -> Tensor:
    lengths = torch.tensor([b - a for a, b in itertools.pairwise(cu)], device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)[:total]


def _masked(q, k, v, same: Tensor) -> Tensor:
    """The quadratic form with weights kept where `same` (N, N) and j <= i."""
    qc, kc, vc = _widen(q, k, v)
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    weights = (_elu1_row_scaled(qc) @ _elu1(kc).mT) * (same & causal)
    return ((weights @ vc) / weights.sum(-1, keepdim=True)).to(q.dtype)


def varlen_segment_mask(q, k, v, cu_seqlens=None):
    """The quadratic form, a key kept when it is in the query's sequence and not later."""
    n = q.shape[-2]
    if cu_seqlens is None:
        return _masked(q, k, v, torch.ones(n, n, dtype=torch.bool, device=q.device))
    ids = _segment_ids(_offsets(cu_seqlens), n, q.device)
    return _masked(q, k, v, ids[:, None] == ids[None, :])


def varlen_state_leaks(q, k, v, cu_seqlens=None):
    """BUG: the packed row is one sequence: the prefix sums run across the boundaries."""
    return _causal(q, k, v)


def varlen_reset_per_tile(q, k, v, cu_seqlens=None):
    """BUG: the state is reset at the first tile of 16 that a sequence starts in, not at the
    sequence's first token: a boundary inside a tile leaks the tokens before it (the
    varlen-with-chunks class of fla PR #955 / #837)."""
    if cu_seqlens is None:
        return _causal(q, k, v)
    n, cu = q.shape[-2], _offsets(cu_seqlens)
    starts = sorted({a - a % TILE for a in cu[:-1]} | {n})
    out = torch.empty_like(v, dtype=q.dtype)
    for a, b in itertools.pairwise(starts):
        out[..., a:b, :] = _causal(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :])
    return out


def varlen_empty_takes_a_token(q, k, v, cu_seqlens=None):
    """BUG: the segment of each token from the lengths clamped to 1, so an empty sequence
    takes the next token and every later token is one sequence late (fla #103 class)."""
    n = q.shape[-2]
    if cu_seqlens is None:
        return varlen_segment_mask(q, k, v)
    cu = _offsets(cu_seqlens)
    lengths = torch.tensor([max(b - a, 1) for a, b in itertools.pairwise(cu)])
    ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[:n].to(q.device)
    return _masked(q, k, v, ids[:, None] == ids[None, :])


def varlen_keys_from_row_start(q, k, v, cu_seqlens=None):
    """BUG: each sequence's keys and values are read from the start of the packed row, its
    offset applied to the queries only."""
    if cu_seqlens is None:
        return _causal(q, k, v)
    out = torch.empty_like(v, dtype=q.dtype)
    for a, b in itertools.pairwise(_offsets(cu_seqlens)):
        if b > a:
            out[..., a:b, :] = _causal(q[..., a:b, :], k[..., : b - a, :], v[..., : b - a, :])
    return out


def _entry(name, fn, broken: bool, bug: str) -> Entry:
    caught = ("varlen",) if broken else ()
    return Entry(name, fn, "elu", True, broken, bug, caught_by=caught, varlen=True,
                 cost="quadratic" if "mask" in name or "empty" in name else None)  # fmt: skip


ENTRIES = (
    _entry("varlen-loop", varlen_loop, False, "correct: each sequence by itself"),
    _entry("varlen-segment-mask", varlen_segment_mask, False, "correct: a same-sequence mask"),
    _entry("varlen-state-leaks", varlen_state_leaks, True, "the state runs across boundaries"),
    _entry("varlen-reset-per-tile", varlen_reset_per_tile, True, "reset at tile starts only"),
    _entry("varlen-empty-takes-a-token", varlen_empty_takes_a_token, True,
           "an empty sequence takes a token"),
    _entry("varlen-keys-from-row-start", varlen_keys_from_row_start, True,
           "keys read from the row's start"),
)  # fmt: skip
