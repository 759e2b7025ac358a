"""Hand-written backward passes (torch.autograd.Function) under a correct forward: the bugs
that live in training kernels' backward and that only the gradient checks can see.

The forward is lv.attention's quadratic elu form; the backward is the quadratic chain rule
in float64 (A = phi(Q) phi(K)^T masked, out = A V / A 1):
    dnum = G / D,  dD = -(G . out) / D,  dA = dnum V^T + dD 1^T (masked),
    dphi(Q) = dA phi(K),  dphi(K) = dA^T phi(Q),  dV = A^T dnum,
    dQ = dphi(Q) * elu'(Q) with elu'(x) = 1 for x > 0, exp(x) below (elu + 1 is C^1).
"""

from __future__ import annotations

import torch
from torch import Tensor

import linattn_verify as lv

from . import Entry

BUGS = (None, "dk-transposed", "backward-ignores-mask", "no-normaliser-derivative")


def _elu1(x: Tensor) -> tuple[Tensor, Tensor]:
    """elu(x) + 1 and its derivative."""
    return torch.nn.functional.elu(x) + 1, torch.where(x > 0, 1.0, torch.exp(x))


class _HandWritten(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, bug: str | None):
        ctx.save_for_backward(q, k, v)
        ctx.causal, ctx.bug = causal, bug
        return lv.attention(q, k, v, "elu", causal, form="quadratic")

    @staticmethod
    def backward(ctx, g):
        q, k, v = (t.double() for t in ctx.saved_tensors)
        (fq, dfq_dq), (fk, dfk_dk) = _elu1(q), _elu1(k)
        a = fq @ fk.transpose(-2, -1)
        mask = torch.ones_like(a, dtype=torch.bool).tril() if ctx.causal else None
        if mask is not None:
            a = a * mask
        den = a.sum(-1, keepdim=True)
        out = (a @ v) / den
        dnum = g.double() / den
        dden = -(dnum * out).sum(-1, keepdim=True)
        if ctx.bug == "no-normaliser-derivative":
            dden = torch.zeros_like(dden)
        da = dnum @ v.transpose(-2, -1) + dden
        if mask is not None and ctx.bug != "backward-ignores-mask":
            da = da * mask
        dphi_k = (da if ctx.bug == "dk-transposed" else da.transpose(-2, -1)) @ fq
        grads = (da @ fk) * dfq_dq, dphi_k * dfk_dk, a.transpose(-2, -1) @ dnum
        return (*(t.to(g.dtype) for t in grads), None, None)


def hand_written(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """The bug-free backward (tests/test_gradient_checks.py: it is right on moderate inputs; at
    the regime's extremes its plain float64 features give 0/0, so it is not a zoo entry)."""
    return _HandWritten.apply(q, k, v, causal, None)


def dk_transposed(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _HandWritten.apply(q, k, v, False, "dk-transposed")


def backward_ignores_mask(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _HandWritten.apply(q, k, v, True, "backward-ignores-mask")


def no_normaliser_derivative(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _HandWritten.apply(q, k, v, True, "no-normaliser-derivative")


class _HalfDqDk(torch.autograd.Function):
    """Performer-positive whose backward rounds dq and dk through float16 (a kernel that
    keeps its query and key gradients in half precision), dv left as it is."""

    @staticmethod
    def forward(ctx, q, k, v, w):
        ctx.save_for_backward(q, k, v, w)
        return lv.attention(q, k, v, "performer-positive", projection=w, form="linear")

    @staticmethod
    def backward(ctx, g):
        q, k, v, w = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out = lv.attention(*leaves, "performer-positive", projection=w, form="linear")
            dq, dk, dv = torch.autograd.grad(out, leaves, g)
        return dq.half().to(q.dtype), dk.half().to(k.dtype), dv, None


def half_dq_dk(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    return _HalfDqDk.apply(q, k, v, projection)


ENTRIES: tuple[Entry, ...] = (
    Entry(
        "backward-dk-transposed",
        dk_transposed,
        "elu",
        False,
        broken=True,
        bug="dphi(K) = dA phi(Q) instead of dA^T phi(Q): the wrong dk term",
        grad=True,
        cost="quadratic",
        caught_by=("gradient",),
    ),
    Entry(
        "backward-half-precision-dq-dk",
        half_dq_dk,
        "performer-positive",
        False,
        broken=True,
        bug="dq and dk rounded through float16 in a float32/float64 backward (dv exact)",
        grad=True,
        caught_by=("gradient",),
    ),
    Entry(
        "backward-ignores-causal-mask",
        backward_ignores_mask,
        "elu",
        True,
        broken=True,
        bug="the backward forgets the causal mask of dA: dk_j takes G_i of queries i < j",
        grad=True,
        cost="quadratic",
        caught_by=("gradient-causality", "gradient"),
    ),
    Entry(
        "backward-drops-normaliser-derivative",
        no_normaliser_derivative,
        "elu",
        True,
        broken=True,
        bug="the backward treats the denominator as a constant (dD = 0)",
        grad=True,
        cost="quadratic",
        caught_by=("gradient",),
        smallest=True,
    ),
)
