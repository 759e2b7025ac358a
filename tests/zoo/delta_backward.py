"""The delta rule's backward written by hand (torch.autograd.Function) under the zoo's correct
recurrent forward (delta._recurrent): the bugs of a training kernel's backward, which only
the gradient checks see. The reverse mode of S <- D_t S, u_t = v_t - S^T k_t,
S <- S + beta_t k_t u_t^T, o_t = S^T q_t (families/delta/gradients.py derives it), in the
forward's compute dtype (float32 for float16, bfloat16 and float32; float64 for float64):
with y_t = D_t S_(t-1) and Lam = dL/dS_t, from Lam = dL/dS_N (0 without a state),

    Lam += q_t G_t^T;  dq_t = S_t G_t;  dv_t = beta_t Lam^T k_t;  dbeta_t = k_t^T Lam u_t;
    dk_t = beta_t (Lam u_t - y_t Lam^T k_t);  Lam' = Lam - beta_t k_t (k_t^T Lam);
    dg_t = sum y_t . Lam' (per key channel for channel gates);  Lam <- D_t Lam',

and dL/dS_0 the last Lam.

`adjoint_reset`: the reverse pass over segments of SEGMENT tokens whose adjoint Lam is not
handed from one to the next (a backward grid split along the sequence): exact to N =
SEGMENT (the gradient checks' N <= 65 cannot see it), wrong from SEGMENT + 1 (vet's
gradient-length at its first N past it; tests/test_gradient_length.py)."""

from __future__ import annotations

import torch

from . import Entry
from .broken import _widen
from .delta import _recurrent

SEGMENT = 512  # tokens per segment of adjoint_reset's reverse pass


def _factors(g, like):
    """D_t per token as (B, H, N, d or 1, 1) factors in like's dtype, or None."""
    if g is None:
        return None
    decay = torch.exp(g.to(like.dtype))
    return decay[..., None, None] if g.dim() == 3 else decay[..., None]


def _states(qc, kc, vc, bc, factors, s0):
    """(y_t, S_t) for every token, each (B, H, d, dv), by the forward recurrence."""
    s = s0
    ys, ss = [], []
    for t in range(qc.shape[2]):
        y = s if factors is None else factors[:, :, t] * s
        u = vc[:, :, t] - torch.einsum("bhm,bhmc->bhc", kc[:, :, t], y)
        s = y + kc[:, :, t, :, None] * (bc[:, :, t, None] * u)[:, :, None, :]
        ys.append(y)
        ss.append(s)
    return ys, ss


class _HandWritten(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, beta, g, s0, flaw):
        ctx.save_for_backward(q, k, v, beta, g, s0)
        ctx.flaw = flaw
        return _recurrent(q, k, v, beta, g, s0)

    @staticmethod
    def backward(ctx, g_out, g_final):
        q, k, v, beta, g, s0 = ctx.saved_tensors
        flaw = ctx.flaw
        qc, kc, vc, bc, gc = _widen(q, k, v, beta, g_out)
        factors = _factors(g, qc)
        shape = (*qc.shape[:2], qc.shape[-1], vc.shape[-1])
        start = qc.new_zeros(shape) if s0 is None else s0.to(qc.dtype)
        ys, ss = _states(qc, kc, vc, bc, factors, start)
        lam = qc.new_zeros(shape) if g_final is None else g_final.to(qc.dtype)
        grads = {name: torch.zeros_like(t) for name, t in (("q", qc), ("k", kc), ("v", vc))}
        grads["beta"] = torch.zeros_like(bc)
        grads["g"] = None if g is None else torch.zeros_like(g, dtype=qc.dtype)
        for t in reversed(range(qc.shape[2])):
            kt, bt, y = kc[:, :, t], bc[:, :, t, None], ys[t]
            lam = lam + qc[:, :, t, :, None] * gc[:, :, t, None, :]
            grads["q"][:, :, t] = torch.einsum("bhmc,bhc->bhm", ss[t], gc[:, :, t])
            read = torch.einsum("bhm,bhmc->bhc", kt, lam)  # Lam^T k_t
            u = vc[:, :, t] - torch.einsum("bhm,bhmc->bhc", kt, y)
            grads["v"][:, :, t] = bt * read
            grads["beta"][:, :, t] = (read * (vc[:, :, t] if flaw == "dbeta-v" else u)).sum(-1)
            grads["k"][:, :, t] = bt * (
                torch.einsum("bhmc,bhc->bhm", lam, u) - torch.einsum("bhmc,bhc->bhm", y, read)
            )
            prime = lam - kt[..., None] * (bt * read)[:, :, None, :]
            if g is not None:
                seen = ss[t] if flaw == "dg-after-update" else y
                per_channel = (seen * prime).sum(-1)  # (B, H, d)
                grads["g"][:, :, t] = per_channel if g.dim() == 4 else per_channel.sum(-1)
            if flaw == "adjoint-skips-erase":
                prime = lam
            if factors is not None and not (flaw == "dh0-without-gate" and t == 0):
                prime = factors[:, :, t] * prime
            lam = prime
            if flaw == "adjoint-reset" and t % SEGMENT == 0:
                lam = torch.zeros_like(lam)
        ds0 = None if s0 is None else lam.to(s0.dtype)
        out = [grads[n].to(t.dtype) for n, t in (("q", q), ("k", k), ("v", v), ("beta", beta))]
        dg = None if g is None else grads["g"].to(g.dtype)
        return *out, dg, ds0, None


