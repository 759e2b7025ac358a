"""Long-context kernels: broken ones whose bug shows only past N = 4096 (the short plan's
N <= 65 cannot see it; the long-context check must), and correct ones written other ways.

Every kernel is O(N) in time and memory: causal ones in tiles of LONG_CHUNK tokens, the
state S (f x dv) and z (f) entering each tile a prefix over the tiles before it, the masked
block inside the tile (Yang et al. 2024, sec. 3.2). Careful otherwise, as broken.py's
kernels are: float32 computation (float64 for float64 inputs), elu features without
cancellation, the output rounded to the inputs' dtype once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Entry
from .broken import _elu_inputs, _widen

LONG_CHUNK = 64  # tokens per tile of the chunked forms
SEGMENT = 2**16  # tokens per segment of the segmented forms
BLOCK = 4096  # tokens per block of a block-wise kernel (many tiles)
# The per-token leak of error-linear-in-n, per compute dtype: a sixteenth of its unit
# roundoff (float32: ~120 u of error at N = 4096, within the long-context budget of 4 x the
# golden's error, ~1800 u at 2^16, several times over it).
LEAK = {torch.float32: 2.0**-28, torch.float64: 2.0**-57}

State = tuple[Tensor, Tensor, Tensor, Tensor]  # S and z entering each tile, S and z after


def _tiles(t: Tensor, chunk: int) -> Tensor:
    """(B, H, N, X) -> (B, H, nc, chunk, X), zero rows appended (zero keys add nothing;
    the rows of zero queries are dropped)."""
    t = F.pad(t, (0, 0, 0, -t.shape[-2] % chunk))
    return t.reshape(*t.shape[:-2], -1, chunk, t.shape[-1])


def _exclusive(start: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """start plus the sum of x over the tiles (dim 2) before each, and after the last: a
    running sum tile by tile (torch.cumsum over a middle dimension is several times
    slower)."""
    before = torch.empty_like(x)
    for c in range(x.shape[2]):
        before[:, :, c] = start
        start = start + x[:, :, c]
    return before, start


def _prefix_state(s0: Tensor, z0: Tensor, ds: Tensor, dz: Tensor) -> State:
    """The state entering each tile: a running sum of the tiles' own states."""
    s_in, s_end = _exclusive(s0, ds)
    z_in, z_end = _exclusive(z0, dz)
    return s_in, z_in, s_end, z_end


def _sequential(step: Callable) -> Callable:
    """A state prefix run tile by tile: (s, z) = step(s, z, ds_c, dz_c) after tile c."""

    def prefix(s: Tensor, z: Tensor, ds: Tensor, dz: Tensor) -> State:
        s_in, z_in = torch.empty_like(ds), torch.empty_like(dz)
        for c in range(ds.shape[2]):
            s_in[:, :, c], z_in[:, :, c] = s, z
            s, z = step(s, z, ds[:, :, c], dz[:, :, c])
        return s_in, z_in, s, z

    return prefix


