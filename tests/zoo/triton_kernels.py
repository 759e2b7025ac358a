"""Triton kernels of our own, run in Triton's interpreter (--triton interpret), in chunks of BT
tokens (the chunk form: an intra-chunk masked q k^T, plus q times the state S = sum of
k_j v_j^T over the earlier chunks), one program per (batch x head, block of BV value columns):
causal, unnormalised linear attention with identity features, out_i = sum_(j<=i) (q_i . k_j)
v_j, with BT autotuned over AUTOTUNED; and causal elu + 1 attention, normalised (the
normaliser z = sum of phi(k_j) carried beside S), for the long-context check. The broken ones
each carry one bug of a class only raw-pointer code has, or a state held in the input's dtype.
test_zoo vets them with the smallest plan (VetOptions.smallest: every check on one typical
case per dtype, long context to SMALLEST_LONGEST for the long entries), as CI vets fla's
Triton kernels: a call takes a tenth of a second to seconds in the interpreter.
"""

from __future__ import annotations

from linattn_verify import triton_interpret

triton_interpret.enable()  # before triton.jit decorates the kernels below

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from . import Entry  # noqa: E402

AUTOTUNED = [triton.Config({"BT": bt}, num_warps=w) for bt in (16, 32) for w in (2, 4)]


@triton.jit
def _rows(x, i_bh, T, t, width, cols, mask):
    """Rows t of head i_bh of x (B H, T, width), columns cols, 0 where not mask."""
    return tl.load(x + (i_bh * T + t[:, None]) * width + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _chunk_kernel(q, k, v, o, T, K, V,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  MASK_LAST: tl.constexpr, SKIP_LAST: tl.constexpr,
                  STATE_ROWS: tl.constexpr, INT32_OFFSETS: tl.constexpr,
                  HALF_STATE: tl.constexpr):  # fmt: skip
    i_bh = tl.program_id(0)
    if not INT32_OFFSETS:
        i_bh = i_bh.to(tl.int64)
    i_v = tl.program_id(1)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    rows = tl.arange(0, BT)
    acc = q.dtype.element_ty  # float64 stays float64; half precision accumulates in float32
    if acc != tl.float64:
        acc = tl.float32
    state = tl.zeros([BK, BV], dtype=acc)
    chunks = tl.cdiv(T, BT) - SKIP_LAST
    for i_t in range(0, chunks):
        t = i_t * BT + rows
        if not INT32_OFFSETS:
            t = i_t.to(tl.int64) * BT + rows
        keep = t < T
        if not MASK_LAST:
            keep = t >= 0  # every row of the last block, past T too
        mask_k = keep[:, None] & (cols_k[None, :] < K)
        mask_v = keep[:, None] & (cols_v[None, :] < V)
        b_q = _rows(q, i_bh, T, t, K, cols_k, mask_k)
        b_k = _rows(k, i_bh, T, t, K, cols_k, mask_k)
        b_v = _rows(v, i_bh, T, t, V, cols_v, mask_v)
        scores = tl.dot(b_q, tl.trans(b_k))
        scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
        b_o = tl.dot(scores.to(b_v.dtype), b_v) + tl.dot(b_q, state.to(b_q.dtype))
        store = (t[:, None] < T) & (cols_v[None, :] < V)
        tl.store(o + (i_bh * T + t[:, None]) * V + cols_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=store)  # fmt: skip
        if STATE_ROWS:  # only the first 16 rows of the chunk enter the state
            b_k = tl.where(rows[:, None] < 16, b_k, 0.0)
        state += tl.dot(tl.trans(b_k), b_v).to(acc)
        if HALF_STATE and acc == tl.float32:  # the state stored in float16 between chunks
            state = state.to(tl.float16).to(acc)


@triton.jit
def _elu1(x):
    return tl.where(x > 0, x + 1.0, tl.exp(x))


@triton.jit
def _elu_kernel(q, k, v, o, T, K, V,
                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                STATE_IN_INPUT_DTYPE: tl.constexpr):  # fmt: skip
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    cols_k = tl.arange(0, BK)
    cols_v = i_v * BV + tl.arange(0, BV)
    rows = tl.arange(0, BT)
    acc = q.dtype.element_ty  # float64 stays float64; half precision computes in float32
    if acc != tl.float64:
        acc = tl.float32
    held = q.dtype.element_ty if STATE_IN_INPUT_DTYPE else acc  # S and z between chunks
    state = tl.zeros([BK, BV], dtype=held)
    norm = tl.zeros([BK], dtype=held)
    for i_t in range(0, tl.cdiv(T, BT)):
        t = i_t.to(tl.int64) * BT + rows
        mask_k = (t[:, None] < T) & (cols_k[None, :] < K)
        mask_v = (t[:, None] < T) & (cols_v[None, :] < V)
        b_q = _rows(q, i_bh, T, t, K, cols_k, mask_k)
        b_k = _rows(k, i_bh, T, t, K, cols_k, mask_k)
        b_v = _rows(v, i_bh, T, t, V, cols_v, mask_v)
        f_q = tl.where(mask_k, _elu1(b_q.to(acc)), 0.0)
        f_k = tl.where(mask_k, _elu1(b_k.to(acc)), 0.0)
        b_v = b_v.to(acc)
        scores = tl.dot(f_q, tl.trans(f_k))
        scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
        num = tl.dot(scores, b_v) + tl.dot(f_q, state.to(acc))
        den = tl.sum(scores, axis=1) + tl.sum(f_q * norm.to(acc)[None, :], axis=1)
        store = (t[:, None] < T) & (cols_v[None, :] < V)
        b_o = num / tl.where(t < T, den, 1.0)[:, None]
        tl.store(o + (i_bh * T + t[:, None]) * V + cols_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=store)  # fmt: skip
        state = (state.to(acc) + tl.dot(tl.trans(f_k), b_v)).to(held)
        norm = (norm.to(acc) + tl.sum(f_k, axis=0)).to(held)


_TUNED = triton.autotune(AUTOTUNED, key=["T", "K", "V"])(_chunk_kernel)


def _attention(mask_last=True, skip_last=False, state_rows=False, int32_offsets=False,
               half_state=False):  # fmt: skip
    """fn(q, k, v) -> out, (B, H, N, d) in and (B, H, N, dv) out, through the kernel."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, n, d = q.shape
        dv = v.shape[-1]
        q, k, v = (t.contiguous() for t in (q, k, v))
        o = torch.empty_like(v)
        bk, bv = max(16, triton.next_power_of_2(d)), max(16, min(64, triton.next_power_of_2(dv)))
        grid = (b * h, triton.cdiv(dv, bv))
        _TUNED[grid](q, k, v, o, n, d, dv, BK=bk, BV=bv, MASK_LAST=mask_last,
                     SKIP_LAST=skip_last, STATE_ROWS=state_rows,
                     INT32_OFFSETS=int32_offsets, HALF_STATE=half_state)  # fmt: skip
        return o

    return attention


def _elu_attention(state_in_input_dtype=False):
    """fn(q, k, v) -> out, causal elu + 1 attention, normalised, through _elu_kernel (BT =
    16)."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, n, d = q.shape
        dv = v.shape[-1]
        q, k, v = (t.contiguous() for t in (q, k, v))
        o = torch.empty_like(v)
        bk, bv = max(16, triton.next_power_of_2(d)), max(16, min(64, triton.next_power_of_2(dv)))
        grid = (b * h, triton.cdiv(dv, bv))
        _elu_kernel[grid](q, k, v, o, n, d, dv, BT=16, BK=bk, BV=bv,
                          STATE_IN_INPUT_DTYPE=state_in_input_dtype)  # fmt: skip
        return o

    return attention


triton_chunked = _attention()
triton_unmasked_last_block = _attention(mask_last=False)
triton_last_block_skipped = _attention(skip_last=True)
triton_state_of_16_rows = _attention(state_rows=True)
triton_int32_offsets = _attention(int32_offsets=True)
triton_half_state = _attention(half_state=True)

triton_elu_chunked = _elu_attention()
triton_elu_state_in_input_dtype = _elu_attention(state_in_input_dtype=True)

_SPEC = {"feature_map": "identity", "causal": True, "normalize": False, "triton": True}
_LONG = {"feature_map": "elu", "causal": True, "triton": True, "long": True}

ENTRIES = (
    Entry("triton-chunked", triton_chunked, broken=False,
          bug="a correct Triton chunk kernel: masked last block, state in float32 (float64 for "
              "float64 inputs)", **_SPEC),
    Entry("triton-unmasked-last-block", triton_unmasked_last_block, broken=True,
          bug="the last partial block's loads are not masked: it reads past the end of v (NaN "
              "from the guard bands)", caught_by=("contract",), **_SPEC),
    Entry("triton-last-block-skipped", triton_last_block_skipped, broken=True,
          bug="the block loop stops one block short: the last block's rows are never written",
          caught_by=("contract",), **_SPEC),
    Entry("triton-state-of-16-rows", triton_state_of_16_rows, broken=True,
          bug="the state takes the first 16 rows of each chunk: right with BT = 16, wrong in the "
              "autotune config BT = 32 only", caught_by=("autotune-configs",), **_SPEC),
    Entry("triton-int32-offsets", triton_int32_offsets, broken=True,
          bug="offsets (i_bh T + t) K computed in int32 (the program id not widened): past 2^31 "
              "elements of q they wrap (fla #1080)", caught_by=("int32-offsets",), **_SPEC),
    Entry("triton-half-state-under-tf32", triton_half_state, broken=True,
          bug="the state stored in float16 between chunks (float64 inputs aside), its tl.dots' "
              "products TF32 (--tf32): both err by about 2^-11 in float32; with IEEE products "
              "it still fails, so it is not put down to TF32, and declaring TF32 rescues nothing",
          caught_by=("reference",), tf32=True, **_SPEC),
    Entry("triton-elu-chunked", triton_elu_chunked, broken=False,
          bug="a correct normalised Triton chunk kernel: S and z carried in float32 (float64 "
              "for float64 inputs)", **_LONG),
    Entry("triton-elu-state-in-input-dtype", triton_elu_state_in_input_dtype, broken=True,
          bug="S and z carried from chunk to chunk in the input's dtype: in float16 and "
              "bfloat16 each chunk's sum is rounded into a growing state, an error that grows "
              "with N (within budget at N <= 65)", caught_by=("long-context",), **_LONG),
)  # fmt: skip