def _hand_written(flaw: str | None, state: bool):
    """fn(q, k, v, beta[, g][, initial_state]) under the hand-written backward with flaw."""

    def fn(q, k, v, beta, g=None, initial_state=None):
        out, final = _HandWritten.apply(q, k, v, beta, g, initial_state, flaw)
        return (out, final) if state else out

    return fn


def hand_backward(q, k, v, beta, g=None):
    """The reverse recurrence by hand, correct: adjoint_reset's twin."""
    return _hand_written(None, False)(q, k, v, beta, g)


def adjoint_reset(q, k, v, beta, g=None):
    """BUG: the adjoint Lam dropped every SEGMENT tokens of the reverse pass."""
    return _hand_written("adjoint-reset", False)(q, k, v, beta, g)


def _entry(name, flaw, bug, caught_by=(), decay=None, state=False, smallest=True) -> Entry:
    """At the smallest plan but for the first correct one: their forward is its."""
    return Entry(name, _hand_written(flaw, state), "identity", True, flaw is not None, bug,
                 caught_by=caught_by, decay=decay, normalize=False, delta_rule=True,
                 grad=True, state="S" if state else None, smallest=smallest)  # fmt: skip


GRADIENTS = ("gradient", "gradient-associativity")
ENTRIES = (
    _entry(
        "gated-delta-hand-backward",
        None,
        "correct: the reverse recurrence by hand, scalar gates, its state S",
        decay="gates",
        state=True,
        smallest=False,
    ),
    _entry(
        "delta-hand-backward",
        None,
        "correct: the same without a decay, the twin of the mutants below at their plan",
    ),
    _entry(
        "kda-hand-backward",
        None,
        "correct: the same with channel gates and a state, at the mutants' plan",
        decay="channel-gates",
        state=True,
    ),
    _entry(
        "delta-dbeta-v",
        "dbeta-v",
        "dbeta_t = k_t^T Lam v_t: the value for the residual u_t = v_t - S^T k_t",
        GRADIENTS,
    ),
    _entry(
        "delta-adjoint-skips-erase",
        "adjoint-skips-erase",
        "the adjoint carried back without the erasure: Lam <- Lam, not (I - beta k k^T) Lam",
        GRADIENTS,
    ),
    _entry(
        "kda-dg-after-update",
        "dg-after-update",
        "dg_t from the updated state S_t instead of y_t = D_t S_(t-1)",
        GRADIENTS,
        decay="channel-gates",
    ),
    _entry(
        "gated-delta-dh0-without-gate",
        "dh0-without-gate",
        "dL/dS_0 misses the first token's gate (fla #1140's class: dh0 wrong, outputs right)",
        ("state-gradient",),
        decay="gates",
        state=True,
    ),
)
