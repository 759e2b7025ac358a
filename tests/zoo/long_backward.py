"""Backward passes at length (vet --grad's gradient-length check).

Simple GLA's gates,
fn(q, k, v, g=(B, H, N)), unnormalised identity features, whose forward is long_decay.py's
chunked kernel and whose backward is written by hand as a fast kernel's is: dq, dk, dv
through torch's autograd of that forward, and the gates' gradient from them,

    dL/dG_s = q_s . dq_s - k_s . dk_s,   dL/dg_t = sum_(s>=t) dL/dG_s

(the prefix sums' gradient and its reverse cumulative sum; Yang et al. 2024, GLA, sec.
4.2). A broken one runs the backward's reverse pass over segments of SEGMENT tokens whose
state gradient dS is not handed from one to the next (a backward grid split along the
sequence, fla #906's class in the backward): exact at N = 65 and up to SEGMENT tokens,
wrong for the keys whose queries lie in a later segment from SEGMENT + 1 on.

The plain spec (elu + 1, normalised, causal) with its backward by hand, the quotient rule
on out_i = N_i / D_i (N_i = phi(q_i) S_i, D_i = phi(q_i) . z_i, S and z the prefix sums of
phi(k_j) v_j^T and phi(k_j)): dL/dN_i = G_i / D_i, dL/dD_i = -(G_i . N_i) / D_i^2, then
dphi(q_i) = S_i dN_i + dD_i z_i and, through the reverse prefix sums, dphi(k_j) = sum_(i>=j)
phi(q_i) (dN_i . v_j + dD_i), dv_j = sum_(i>=j) (phi(q_i) . phi(k_j)) dN_i. A broken one
squares the normaliser in the input dtype: D grows with N (some 22 a token at d = 16), so
in float16 D_i^2 passes 65504 from D_i = 256 and dD_i becomes 0 (dq and dk lose the
denominator's term), and in bfloat16 D_i^2 is rounded to 8 bits. Not a bug of length
alone: the gradient check finds it at N = 9 too (d = 8, magnitude 2.8: D_i passes 256 by
then), and gradient-length at its first N, 256 (tests/test_gradient_length.py).
"""

from __future__ import annotations

import torch

from . import Entry
from .broken import _elu1, _widen
from .long_decay import _chunked, _gate_tiles

SEGMENT = 2048  # tokens per segment of the broken backward's reverse pass


def _forward(q, k, v, g):
    """out in the compute dtype (float32; float64 for float64 inputs)."""
    return _chunked(q, k, v, _gate_tiles(g, q.dtype), 1.0)[0]


class _HandBackward(torch.autograd.Function):
    """The chunked forward with the backward of the module docstring; `segment`: dk and dv
    from the queries of their own segment of that many tokens alone (None: all)."""

    @staticmethod
    def forward(ctx, q, k, v, g, segment):
        ctx.save_for_backward(q, k, v, g)
        ctx.segment = segment
        qc, kc, vc = _widen(q, k, v)
        return _forward(qc, kc, vc, g).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, g = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(True) for t in _widen(q, k, v)]
        g, cotangent = g.detach(), grad_out.to(leaves[0].dtype)
        with torch.enable_grad():
            out = _forward(*leaves, g)
            dq, dk, dv = torch.autograd.grad(out, leaves, cotangent)
            if ctx.segment:  # dS reset at each segment's end: its own queries alone
                parts = [
                    _forward(
                        *(t[:, :, a : a + ctx.segment] for t in leaves), g[..., a : a + ctx.segment]
                    )
                    for a in range(0, g.shape[-1], ctx.segment)
                ]
                dk, dv = torch.autograd.grad(torch.cat(parts, dim=2), leaves[1:], cotangent)
        qc, kc = leaves[0].detach(), leaves[1].detach()
        per_token = (qc * dq).sum(-1) - (kc * dk).sum(-1)  # dL/dG_s
        dg = torch.flip(torch.cumsum(torch.flip(per_token, [-1]), dim=-1), [-1])
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype), None


def gates_hand_backward(q, k, v, g):
    """Simple GLA, its backward by hand (module docstring)."""
    return _HandBackward.apply(q, k, v, g, None)


