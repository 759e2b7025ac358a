"""Kernels with a carried state (--state Sz: fn(q, k, v, initial_state=(S, z)) returns
(out, (S, z))): broken ones of the classes of the public reports, and correct ones written
two ways. Causal elu attention, S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j) in true
units (keys unshifted), float32 computation (float64 for float64 inputs), the output
rounded to the inputs' dtype once; vectorised, so that vet's plan runs in seconds."""

from __future__ import annotations

import torch
from torch import Tensor

from . import Entry
from .broken import _elu1, _elu1_row_scaled, _widen

TILE = 16  # tokens per tile of the tiled kernels
StateSz = tuple[Tensor, Tensor]


def _start(fk: Tensor, v: Tensor, initial_state: StateSz | None) -> StateSz:
    """The state before the first token: the given one in the compute dtype, or zeros."""
    if initial_state is None:
        b, h, _, f = fk.shape
        return fk.new_zeros(b, h, f, v.shape[-1]), fk.new_zeros(b, h, f)
    s, z = initial_state
    return s.to(fk.dtype), z.to(fk.dtype)


def _prefix_sums(q, k, v, s0: Tensor, z0: Tensor, z_start: Tensor | None = None):
    """(out, S, z after the last token): token i sees S_0 + sum_{j<=i} phi(k_j) v_j^T and
    its normaliser z_start + sum_{j<=i} phi(k_j) (z_start: z_0 unless given)."""
    qc, kc, vc = _widen(q, k, v)
    fq, fk = _elu1_row_scaled(qc), _elu1(kc)
    s = torch.cumsum(fk.unsqueeze(-1) * vc.unsqueeze(-2), dim=2) + s0.unsqueeze(2)
    z = torch.cumsum(fk, dim=2)
    num = (fq.unsqueeze(-1) * s).sum(-2)
    den = (fq * (z + (z0 if z_start is None else z_start).unsqueeze(2))).sum(-1, keepdim=True)
    return (num / den).to(q.dtype), s[:, :, -1], z[:, :, -1] + z0


def _features(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    kc, vc = _widen(k, v)
    return _elu1(kc), vc


def state_cumsum(q, k, v, initial_state=None):
    """Prefix sums over tokens (cumsum), continuing the given state."""
    fk, vc = _features(k, v)
    s0, z0 = _start(fk, vc, initial_state)
    out, s, z = _prefix_sums(q, k, v, s0, z0)
    return out, (s, z)


def _tiled(q, k, v, initial_state, tail_in_state: bool = True, stale: bool = False):
    """Tiles of TILE tokens: a masked block inside each, the state entering it from the
    tiles before (Yang et al. 2024, sec. 3.2). tail_in_state=False: a partial last tile is
    left out of the returned state; stale: the state returned is the one entering the last
    tile."""
    fk, vc = _features(k, v)
    s, z = _start(fk, vc, initial_state)
    outs, entering = [], (s, z)
    n = q.shape[-2]
    for a in range(0, n, TILE):
        b = min(a + TILE, n)
        out, s_new, z_new = _prefix_sums(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], s, z)
        outs.append(out)
        entering = (s, z)
        if tail_in_state or b - a == TILE:
            s, z = s_new, z_new
    return torch.cat(outs, dim=-2), entering if stale else (s, z)


def state_input_dtype(q, k, v, initial_state=None):
    """Prefix sums in float32, the state returned in the inputs' dtype (as a cache of them
    keeps it)."""
    out, (s, z) = state_cumsum(q, k, v, initial_state)
    return out, (s.to(q.dtype), z.to(q.dtype))


def state_tiles(q, k, v, initial_state=None):
    """Tiles of 16 tokens, the state carried from tile to tile."""
    return _tiled(q, k, v, initial_state)


def state_ignored(q, k, v, initial_state=None):
    """BUG: the initial state is never read (vllm PR #22034: initial states dropped)."""
    return state_cumsum(q, k, v, None)


def state_final_stale(q, k, v, initial_state=None):
    """BUG: the final state returned is the one entering the last tile: stale by a chunk."""
    return _tiled(q, k, v, initial_state, stale=True)


def state_partial_tile_dropped(q, k, v, initial_state=None):
    """BUG: a last tile shorter than 16 tokens is left out of the final state (sglang
    #31833: states of requests not aligned to chunk boundaries)."""
    return _tiled(q, k, v, initial_state, tail_in_state=False)


def state_normaliser_ignores_prefix(q, k, v, initial_state=None):
    """BUG: the numerator continues S_0 but the normaliser counts this call's keys only
    (fla's normalize_output with an initial_state): z_0 is carried but not divided by."""
    fk, vc = _features(k, v)
    s0, z0 = _start(fk, vc, initial_state)
    out, s, z = _prefix_sums(q, k, v, s0, z0, z_start=torch.zeros_like(z0))
    return out, (s, z)


def state_stored_bf16(q, k, v, initial_state=None):
    """BUG: the final state is stored in bfloat16 (a cache of the wrong dtype)."""
    out, (s, z) = state_cumsum(q, k, v, initial_state)
    return out, (s.bfloat16().to(s.dtype), z.bfloat16().to(z.dtype))


def state_z0_detached(q, k, v, initial_state=None):
    """BUG (backward only): z_0 enters detached, so the loss's gradient never reaches it
    (dL/dz_0 = 0); the forward is exact."""
    if initial_state is not None:
        initial_state = (initial_state[0], initial_state[1].detach())
    return state_cumsum(q, k, v, initial_state)


def _entry(name, fn, broken: bool, bug: str, caught_by=(), grad: bool = False) -> Entry:
    return Entry(name, fn, "elu", True, broken, bug, caught_by=caught_by, state="Sz", grad=grad)


ENTRIES = (
    _entry("state-cumsum", state_cumsum, False, "correct: prefix sums over tokens"),
    _entry("state-tiles-16", state_tiles, False, "correct: tiles of 16, state carried"),
    _entry("state-input-dtype", state_input_dtype, False,
           "correct: the state kept in the inputs' dtype"),
    _entry("state-ignored", state_ignored, True, "the initial state is ignored",
           ("state-split", "initial-state")),
    _entry("state-final-stale", state_final_stale, True, "final state stale by one tile",
           ("state-split", "final-state")),
    _entry("state-partial-tile-dropped", state_partial_tile_dropped, True,
           "a partial last tile left out of the state", ("state-split", "final-state")),
    _entry("state-normaliser-ignores-prefix", state_normaliser_ignores_prefix, True,
           "the normaliser ignores the initial state", ("state-split", "initial-state")),
    _entry("state-stored-bf16", state_stored_bf16, True, "the state stored in bfloat16",
           ("final-state",)),
    _entry("state-z0-detached", state_z0_detached, True,
           "the backward never reaches z_0 (backward only)", ("state-gradient",), grad=True),
)  # fmt: skip
