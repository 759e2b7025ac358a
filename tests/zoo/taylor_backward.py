"""A Taylor (Based) kernel's backward at length (vet --grad's gradient-length check).

The causal normalised Taylor map (Arora et al. 2024, sec. 3: a_ij = 1 + s_ij + s_ij^2 / 2,
s_ij = q_i . k_j / sqrt(d), the kernel of phi(x) = [1, x', vec(x' x'^T) / sqrt(2)]),
forward in the quadratic form in float32 (float64 for float64 inputs), backward through
torch's autograd of that forward. A broken one takes dk and dv from the queries of their
own segment of SEGMENT tokens alone: a backward grid split along the sequence whose
key-side accumulators (the reverse sums over i >= j) are not handed from one block to the
next, fla #906's class in a Based backward. Exact up to SEGMENT tokens, so no check at
N <= 65 sees it; gradient-length passes it at 256 and fails it at 1024
(tests/test_gradient_length.py), the map's first long backward check.
"""

from __future__ import annotations

import math

import torch

from .broken import _widen

SEGMENT = 512  # tokens per segment of the broken backward's key-side sums


def _forward(q, k, v):
    """out of the causal normalised Taylor map, quadratic form, in the inputs' dtype."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    a = torch.tril(1 + s + s * s / 2)
    return (a @ v) / a.sum(-1, keepdim=True)


class _Backward(torch.autograd.Function):
    """The forward of _forward, widened; `segment`: dk and dv from the queries of their
    own segment of that many tokens alone (None: all)."""

    @staticmethod
    def forward(ctx, q, k, v, segment):
        ctx.save_for_backward(q, k, v)
        ctx.segment = segment
        return _forward(*_widen(q, k, v)).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in _widen(q, k, v)]
        cotangent = grad_out.to(leaves[0].dtype)
        with torch.enable_grad():
            dq, dk, dv = torch.autograd.grad(_forward(*leaves), leaves, cotangent)
            if ctx.segment:  # the key-side sums reset at each segment's end
                n, size = q.shape[2], ctx.segment
                parts = [
                    _forward(*(t[:, :, a : a + size] for t in leaves)) for a in range(0, n, size)
                ]
                dk, dv = torch.autograd.grad(torch.cat(parts, dim=2), leaves[1:], cotangent)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def taylor_backward(q, k, v):
    """The causal Taylor map, its backward by autograd of the whole sequence (correct)."""
    return _Backward.apply(q, k, v, None)


def taylor_segment_reset(q, k, v):
    """BUG: dk and dv from the queries of their own SEGMENT tokens alone."""
    return _Backward.apply(q, k, v, SEGMENT)
