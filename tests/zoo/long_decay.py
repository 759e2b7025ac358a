"""Long-context kernels of the decayed specs (simple GLA's scalar gates, fn(q, k, v, g=(B,
H, N)), and retention's constant decay, fn(q, k, v, gamma=(H,))): broken ones whose bug
shows at long N (the gates' prefix sums in the input dtype also in the decay check's
strong gates at short N), where the state travels far, and their correct twins.

out_i = c sum_(j<=i) w_ij (q_i . k_j) v_j, unnormalised, identity features, c = 1 or d^-0.5,
w_ij = exp(G_i - G_j) (G the inclusive prefix sums of the log-gates) or gamma^(i - j).
Chunked in tiles of LONG_CHUNK tokens as GLA's chunk form (Yang et al. 2024, sec. 3.2):
inside a tile the decay from the tile's own prefix sums b (every factor exp(b_i - b_j) <=
1), the state entering tile t read by row i through exp(b_i), carried to the next tile as
exp(b_last) S + sum_j k_j exp(b_last - b_j) v_j^T. Careful otherwise, as broken.py's
kernels are: float32 computation (float64 for float64 inputs), the output rounded once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Entry
from .broken import _widen

LONG_CHUNK = 64  # tokens per tile
SEGMENT = 2**16  # tokens per segment of a segmented kernel (a launch, or a rank)


def _tiles(t: Tensor) -> Tensor:
    """(B, H, N, ...) -> (B, H, nc, LONG_CHUNK, ...), zeros appended (zero keys add nothing;
    a zero log-gate decays nothing)."""
    pad = [0, 0] * (t.dim() - 3) + [0, -t.shape[2] % LONG_CHUNK]
    t = F.pad(t, pad)
    return t.reshape(*t.shape[:2], -1, LONG_CHUNK, *t.shape[3:])


def _chunked(q, k, v, local: Tensor, scale: float, s0=None, read: Tensor | None = None):
    """(out, S after the last token) from the tiles' inclusive local prefix sums of the
    log-decays `local` (B or 1, H, nc, LONG_CHUNK), in the compute dtype; from the state
    s0 (B, H, d, dv; None: zero); rows read the state entering their tile through
    exp(read) (None: exp(local))."""
    n = q.shape[2]
    tq, tk, tv = (_tiles(t) for t in (q, k, v))
    mask = torch.ones(LONG_CHUNK, LONG_CHUNK, dtype=torch.bool, device=q.device).tril()
    gaps = (local[..., :, None] - local[..., None, :]).masked_fill(~mask, -math.inf)
    inner = (tq @ tk.mT) * torch.exp(gaps)
    total = local[..., -1]
    ds = (tk * torch.exp(total[..., None] - local)[..., None]).mT @ tv
    s = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if s0 is None else s0
    s_in = torch.empty(*ds.shape[:2], ds.shape[2], *s.shape[2:], dtype=s.dtype, device=s.device)
    decay = torch.exp(total).expand(*ds.shape[:3])
    for t in range(ds.shape[2]):
        s_in[:, :, t] = s
        s = decay[:, :, t, None, None] * s + ds[:, :, t]
    read = local if read is None else read
    out = torch.exp(read)[..., None] * (tq @ s_in) + inner @ tv
    return out.flatten(2, 3)[:, :, :n] * scale, s


def _gate_tiles(g: Tensor, dtype) -> Tensor:
    """The tiles' inclusive local prefix sums of the log-gates, in `dtype`."""
    return torch.cumsum(_tiles(g.to(dtype)[..., None])[..., 0], dim=-1)