def gates_dh_reset(q, k, v, g):
    """BUG: the backward's state gradient dS reset every SEGMENT tokens."""
    return _HandBackward.apply(q, k, v, g, SEGMENT)


class _QuotientBackward(torch.autograd.Function):
    """The plain spec's forward in the compute dtype and the quotient rule's backward
    (module docstring); `narrow`: D^2 formed in the input dtype."""

    @staticmethod
    def forward(ctx, q, k, v, narrow):
        ctx.save_for_backward(q, k, v)
        ctx.narrow = narrow
        qc, kc, vc = _widen(q, k, v)
        fq, fk = _elu1(qc), _elu1(kc)
        states = torch.cumsum(fk[..., :, None] * vc[..., None, :], dim=2)  # S_i
        numer = torch.einsum("bhnm,bhnmc->bhnc", fq, states)
        denom = (fq * torch.cumsum(fk, dim=2)).sum(-1, keepdim=True)
        return (numer / denom).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        qc, kc, vc, gc = _widen(q, k, v, grad_out)
        fq, fk = _elu1(qc), _elu1(kc)
        states = torch.cumsum(fk[..., :, None] * vc[..., None, :], dim=2)
        sums = torch.cumsum(fk, dim=2)  # z_i
        numer = torch.einsum("bhnm,bhnmc->bhnc", fq, states)
        denom = (fq * sums).sum(-1, keepdim=True)
        square = denom.to(q.dtype) ** 2 if ctx.narrow else denom**2
        d_numer = gc / denom
        d_denom = -(gc * numer).sum(-1, keepdim=True) / square.to(denom.dtype)
        d_fq = torch.einsum("bhnmc,bhnc->bhnm", states, d_numer) + d_denom * sums

        def later(t):  # sum over i >= j
            return torch.flip(torch.cumsum(torch.flip(t, [2]), dim=2), [2])

        outer = later(fq[..., :, None] * d_numer[..., None, :])  # sum_(i>=j) phi(q_i) dN_i^T
        d_fk = torch.einsum("bhnmc,bhnc->bhnm", outer, vc) + later(fq * d_denom)
        dv = torch.einsum("bhnmc,bhnm->bhnc", outer, fk)

        def through_elu1(x, f, grad):  # phi'(x) = 1 above 0, exp(x) = phi(x) below
            return grad * torch.where(x > 0, torch.ones_like(f), f)

        dq, dk = through_elu1(qc, fq, d_fq), through_elu1(kc, fk, d_fk)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def plain_hand_backward(q, k, v):
    """The plain spec, its backward by hand (module docstring)."""
    return _QuotientBackward.apply(q, k, v, False)


def plain_square_narrow(q, k, v):
    """BUG: the normaliser squared in the input dtype (float16: inf from D = 256)."""
    return _QuotientBackward.apply(q, k, v, True)


def _entry(name, fn, broken: bool, bug: str) -> Entry:
    caught_by = ("gradient-length",) if broken else ()
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by, decay="gates",
                 normalize=False, grad=True, long=True)  # fmt: skip


ENTRIES: tuple[Entry, ...] = (
    _entry("long-gates-hand-backward", gates_hand_backward, False,
           "correct: dq, dk, dv by autograd, dg from them, its reverse cumsum in float32"),
    _entry("long-gates-dh-reset", gates_dh_reset, True,
           "the backward's state gradient is not handed between segments of 2048 tokens: "
           "exact to N = 2048, dk, dv and dg wrong from 2049"),
    # vet's zoo run at N <= 65 (the gradient check finds the bug there too; a whole long
    # run costs CI a minute each): tests/test_gradient_length.py runs both at length
    Entry("plain-hand-backward", plain_hand_backward, "elu", True, False,
          "correct: the quotient rule by hand, D^2 in float32", grad=True),
    Entry("plain-square-narrow", plain_square_narrow, "elu", True, True,
          "the normaliser squared in the input dtype: D^2 overflows float16 from D = 256",
          caught_by=("gradient",), grad=True),
)  # fmt: skip
