"""Gated linear attention with a gate per key channel (--decay channel-gates: fn(q, k, v,
g=(B, H, N, d)), log-gates g <= 0; out_i = sum_(j<=i) sum_m q_im k_jm exp(G_im - G_jm) v_j,
G the inclusive prefix sums of g; Yang et al. 2024, "Gated Linear Attention Transformers
with Hardware-Efficient Training", sec. 4): correct kernels written two ways and broken ones
of the classes of the public reports. Causal, unnormalised, scale 1, the identity feature
map. float16, bfloat16 and float32 inputs are computed in float32, float64 in float64, the
output cast back once; vectorised over batch and heads."""

from __future__ import annotations

import torch

from . import Entry
from .broken import _widen

CHUNK = 16  # tokens per chunk
SUB = 4  # tokens per sub-chunk of the secondary chunking (GLA, sec. 4.2)


def gla_recurrent(q, k, v, g):
    """The recurrent form, token by token: S_t = diag(exp(g_t)) S_(t-1) + k_t v_t^T,
    o_t = q_t S_t."""
    qc, kc, vc = _widen(q, k, v)
    decay = torch.exp(g.to(qc.dtype))
    s = qc.new_zeros(*qc.shape[:2], qc.shape[-1], vc.shape[-1])
    outs = []
    for t in range(qc.shape[2]):
        s = decay[:, :, t, :, None] * s + kc[:, :, t, :, None] * vc[:, :, t, None, :]
        outs.append((qc[:, :, t, None, :] @ s).squeeze(-2))
    return torch.stack(outs, dim=2).to(q.dtype)


def _intra(qi, ki, b, flaw: str | None):
    """The chunk's (C, C) weights sum_m q_im k_jm exp(b_im - b_jm), j <= i, b the chunk's
    prefix sums: sub-chunks of SUB tokens, a pair of them through the stabiliser, the last
    token r of the key's sub-chunk: (q_i exp(b_i - b_r)) . (k_j exp(b_r - b_j)), both
    factors <= 1; inside a sub-chunk in log space, (C, C, d) factors exp(b_im - b_jm)."""
    n = qi.shape[2]
    weights = qi.new_zeros(*qi.shape[:2], n, n)
    for a in range(0, n, SUB):
        keys = slice(a, min(a + SUB, n))
        r = keys.stop - 1
        logs = b[:, :, keys, None, :] - b[:, :, None, keys, :]
        keep = torch.ones(r - a + 1, r - a + 1, dtype=torch.bool, device=qi.device).tril()
        inside = torch.exp(logs.masked_fill(~keep[..., None], float("-inf")))
        weights[:, :, keys, keys] = torch.einsum("bhim,bhjm,bhijm->bhij", qi[:, :, keys],
                                                 ki[:, :, keys], inside)  # fmt: skip
        if keys.stop >= n:
            continue
        rows = slice(keys.stop, n)
        ref_k = min(r + 1, n - 1) if flaw == "reference-off" else r
        q_side = qi[:, :, rows] * torch.exp(b[:, :, rows] - b[:, :, r, None])
        k_side = ki[:, :, keys]
        if flaw != "one-side":
            k_side = k_side * torch.exp(b[:, :, ref_k, None] - b[:, :, keys])
        weights[:, :, rows, keys] = q_side @ k_side.mT
    return weights


def _gla_chunked(q, k, v, g, initial_state=None, flaw: str | None = None):
    """(out, final S) in chunks of CHUNK tokens (GLA, sec. 4.1-4.2): the state entering a
    chunk read by row i through q_i exp(b_i), b the chunk's inclusive prefix sums; the
    chunk's own keys by _intra; the state carried as diag(exp(b_last)) S + sum_j (k_j
    exp(b_last - b_j)) v_j^T, from initial_state (S (B, H, d, dv); None: zero). flaw: one of
    the broken variants (see ENTRIES)."""
    qc, kc, vc = _widen(q, k, v)
    prefix_dtype = q.dtype if flaw == "prefix-in-input-dtype" else qc.dtype
    gc = g.to(prefix_dtype)
    n = qc.shape[2]
    s = qc.new_zeros(*qc.shape[:2], qc.shape[-1], vc.shape[-1])
    s = s if initial_state is None else initial_state.to(qc)
    outs = []
    for a in range(0, n, CHUNK):
        tokens = slice(a, a + CHUNK)
        qi, ki, vi = (t[:, :, tokens] for t in (qc, kc, vc))
        b = torch.cumsum(gc[:, :, tokens], dim=2)
        if flaw == "exclusive":
            b = b - gc[:, :, tokens]
        b = b.to(qc.dtype)
        outs.append((qi * torch.exp(b)) @ s + _intra(qi, ki, b, flaw) @ vi)
        last = b[:, :, -1:]
        fresh = (ki * torch.exp(last - b)).mT @ vi
        final_chunk = a + CHUNK >= n
        kept = s if flaw == "last-decay-missing" and final_chunk else torch.exp(last).mT * s
        s = kept + fresh
    return torch.cat(outs, dim=2).to(q.dtype), s.to(q.dtype)