def _causal(
    fq: Tensor,
    fk: Tensor,
    v: Tensor,
    chunk: int = LONG_CHUNK,
    s0: Tensor | None = None,
    z0: Tensor | None = None,
    prefix: Callable = _prefix_state,
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal sum_{j <= i} (fq_i . fk_j) v_j / sum_{j <= i} fq_i . fk_j from features, in
    tiles of `chunk` tokens from the state (s0, z0); `prefix` gives the state entering each
    tile. Returns (out, S, z), the state after the last token."""
    b, h, n, f = fk.shape
    s0 = fk.new_zeros(b, h, f, v.shape[-1]) if s0 is None else s0
    z0 = fk.new_zeros(b, h, f) if z0 is None else z0
    tq, tk, tv = (_tiles(t, chunk) for t in (fq, fk, v))
    s_in, z_in, s_end, z_end = prefix(s0, z0, tk.mT @ tv, tk.sum(dim=-2))
    inner = (tq @ tk.mT).tril()
    num = tq @ s_in + inner @ tv
    den = tq @ z_in.unsqueeze(-1) + inner.sum(dim=-1, keepdim=True)
    return (num / den).flatten(2, 3)[:, :, :n], s_end, z_end


def _segmented(fq: Tensor, fk: Tensor, v: Tensor, length: int, handover: Callable) -> Tensor:
    """_causal over segments of `length` tokens; (S, z) = handover(S, z) between segments."""
    outs, s, z = [], None, None
    for start in range(0, fk.shape[-2], length):
        rows = slice(start, start + length)
        out, s, z = _causal(fq[..., rows, :], fk[..., rows, :], v[..., rows, :], s0=s, z0=z)
        outs.append(out)
        s, z = handover(s, z)
    return torch.cat(outs, dim=-2)


def _out(x: Tensor, like: Tensor) -> Tensor:
    return x.to(like.dtype).contiguous()


def _half_kahan(dz: Tensor) -> tuple[Tensor, Tensor]:
    """The sum of dz over the tiles (dim 2) before each, and in all, kept as a float16 running
    sum with a float32 (float64) Kahan compensation: as accurate as the compute dtype while
    the sum stays within float16's range; past 65504 the head is inf and the sum NaN."""
    head = dz.new_zeros(dz[:, :, 0].shape, dtype=torch.float16)
    comp = dz.new_zeros(dz[:, :, 0].shape)
    before = torch.empty_like(dz)
    for c in range(dz.shape[2]):
        wide = head.to(dz.dtype)
        before[:, :, c] = wide - comp
        y = dz[:, :, c] - comp
        head = (wide + y).half()
        comp = (head.to(dz.dtype) - wide) - y
    return before, head.to(dz.dtype) - comp


# --- broken -------------------------------------------------------------------------------


def fp16_normaliser_prefix(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu whose running normaliser z is kept in float16 (a half-precision state
    buffer with a float32 Kahan compensation, so precise) while S is float32: a state
    accumulator in a 16-bit type overflows at long T (the class of fla #122, fused_chunk_gla
    NaN at T = 43884). z grows by about 1.16 per token, so past N ~ 56k the head is inf: NaN."""

    def prefix(s0, z0, ds, dz):
        s_in, s_end = _exclusive(s0, ds)
        z_in, z_end = _half_kahan(dz)
        return s_in, z_in, s_end, z_end

    out, _, _ = _causal(*_elu_inputs(q, k, v), prefix=prefix)
    return _out(out, q)


def input_dtype_chunk_state(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Chunked causal elu whose state (S, z) is stored in the input dtype between tiles (a
    chunk kernel writing its inter-chunk states h in q.dtype, as chunk_fwd_h may): exact for
    float32 inputs; for float16 and bfloat16 one rounding per tile, an error that grows with
    the number of tiles, and z stagnates once its spacing exceeds a tile's increment."""

    def step(s, z, ds, dz):
        return (s + ds).to(q.dtype).to(s.dtype), (z + dz).to(q.dtype).to(z.dtype)

    out, _, _ = _causal(*_elu_inputs(q, k, v), prefix=_sequential(step))
    return _out(out, q)


def segment_state_dropped(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu run over segments of 65536 tokens (a grid or sequence-parallel split of
    the length) whose state is not carried from one segment to the next: exact up to 2^16
    tokens, queries from 2^16 on see only their own segment (fla #906's class: rwkv7's
    gate_output_correction skips what lies past its 65536-token boundary)."""
    out = _segmented(*_elu_inputs(q, k, v), SEGMENT, lambda s, z: (None, None))
    return _out(out, q)


def cosformer_dtype_positions(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal cosFormer whose positions are torch.arange(N, dtype=q.dtype): float16 rounds
    them past 2048 and makes them inf past 65504 (cos(inf) = NaN), bfloat16 rounds them past
    256, float32 past 2^24 (positions or offsets in a floating input dtype). The angles are
    formed from those positions in float64, M = max(Nq, Nk) right."""
    qc, kc, vc = _widen(q, k, v)
    step = math.pi / (2 * max(q.shape[-2], k.shape[-2]))
    positions = torch.arange(q.shape[-2], dtype=q.dtype, device=q.device)
    angle = positions.to(torch.float64) * step
    fq, fk = _cosformer_features(qc, angle), _cosformer_features(kc, angle)
    out, _, _ = _causal(fq, fk, vc)
    return _out(out, q)


def nan_past_length(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu whose state is kept scaled by 1/sqrt(t) (bounded at any length), t the
    number of tokens so far counted in int16: the scaled-down int32 offset wrap of fla #1080
    (a 32-bit offset fine until B T H K > 2^31). Exact while t < 32768; past it the count
    wraps negative and sqrt(t) is NaN, for every query from 32768 on."""

    def prefix(s, z, ds, dz):
        count = torch.zeros((), dtype=torch.int16, device=ds.device)
        s_hat, z_hat = s, z  # S / sqrt(t), z / sqrt(t)
        s_in, z_in = torch.empty_like(ds), torch.empty_like(dz)
        for c in range(ds.shape[2]):
            root = count.to(ds.dtype).sqrt()
            s, z = s_hat * root, z_hat * root
            s_in[:, :, c], z_in[:, :, c] = s, z
            count = count + LONG_CHUNK  # int16: wraps to -32768 at 32768
            inv = count.to(ds.dtype).rsqrt()
            s_hat, z_hat = (s + ds[:, :, c]) * inv, (z + dz[:, :, c]) * inv
        return s_in, z_in, s_hat * count.to(ds.dtype).sqrt(), z_hat * count.to(ds.dtype).sqrt()

    out, _, _ = _causal(*_elu_inputs(q, k, v), prefix=prefix)
    return _out(out, q)


def state_rounded_per_chunk(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu in blocks of 4096 tokens (tiles of 64 inside, float32 state) whose state
    is handed from block to block rounded to bfloat16 whatever the input dtype (a state
    exchanged between kernel launches, or sequence-parallel ranks, in bfloat16): exact up to
    4096 tokens, then one bfloat16 rounding per block, an error growing with their number."""

    def handover(s, z):
        return s.bfloat16().to(s.dtype), z.bfloat16().to(z.dtype)

    out = _segmented(*_elu_inputs(q, k, v), BLOCK, handover)
    return _out(out, q)


def error_linear_in_n(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu whose numerator state S leaks a relative 2^-28 (float64: 2^-57) per token
    while z does not: a gate meant to be exactly 1 left as exp(-eps) (a log-gate clamped to
    at most -eps), applied to S and not to the normaliser. The output shrinks by about
    eps i / 2 at row i: ~1e-7 relative at N = 65 (float32 roundoff), 8e-6 at 4096, 1.2e-4
    at 2^16; below the roundoff of float16 and bfloat16 outputs."""
    fq, fk, vc = _elu_inputs(q, k, v)
    eps, c = LEAK[fq.dtype], LONG_CHUNK
    # lost[a]: the fraction of a key's weight lost after a tokens, 1 - exp(-eps a)
    lost = (-torch.expm1(-eps * torch.arange(c + 1, dtype=torch.float64))).to(fq)
    n = fk.shape[-2]
    tq, tk, tv = (_tiles(t, c) for t in (fq, fk, vc))
    ages = torch.arange(c, device=fq.device)
    lost_inner = lost[(ages[:, None] - ages).clamp(min=0)]  # (c, c), by the age i - j
    tk_end = tk - tk * lost[c - 1 - ages][:, None]  # the keys' weight at the tile's end
    ds = tk_end.mT @ tv
    s = fk.new_zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1])
    s_in = torch.empty_like(ds)
    for t in range(ds.shape[2]):
        s_in[:, :, t] = s
        s = s - s * lost[c] + ds[:, :, t]
    z_in, _ = _exclusive(fk.new_zeros(*fk.shape[:2], fk.shape[-1]), tk.sum(dim=-2))
    inner = (tq @ tk.mT).tril()
    from_state = tq @ s_in
    num = (from_state - from_state * lost[1:, None]) + (inner - inner * lost_inner) @ tv
    den = tq @ z_in.unsqueeze(-1) + inner.sum(dim=-1, keepdim=True)
    return _out((num / den).flatten(2, 3)[:, :, :n], q)


def noncausal_fp16_normaliser(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu whose normaliser sum_j phi(k_j) is accumulated over key blocks in a
    float16 accumulator (Kahan-compensated in float32, so precise): the fp16 normaliser
    overflow of fast-transformers #32's AMP report. The sum grows by about 1.16 per key, so
    past N ~ 56k it overflows and every output is NaN."""
    fq, fk, vc = _elu_inputs(q, k, v)
    _, z = _half_kahan(_tiles(fk, LONG_CHUNK).sum(dim=-2))
    return _out((fq @ (fk.mT @ vc)) / (fq @ z.unsqueeze(-1)), q)


def quadratic_weights(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu computed as (tril(phi(Q) phi(K)^T) V) / (tril(...) 1): exact, and N x N
    float32 weights (16 GiB at N = 2^16) under a claim of linear cost, the default one. The
    long-context check must stop it before it exhausts memory, as a cost finding."""
    fq, fk, vc = _elu_inputs(q, k, v)
    weights = (fq @ fk.mT).tril()
    return _out((weights @ vc) / weights.sum(dim=-1, keepdim=True), q)


# --- correct ------------------------------------------------------------------------------


def elu_chunk256(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu in tiles of 256 tokens, the float32 (float64) state a running sum over
    the tiles."""
    out, _, _ = _causal(*_elu_inputs(q, k, v), chunk=256)
    return _out(out, q)


def elu_cumsum_normaliser(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu with the normaliser's prefix sum_{j <= i} phi(k_j) per token by cumsum
    over all N and the numerator chunked (tiles of 64, S carried tile by tile)."""
    fq, fk, vc = _elu_inputs(q, k, v)
    n, c = fk.shape[-2], LONG_CHUNK
    tq, tk, tv = (_tiles(t, c) for t in (fq, fk, vc))

    def step(s, z, ds, dz):
        return s + ds, z

    s_in, _, _, _ = _sequential(step)(
        fk.new_zeros(*fk.shape[:2], fk.shape[-1], v.shape[-1]),
        fk.new_zeros(*fk.shape[:2], fk.shape[-1]),
        tk.mT @ tv,
        tk.sum(dim=-2),
    )
    num = (tq @ s_in + (tq @ tk.mT).tril() @ tv).flatten(2, 3)[:, :, :n]
    den = (fq * torch.cumsum(fk, dim=-2)).sum(dim=-1, keepdim=True)
    return _out(num / den, q)


def elu_segments_carried(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu over segments of 65536 tokens with the state carried between segments
    (segment-state-dropped's correct twin)."""
    out = _segmented(*_elu_inputs(q, k, v), SEGMENT, lambda s, z: (s, z))
    return _out(out, q)


def _cosformer_features(x: Tensor, angle: Tensor) -> Tensor:
    """relu(x_i) [cos a_i, sin a_i], the trigonometric factors formed in float64."""
    r = torch.relu(x)
    cos, sin = (t.to(x.dtype)[:, None] for t in (angle.cos(), angle.sin()))
    return torch.cat([r * cos, r * sin], dim=-1)


def cosformer_int_positions(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal cosFormer, integer (int64) positions turned into float64 angles pi i / (2M),
    M = max(Nq, Nk), chunked in tiles of 64."""
    qc, kc, vc = _widen(q, k, v)
    step = math.pi / (2 * max(q.shape[-2], k.shape[-2]))
    angle = torch.arange(q.shape[-2], device=q.device).to(torch.float64) * step
    out, _, _ = _causal(_cosformer_features(qc, angle), _cosformer_features(kc, angle), vc)
    return _out(out, q)


def elu_noncausal_textbook(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu, F.elu(x) + 1 in float32 (float64 for float64 inputs), the normaliser
    summed in the compute dtype."""
    qc, kc, vc = _widen(q, k, v)
    fq, fk = F.elu(qc) + 1, F.elu(kc) + 1
    return _out((fq @ (fk.mT @ vc)) / (fq @ fk.sum(dim=-2).unsqueeze(-1)), q)


def _long(name: str, fn, feature_map: str, causal: bool, bug: str) -> Entry:
    return Entry(
        name, fn, feature_map, causal, broken=True, bug=bug, caught_by=("long-context",), long=True
    )


def _correct(name: str, fn, feature_map: str, causal: bool, how: str) -> Entry:
    return Entry(name, fn, feature_map, causal, broken=False, bug=how, long=True)


ENTRIES: tuple[Entry, ...] = (
    _long(
        "fp16-normaliser-prefix",
        fp16_normaliser_prefix,
        "elu",
        True,
        "the running normaliser z is kept in float16 (Kahan-compensated): inf, then NaN, "
        "past 65504, from N ~ 56k",
    ),
    _long(
        "input-dtype-chunk-state",
        input_dtype_chunk_state,
        "elu",
        True,
        "the state (S, z) is stored in the input dtype between tiles of 64: float16 and "
        "bfloat16 errors grow with the number of tiles",
    ),
    _long(
        "segment-state-dropped",
        segment_state_dropped,
        "elu",
        True,
        "segments of 65536 tokens whose state is not carried: wrong from N = 2^16 + 1",
    ),
    _long(
        "cosformer-dtype-positions",
        cosformer_dtype_positions,
        "cosformer",
        True,
        "positions torch.arange(N, dtype=q.dtype): rounded past 2048 (float16), 256 "
        "(bfloat16), 2^24 (float32); inf, so NaN, past 65504 in float16",
    ),
    _long(
        "nan-past-length",
        nan_past_length,
        "elu",
        True,
        "the state is scaled by 1/sqrt(t) with the token count t in int16: it wraps at "
        "32768 and every later query is NaN",
    ),
    _long(
        "state-rounded-per-chunk",
        state_rounded_per_chunk,
        "elu",
        True,
        "the state handed from one 4096-token block to the next is rounded to bfloat16 "
        "whatever the input dtype: the error grows with the number of blocks",
    ),
    _long(
        "error-linear-in-n",
        error_linear_in_n,
        "elu",
        True,
        "S (not z) leaks 2^-28 (float64: 2^-57) per token: a relative error ~ 2^-29 i at "
        "row i, ~1.2e-4 at 2^16",
    ),
    _long(
        "noncausal-fp16-normaliser",
        noncausal_fp16_normaliser,
        "elu",
        False,
        "the normaliser sum_j phi(k_j) is accumulated in float16 (Kahan-compensated): NaN "
        "for N beyond ~56k",
    ),
    Entry(
        "quadratic-weights-claiming-linear",
        quadratic_weights,
        "elu",
        True,
        broken=True,
        bug="N x N weights materialised under a claim of linear cost: 16 GiB at N = 2^16",
        caught_by=("scaling", "long-context"),
        long=True,
    ),
    _correct(
        "elu-chunk256-long",
        elu_chunk256,
        "elu",
        True,
        "tiles of 256 tokens, the float32 state summed tile by tile",
    ),
    _correct(
        "elu-cumsum-normaliser",
        elu_cumsum_normaliser,
        "elu",
        True,
        "the normaliser per token by cumsum over N, the numerator chunked in tiles of 64",
    ),
    _correct(
        "elu-segments-carried",
        elu_segments_carried,
        "elu",
        True,
        "segments of 65536 tokens with the state carried between them",
    ),
    _correct(
        "cosformer-int-positions",
        cosformer_int_positions,
        "cosformer",
        True,
        "int64 positions, float64 angles, chunked in tiles of 64",
    ),
    _correct(
        "elu-noncausal-textbook",
        elu_noncausal_textbook,
        "elu",
        False,
        "F.elu(x) + 1 in float32, the normaliser summed in float32",
    ),
)
