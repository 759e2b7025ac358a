"""Triton kernels of our own, run in Triton's interpreter (--triton interpret): causal,
unnormalised linear attention with identity features, out_i = sum_(j<=i) (q_i . k_j) v_j, in
chunks of BT tokens (the chunk form: an intra-chunk masked q k^T, plus q times the state S =
sum of k_j v_j^T over the earlier chunks), one program per (batch x head, block of BV value
columns). BT is autotuned over AUTOTUNED; the broken ones each carry one bug of a class only
raw-pointer code has. test_zoo vets them with the smallest plan (VetOptions.smallest: every
check on one typical case per dtype), as CI vets fla's Triton kernels: each of their bugs
shows on typical inputs, and a call takes a tenth of a second to seconds in the interpreter.
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
def _chunk_kernel(q, k, v, o, T, K, V,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  MASK_LAST: tl.constexpr, SKIP_LAST: tl.constexpr,
                  STATE_ROWS: tl.constexpr):  # fmt: skip
    i_bh = tl.program_id(0).to(tl.int64)
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
        t = i_t.to(tl.int64) * BT + rows
        keep = t < T
        if not MASK_LAST:
            keep = t >= 0  # every row of the last block, past T too
        mask_k = keep[:, None] & (cols_k[None, :] < K)
        mask_v = keep[:, None] & (cols_v[None, :] < V)
        b_q = tl.load(q + (i_bh * T + t[:, None]) * K + cols_k[None, :], mask=mask_k, other=0.0)
        b_k = tl.load(k + (i_bh * T + t[:, None]) * K + cols_k[None, :], mask=mask_k, other=0.0)
        b_v = tl.load(v + (i_bh * T + t[:, None]) * V + cols_v[None, :], mask=mask_v, other=0.0)
        scores = tl.dot(b_q, tl.trans(b_k))
        scores = tl.where(rows[:, None] >= rows[None, :], scores, 0.0)
        b_o = tl.dot(scores.to(b_v.dtype), b_v) + tl.dot(b_q, state.to(b_q.dtype))
        store = (t[:, None] < T) & (cols_v[None, :] < V)
        tl.store(o + (i_bh * T + t[:, None]) * V + cols_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=store)  # fmt: skip
        if STATE_ROWS:  # only the first 16 rows of the chunk enter the state
            b_k = tl.where(rows[:, None] < 16, b_k, 0.0)
        state += tl.dot(tl.trans(b_k), b_v).to(acc)


_TUNED = triton.autotune(AUTOTUNED, key=["T", "K", "V"])(_chunk_kernel)


def _attention(mask_last=True, skip_last=False, state_rows=False):
    """fn(q, k, v) -> out, (B, H, N, d) in and (B, H, N, dv) out, through the kernel."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, n, d = q.shape
        dv = v.shape[-1]
        q, k, v = (t.contiguous() for t in (q, k, v))
        o = torch.empty_like(v)
        bk, bv = max(16, triton.next_power_of_2(d)), max(16, min(64, triton.next_power_of_2(dv)))
        grid = (b * h, triton.cdiv(dv, bv))
        _TUNED[grid](q, k, v, o, n, d, dv, BK=bk, BV=bv, MASK_LAST=mask_last,
                     SKIP_LAST=skip_last, STATE_ROWS=state_rows)  # fmt: skip
        return o

    return attention


triton_chunked = _attention()
triton_unmasked_last_block = _attention(mask_last=False)
triton_last_block_skipped = _attention(skip_last=True)
triton_state_of_16_rows = _attention(state_rows=True)

_SPEC = {"feature_map": "identity", "causal": True, "normalize": False, "triton": True}

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
)  # fmt: skip
