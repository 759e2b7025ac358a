"""Backward passes at length (vet --grad's gradient-length check): simple GLA's gates,
fn(q, k, v, g=(B, H, N)), unnormalised identity features, whose forward is long_decay.py's
chunked kernel and whose backward is written by hand as a fast kernel's is: dq, dk, dv
through torch's autograd of that forward, and the gates' gradient from them,

    dL/dG_s = q_s . dq_s - k_s . dk_s,   dL/dg_t = sum_(s>=t) dL/dG_s

(the prefix sums' gradient and its reverse cumulative sum; Yang et al. 2024, GLA, sec.
4.2). A broken one runs the backward's reverse pass over segments of SEGMENT tokens whose
state gradient dS is not handed from one to the next (a backward grid split along the
sequence, fla #906's class in the backward): exact at N = 65 and up to SEGMENT tokens,
wrong for the keys whose queries lie in a later segment from SEGMENT + 1 on.
"""

from __future__ import annotations

import torch

from . import Entry
from .broken import _widen
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
)  # fmt: skip