def gla_chunked(q, k, v, g, initial_state=None):
    """(out, S) in chunks of 16 with sub-chunks of 4, continuing initial_state."""
    return _gla_chunked(q, k, v, g, initial_state)


def gla_exclusive(q, k, v, g):
    """BUG: the chunk's prefix sums taken exclusively (b_i = g_1 + ... + g_(i-1)), so the
    weights inside a chunk and the state's reading miss the token's own gate (fla #77)."""
    return _gla_chunked(q, k, v, g, flaw="exclusive")[0]


def gla_reference_off(q, k, v, g):
    """BUG: the stabiliser's reference token differs between the two sides: the query side
    divides by exp(b_r), the key side multiplies by exp(b_(r+1)), the first token of the
    next sub-chunk: every weight across sub-chunks is off by exp(g_(r+1))."""
    return _gla_chunked(q, k, v, g, flaw="reference-off")[0]


def gla_one_side(q, k, v, g):
    """BUG: across sub-chunks the gate applied on the query side only (k_j not multiplied
    by exp(b_r - b_j)): keys earlier in a chunk weigh too much."""
    return _gla_chunked(q, k, v, g, flaw="one-side")[0]


def gla_prefix_in_input_dtype(q, k, v, g):
    """BUG: the gates' prefix sums accumulated in the inputs' dtype (float16 or bfloat16
    cumsum), the rest in float32: the weights err by the sums' rounding times |b|."""
    return _gla_chunked(q, k, v, g, flaw="prefix-in-input-dtype")[0]


def gla_last_decay_missing(q, k, v, g, initial_state=None):
    """BUG: the final state misses the last chunk's decay (the state entering the last
    chunk added undecayed); every output is right."""
    return _gla_chunked(q, k, v, g, initial_state, flaw="last-decay-missing")


class _DgWithoutState(torch.autograd.Function):
    """gla_chunked's (out, S), its backward through autograd but dL/dg from the output's
    cotangent alone: the final state's (dht's) share of dg dropped."""

    @staticmethod
    def forward(ctx, q, k, v, g, s0):
        ctx.save_for_backward(q, k, v, g, s0)
        return _gla_chunked(q, k, v, g, s0)

    @staticmethod
    def backward(ctx, grad_out, grad_s):
        leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            out, s = _gla_chunked(*leaves)
            grads = torch.autograd.grad((out, s), leaves, (grad_out, grad_s), retain_graph=True)
            (dg,) = torch.autograd.grad(out, leaves[3], grad_out)
        return (*grads[:3], dg, grads[4])


def gla_dg_without_state(q, k, v, g, initial_state=None):
    """BUG (backward only): dL/dg misses the final state's cotangent (dht's share of dg:
    every gate decays the keys before it into the final state); forward, dq, dk, dv and
    dh0 are right."""
    if initial_state is None:
        initial_state = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1])
    return _DgWithoutState.apply(q, k, v, g, initial_state)


def _entry(name, fn, broken: bool, bug: str, caught_by=(), **kw) -> Entry:
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by,
                 decay="channel-gates", normalize=False, **kw)  # fmt: skip


ENTRIES = (
    _entry("gla-recurrent", gla_recurrent, False, "correct: token by token"),
    _entry("gla-chunked-state", gla_chunked, False,
           "correct: chunks of 16, sub-chunks of 4 through the stabiliser, its state S",
           state="S"),
    _entry("gla-exclusive", gla_exclusive, True,
           "the chunk's prefix sums exclusive (fla #77)", ("reference", "decay")),
    _entry("gla-reference-off", gla_reference_off, True,
           "the stabiliser's reference token one apart between the sides",
           ("reference", "decay")),
    _entry("gla-one-side", gla_one_side, True,
           "across sub-chunks the gate on the query side only", ("reference", "decay")),
    _entry("gla-prefix-in-input-dtype", gla_prefix_in_input_dtype, True,
           "the gates' prefix sums in float16/bfloat16", ("decay",)),
    _entry("gla-last-decay-missing", gla_last_decay_missing, True,
           "the final state misses the last chunk's decay", ("final-state",), state="S"),
    _entry("gla-dg-without-state", gla_dg_without_state, True,
           "dg misses the final state's share (backward only)", ("state-gradient",),
           state="S", grad=True, smallest=True),
)  # fmt: skip
