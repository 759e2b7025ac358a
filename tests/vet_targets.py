"""Implementations for the vet tests, loaded by path in vet's worker process: a correct one,
and ones that raise, crash the process, or hang."""

import ctypes
import os
import sys
import time

import torch

import linattn_verify as lv


def elu_linear(q, k, v):
    return lv.attention(q, k, v, "elu", form="linear")


def printing(q, k, v):
    """elu_linear that prints on every call: to stdout, to stderr and at file descriptor 1
    (as a C library would)."""
    print("kernel says hello")
    print("kernel warns", file=sys.stderr)
    os.write(1, b"kernel writes to fd 1\n")
    return elu_linear(q, k, v)


def with_state(q, k, v):
    """elu_linear returning (output, state) undeclared (no --state)."""
    return elu_linear(q, k, v), torch.zeros(1)


def transposed(q, k, v):
    """elu_linear returning its output in the other layout, (B, N, H, dv)."""
    return elu_linear(q, k, v).transpose(1, 2).contiguous()


def upcast(q, k, v):
    """elu_linear returning float32 whatever its inputs' dtype."""
    return elu_linear(q.double(), k.double(), v.double()).float()


def without_gates(q, k, v):
    """Plain identity attention: takes no g= (the decay gates' keyword)."""
    return lv.attention(q, k, v, "identity", causal=True, normalize=False, form="quadratic")


def no_float32(q, k, v):
    """elu_linear refusing float32 inputs, as fla's chunk_delta_rule asserts."""
    assert q.dtype != torch.float32, "does not support float32. Please use bfloat16."
    return elu_linear(q, k, v)


def small_heads(q, k, v):
    """elu_linear refusing d > 16, as fla's fused_chunk_based asserts."""
    assert q.shape[-1] <= 16, "only support feature dimension up to 16."
    return elu_linear(q, k, v)


class _EvenBackward(torch.autograd.Function):
    """q, k, v as they are, whose backward refuses odd d or dv in 16-bit dtypes, as fla's
    chunk_bwd_dv asserts."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.clone(), k.clone(), v.clone()

    @staticmethod
    def backward(ctx, dq, dk, dv):
        if dq.dtype in (torch.float16, torch.bfloat16):
            assert dq.shape[-1] % 2 == 0 and dv.shape[-1] % 2 == 0, "requires even K and V"
        return dq, dk, dv


def even_backward(q, k, v):
    """elu_linear whose backward refuses odd d or dv in float16 and bfloat16."""
    return elu_linear(*_EvenBackward.apply(q, k, v))


def raising(q, k, v):
    raise ValueError("this kernel always fails")


def crashing(q, k, v):
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def hanging(q, k, v):
    time.sleep(3600)


def performer(q, k, v, projection):
    return lv.attention(q, k, v, "performer-positive", projection=projection, form="linear")


def bf16_state_elu(q, k, v):
    """Causal elu attention whose prefix state S, z is rounded to bfloat16: a kernel less
    accurate than its dtype allows."""
    import torch

    fq, fk = (torch.nn.functional.elu(t.float()) + 1 for t in (q, k))
    s = torch.cumsum(fk.unsqueeze(-1) * v.float().unsqueeze(-2), dim=2).bfloat16().float()
    z = torch.cumsum(fk, dim=2).bfloat16().float()
    num = (fq.unsqueeze(-1) * s).sum(dim=-2)
    return (num / (fq * z).sum(dim=-1, keepdim=True)).to(q.dtype)


def small_heads_only(q, k, v):
    """elu linear attention for heads of d <= 16 only (as some fused kernels are)."""
    if q.shape[-1] > 16:
        raise ValueError(f"head dimension {q.shape[-1]} > 16 is not supported")
    return lv.attention(q, k, v, "elu", form="linear")


def forward_only(q, k, v):
    """elu linear attention computed without a backward."""
    import torch

    with torch.no_grad():
        return lv.attention(q, k, v, "elu", form="linear")


def crashing_past_8_tokens(q, k, v):
    """Correct up to N = 8, then the process dies (as an out-of-bounds write would)."""
    import os

    if q.shape[2] > 8:
        os._exit(3)
    return lv.attention(q, k, v, "elu", form="linear")


def one_column(q, k, v):
    """Only the first output column: a wrong shape on every input."""
    return lv.attention(q, k, v, "elu", form="linear")[..., :1]


def ten_percent_high(q, k, v):
    """elu linear attention 10 % too large: wrong everywhere, by a known factor."""
    return 1.1 * lv.attention(q, k, v, "elu", form="linear")


def square_heads_only_and_high(q, k, v):
    """Raises unless d == dv (a contract breach), and 10 % too large where it runs."""
    if q.shape[-1] != v.shape[-1]:
        raise ValueError("d != dv is not supported")
    return 1.1 * lv.attention(q, k, v, "elu", form="linear")


def contiguous_only_and_no_large(q, k, v):
    """Raises on non-contiguous inputs (a layout bug, typical) and on |x| > 50 (a contract
    breach on extreme inputs only): the second must not hide the first."""
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise ValueError("non-contiguous input")
    if max(q.abs().max(), k.abs().max()) > 50:
        raise ValueError("inputs beyond 50")
    return lv.attention(q, k, v, "elu", form="linear")


def relu_zero_for_nan(q, k, v):
    """relu linear attention returning 0 where the exact value is 0/0 (it must be NaN)."""
    return torch.nan_to_num(lv.attention(q, k, v, "relu", form="linear"), nan=0.0)
