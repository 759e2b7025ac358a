"""Step kernels (--step S: fn(q, k, v, cache=S, slots=..., g=...) applies one token per
request to its slot of a state cache, in place), written as a serving engine's author
would: gated linear attention, unnormalised, phi the identity (GLA's, RetNet's decode
step), S_t = exp(g_t) S_(t-1) + k_t v_t^T and o_t = S_t^T q_t, in the cache's dtype, the
output rounded to the inputs' dtype once. The broken ones get the cache's bookkeeping
wrong."""

from __future__ import annotations

import torch
from torch import Tensor

from . import Entry


def _step(q, k, v, cache: Tensor, g: Tensor, read: Tensor, write: Tensor, rows: Tensor):
    """The outputs (B, H, 1, dv) of requests `rows` (the others' zero), their states read
    from slots `read` and written to slots `write` (None: not written back)."""
    qc, kc, vc, gc = (t[rows, :, 0].to(cache.dtype) for t in (q, k, v, g))
    s = torch.exp(gc)[..., None, None] * cache[read] + kc[..., :, None] * vc[..., None, :]
    if write is not None:
        cache[write] = s
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    out[rows, :, 0] = torch.einsum("bhf,bhfc->bhc", qc, s).to(q.dtype)
    return out


def step_gated(q, k, v, cache, slots, g):
    """Requests with slot >= 0 read and write their own slot; pad requests are skipped."""
    rows = slots >= 0
    return _step(q, k, v, cache, g, slots[rows], slots[rows], rows)


def step_slot_as_batch(q, k, v, cache, slots, g):
    """BUG: request b's state is read from and written to slot b, not slots[b]."""
    rows = slots >= 0
    batch = torch.arange(len(slots), device=slots.device)[rows]
    return _step(q, k, v, cache, g, batch, batch, rows)


def step_not_written(q, k, v, cache, slots, g):
    """BUG: the new state is never written back to the cache."""
    rows = slots >= 0
    return _step(q, k, v, cache, g, slots[rows], None, rows)


def step_pad_written(q, k, v, cache, slots, g):
    """BUG: pad requests are not skipped: slot -1 is read and written, the cache's last."""
    rows = torch.ones_like(slots, dtype=torch.bool)
    return _step(q, k, v, cache, g, slots, slots, rows)


def _entry(name, fn, broken: bool, bug: str, caught_by=()) -> Entry:
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by,
                 decay="gates", normalize=False, step="S", smallest=True)  # fmt: skip


ENTRIES = (
    _entry("step-gated", step_gated, False, "correct: each request's own slot, pads skipped"),
    _entry("step-slot-as-batch", step_slot_as_batch, True,
           "the slot index read as the batch index", ("step-cache",)),
    _entry("step-not-written", step_not_written, True, "the state not written back",
           ("step-decode",)),
    _entry("step-pad-written", step_pad_written, True, "the pad slot (-1) written",
           ("step-cache",)),
)  # fmt: skip