def _gamma_tiles(gamma: Tensor, n: int, dtype) -> Tensor:
    """(1, H, nc, LONG_CHUNK): a tile's local prefix sums of ln gamma, (a + 1) ln gamma at
    its a-th token (integer offsets in int64)."""
    tiles = -(-n // LONG_CHUNK)
    offsets = torch.arange(1, LONG_CHUNK + 1, device=gamma.device).to(dtype)
    return (torch.log(gamma.to(dtype))[:, None, None] * offsets).expand(-1, tiles, -1)[None]


def _scaled(q: Tensor) -> float:
    return q.shape[-1] ** -0.5


# --- correct ------------------------------------------------------------------------------


def gates_chunk64(q, k, v, g):
    """Simple GLA in tiles of 64, the gates' prefix sums local to each tile."""
    qc, kc, vc = _widen(q, k, v)
    return _chunked(qc, kc, vc, _gate_tiles(g, qc.dtype), 1.0)[0].to(q.dtype)


def gates_chunk64_scaled(q, k, v, g):
    """Simple GLA at scale d^-0.5 (fla's simple_gla), tiles of 64."""
    qc, kc, vc = _widen(q, k, v)
    return _chunked(qc, kc, vc, _gate_tiles(g, qc.dtype), _scaled(q))[0].to(q.dtype)


def gamma_chunk64(q, k, v, gamma):
    """Retention in tiles of 64, the decays from int64 token offsets."""
    qc, kc, vc = _widen(q, k, v)
    return _chunked(qc, kc, vc, _gamma_tiles(gamma, q.shape[2], qc.dtype), 1.0)[0].to(q.dtype)


# --- broken -------------------------------------------------------------------------------


def gates_global_prefix_input_dtype(q, k, v, g):
    """Simple GLA whose gates' prefix sums G run over the whole sequence by cumsum in the
    input dtype, a tile's decays the differences of two long prefix sums: their error grows
    with |G|, the sum of every gate so far (~16 at 2^16 for a memory of 4096 tokens)."""
    qc, kc, vc = _widen(q, k, v)
    prefix = torch.cumsum(g, dim=-1).to(qc.dtype)  # G in the input dtype
    tiles = _tiles(prefix[..., None])[..., 0]
    before = F.pad(tiles[..., -1], (1, 0))[..., :-1]  # G at the end of the tile before
    return _chunked(qc, kc, vc, tiles - before[..., None], 1.0)[0].to(q.dtype)


def gates_segment_decayed_twice(q, k, v, g):
    """Simple GLA over segments of 65536 tokens whose state is handed to the next segment
    decayed once more by the segment's total decay (decayed at the tiles' ends, then again
    at the handover): exact up to 2^16 tokens, every later row sees the earlier segments
    decayed by exp(G_(2^16)) too much: 6 % where the memory spans the sequence."""
    qc, kc, vc = _widen(q, k, v)
    outs, s = [], None
    for start in range(0, q.shape[2], SEGMENT):
        part = slice(start, start + SEGMENT)
        local = _gate_tiles(g[..., part], qc.dtype)
        out, s = _chunked(qc[:, :, part], kc[:, :, part], vc[:, :, part], local, 1.0, s)
        outs.append(out)
        s = torch.exp(g[..., part].to(qc.dtype).sum(dim=-1))[..., None, None] * s
    return torch.cat(outs, dim=2).to(q.dtype)


def gamma_int16_offsets(q, k, v, gamma):
    """Retention whose rows read the state entering their tile through gamma^(i - start),
    i the row's position (int64) and start the tile's, t * 64 computed in int16 (the
    scaled-down int32 offset wrap of fla #1080): exact while t * 64 < 32768; from row 32768
    on start wraps to t * 64 - 65536, and the state reaches the row decayed by gamma^65536
    more (e^-16 at a memory of 4096 tokens)."""
    qc, kc, vc = _widen(q, k, v)
    n = q.shape[2]
    local = _gamma_tiles(gamma, n, qc.dtype)
    starts = torch.arange(local.shape[2], dtype=torch.int16, device=q.device) * LONG_CHUNK
    rows = torch.arange(local.shape[2] * LONG_CHUNK, device=q.device).reshape(-1, LONG_CHUNK)
    offsets = (rows - starts[:, None].long() + 1).to(qc.dtype)  # (a + 1) where no wrap
    read = torch.log(gamma.to(qc.dtype))[None, :, None, None] * offsets
    return _chunked(qc, kc, vc, local, 1.0, read=read)[0].to(q.dtype)


def _entry(name, fn, decay: str, broken: bool, bug: str, **kw) -> Entry:
    caught_by = ("long-context",) if broken else ()
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by, decay=decay,
                 normalize=False, long=True, **kw)  # fmt: skip


ENTRIES: tuple[Entry, ...] = (
    _entry("long-gates-prefix-input-dtype", gates_global_prefix_input_dtype, "gates", True,
           "the gates' prefix sums over the whole sequence in the input dtype, decays their "
           "differences: the error grows with the sum of the gates"),
    _entry("long-gates-segment-decayed-twice", gates_segment_decayed_twice, "gates", True,
           "segments of 65536 tokens whose state is decayed once too often at the handover: "
           "wrong from N = 2^16 + 1"),
    _entry("long-gamma-int16-offsets", gamma_int16_offsets, "constant", True,
           "tile offsets in int16: from row 32768 on the state is read decayed by "
           "gamma^65536 too much"),
    _entry("long-gates-chunk64", gates_chunk64, "gates", False,
           "correct: tiles of 64, the gates' prefix sums local to each tile"),
    _entry("long-gates-chunk64-scaled", gates_chunk64_scaled, "gates", False,
           "correct: tiles of 64 at scale d^-0.5", scale="d^-0.5"),
    _entry("long-gamma-chunk64", gamma_chunk64, "constant", False,
           "correct: tiles of 64, the decays from int64 offsets"),
)  # fmt: skip
