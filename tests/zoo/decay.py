"""Decayed linear attention (--decay constant: fn(q, k, v, gamma=(H,)), the similarity of
query i and key j <= i times gamma_h^(i - j); --decay gates: fn(q, k, v, g=(B, H, N)),
log-gates g <= 0, the weight exp(g_(j+1) + ... + g_i)): broken kernels of the classes of
the public reports, and correct ones written three ways. Causal, unnormalised, scale 1,
the identity feature map (RetNet, simple GLA): out_i = sum_(j<=i) w_ij (q_i . k_j) v_j.
float16, bfloat16 and float32 inputs are computed in float32 and float64 in float64, the
output cast back to the inputs' dtype once; vectorised over batch and heads."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import Entry
from .broken import _widen

CHUNK = 16  # tokens per chunk of the chunked mutants
WIDE_CHUNK = 32  # tokens per chunk of the correct chunked kernel


def _causal_mask(n: int, device) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _gamma_log_weights(gamma: Tensor, n: int, dtype, offset: int = 0) -> Tensor:
    """(1, H, N, N) log-weights (i - j + offset) ln gamma_h, -inf above the diagonal."""
    steps = torch.arange(n, device=gamma.device, dtype=dtype)
    gaps = (steps[:, None] - steps[None, :] + offset).clamp(min=0)
    log_w = gaps * torch.log(gamma.to(dtype))[:, None, None]
    return log_w.masked_fill(~_causal_mask(n, gamma.device), -math.inf).unsqueeze(0)


def _quadratic(q, k, v, log_w: Tensor) -> Tensor:
    """sum_(j<=i) exp(log_w_ij) (q_i . k_j) v_j, log_w -inf where j > i."""
    qc, kc, vc = _widen(q, k, v)
    weights = (qc @ kc.mT) * torch.exp(log_w.to(qc.dtype))
    return (weights @ vc).to(q.dtype)


# ------------------------------------------------------------------------ correct kernels


def _segsum(x: Tensor) -> Tensor:
    """Mamba2's segsum: out[..., i, j] = x_(j+1) + ... + x_i for j <= i, -inf above the
    diagonal, from a masked cumulative sum (no difference of two long prefix sums)."""
    n = x.shape[-1]
    rows = x[..., None].expand(*x.shape, n)  # rows[..., i, j] = x_i
    below = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-1)
    sums = torch.cumsum(rows.masked_fill(~below, 0.0), dim=-2)
    return sums.masked_fill(~_causal_mask(n, x.device), -math.inf)


def gates_segsum(q, k, v, g):
    """The quadratic form, the decay matrix exp(segsum(g)) (Mamba2's ssd_minimal)."""
    dtype = _widen(q)[0].dtype
    return _quadratic(q, k, v, _segsum(g.to(dtype)))


def gates_recurrent(q, k, v, g):
    """RetNet's recurrent form, token by token: S_t = exp(g_t) S_(t-1) + k_t v_t^T,
    o_t = q_t S_t."""
    qc, kc, vc = _widen(q, k, v)
    w = torch.exp(g.to(qc.dtype))
    b, h, n, d = qc.shape
    s = qc.new_zeros(b, h, d, vc.shape[-1])
    outs = []
    for t in range(n):
        s = w[..., t, None, None] * s + kc[..., t, :, None] * vc[..., t, None, :]
        outs.append((qc[..., t, None, :] @ s).squeeze(-2))
    return torch.stack(outs, dim=-2).to(q.dtype)


def gamma_chunked(q, k, v, gamma):
    """Chunks of 32 tokens, constant decay: inside a chunk gamma^(i - j); the state entering
    it seen by row i (0-based in the chunk) through gamma^(i + 1), and carried to the next
    chunk decayed by gamma^C, each key added with gamma^(C - 1 - j) (RetNet's chunkwise
    retention, Sun et al. 2023, eq. 7)."""
    qc, kc, vc = _widen(q, k, v)
    lg = torch.log(gamma.to(qc.dtype))[None, :, None]  # (1, H, 1)
    b, h, n, d = qc.shape
    s = qc.new_zeros(b, h, d, vc.shape[-1])
    outs = []
    for a in range(0, n, WIDE_CHUNK):
        qi, ki, vi = (t[..., a : a + WIDE_CHUNK, :] for t in (qc, kc, vc))
        c = qi.shape[-2]
        steps = torch.arange(c, device=q.device, dtype=qc.dtype)
        inner = (qi @ ki.mT) * torch.exp(_gamma_log_weights(gamma, c, qc.dtype)[0])
        into = torch.exp((steps + 1) * lg)[..., None]  # (1, H, c, 1)
        outs.append(into * (qi @ s) + inner @ vi)
        to_end = torch.exp((c - 1 - steps) * lg)[..., None]
        s = torch.exp(c * lg)[..., None] * s + (ki * to_end).mT @ vi
    return torch.cat(outs, dim=-2).to(q.dtype)


# ------------------------------------------------------------------------ broken kernels


def gamma_one_step_off(q, k, v, gamma):
    """BUG: the decay one step off: gamma^(i - j + 1), the diagonal decayed too."""
    dtype = _widen(q)[0].dtype
    return _quadratic(q, k, v, _gamma_log_weights(gamma, q.shape[-2], dtype, offset=1))


def _gate_gaps(prefix: Tensor) -> Tensor:
    n = prefix.shape[-1]
    gaps = prefix[..., :, None] - prefix[..., None, :]
    return gaps.masked_fill(~_causal_mask(n, prefix.device), -math.inf)


def gates_exclusive_prefix(q, k, v, g):
    """BUG: exp(G_i - G_j) with G the exclusive prefix sums (G_i = g_1 + ... + g_(i-1)):
    key j's gate counted, query i's not."""
    dtype = _widen(q)[0].dtype
    inclusive = torch.cumsum(g.to(dtype), dim=-1)
    return _quadratic(q, k, v, _gate_gaps(inclusive - g.to(dtype)))


def gates_bf16_prefix(q, k, v, g):
    """BUG: the prefix sums of the gates accumulated in bfloat16 whatever the inputs' dtype
    (a low-precision cumsum), the rest in float32."""
    dtype = _widen(q)[0].dtype
    prefix = torch.cumsum(g.to(torch.bfloat16), dim=-1).to(dtype)
    return _quadratic(q, k, v, _gate_gaps(prefix))


def _gates_chunked(q, k, v, g, carry_decayed=True, initial_state=None, state_decayed=True):
    """(out, final state S) in chunks of 16 tokens: inside a chunk exp(G_i - G_j) from the
    chunk's own prefix sums G, the state entering it seen by row i through exp(G_i), and
    carried to the next chunk decayed by the chunk's total exp(G_last) (Yang et al. 2024,
    eq. 4-5), from initial_state (S (B, H, d, dv); None: zero). carry_decayed=False leaves
    that total out between chunks; state_decayed=False lets the rows see the initial
    state undecayed."""
    qc, kc, vc = _widen(q, k, v)
    gc = g.to(qc.dtype)
    b, h, n, d = qc.shape
    s = qc.new_zeros(b, h, d, vc.shape[-1]) if initial_state is None else initial_state.to(qc)
    outs = []
    for a in range(0, n, CHUNK):
        qi, ki, vi = (t[..., a : a + CHUNK, :] for t in (qc, kc, vc))
        prefix = torch.cumsum(gc[..., a : a + CHUNK], dim=-1)
        inner = (qi @ ki.mT) * torch.exp(_gate_gaps(prefix))
        seen = torch.exp(prefix) if state_decayed or a else torch.ones_like(prefix)
        outs.append(seen[..., None] * (qi @ s) + inner @ vi)
        to_end = torch.exp(prefix[..., -1:] - prefix)[..., None]
        if carry_decayed:
            s = torch.exp(prefix[..., -1])[..., None, None] * s
        s = s + (ki * to_end).mT @ vi
    return torch.cat(outs, dim=-2).to(q.dtype), s.to(q.dtype)


def gates_chunked_state(q, k, v, g, initial_state=None):
    """(out, S) of the chunked form in chunks of 16, continuing initial_state."""
    return _gates_chunked(q, k, v, g, initial_state=initial_state)


def gates_initial_state_undecayed(q, k, v, g, initial_state=None):
    """BUG: the rows of the first chunk see the initial state undecayed (q_i S_0, not
    exp(G_i) q_i S_0): the decay applied to the state inside a call but not to the one
    handed in (fla #351's class: wrong only when an initial_state is given)."""
    return _gates_chunked(q, k, v, g, initial_state=initial_state, state_decayed=False)


def gates_state_not_decayed(q, k, v, g):
    """BUG: the state carried from one chunk of 16 to the next is not decayed by the chunk's
    total decay (its rows and the inside of a chunk are right): a key two chunks back is
    decayed by the current chunk's prefix only."""
    return _gates_chunked(q, k, v, g, carry_decayed=False)[0]


def gates_dht_dropped(q, k, v, g, initial_state=None):
    """BUG (backward only): the final state's dependence on the initial state is left out of
    the graph (the decayed S_0 added detached), so the final state's cotangent (dht) never
    reaches dL/dS_0 (dh0): the forward is exact (fla #1140's class)."""
    out, s = _gates_chunked(q, k, v, g, initial_state=initial_state)
    if initial_state is None:
        return out, s
    _, fresh = _gates_chunked(q, k, v, g)  # the keys' part alone
    return out, fresh + (s - fresh).detach()


def gates_exp_apart(q, k, v, g):
    """BUG: exp(G_i) and exp(-G_j) formed apart, G the prefix sums from the sequence's start,
    and multiplied (q_i exp(G_i)) . (k_j exp(-G_j)), in chunks of 16 with the state in the
    same units: exp(-G_j) overflows to inf (inf * 0 = NaN) once the gates sum past -88
    (fla PR #649)."""
    qc, kc, vc = _widen(q, k, v)
    prefix = torch.cumsum(g.to(qc.dtype), dim=-1)[..., None]
    qs, ks = qc * torch.exp(prefix), kc * torch.exp(-prefix)
    b, h, n, d = qc.shape
    s = qc.new_zeros(b, h, d, vc.shape[-1])
    outs = []
    for a in range(0, n, CHUNK):
        qi, ki, vi = (t[..., a : a + CHUNK, :] for t in (qs, ks, vc))
        outs.append(qi @ s + (qi @ ki.mT).tril() @ vi)
        s = s + ki.mT @ vi
    return torch.cat(outs, dim=-2).to(q.dtype)


class _WrongGateGradient(torch.autograd.Function):
    """The segsum quadratic form (exact), its backward through autograd, dL/dg then
    passed through `bug` (backward only)."""

    @staticmethod
    def forward(ctx, q, k, v, g, bug):
        ctx.save_for_backward(q, k, v, g)
        ctx.bug = bug
        return gates_segsum(q, k, v, g)

    @staticmethod
    def backward(ctx, grad):
        leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            dq, dk, dv, dg = torch.autograd.grad(gates_segsum(*leaves), leaves, grad)
        return dq, dk, dv, ctx.bug(dg), None


def wrong_gate_gradient(q, k, v, g, bug):
    """gates_segsum whose backward returns bug(dL/dg) for the log-gates' gradient."""
    return _WrongGateGradient.apply(q, k, v, g, bug)


def gates_dg_exclusive(q, k, v, g):
    """BUG (backward only): dL/dg_t from an exclusive reverse cumulative sum, sum_(s > t)
    dL/dG_s (G the prefix sums; the inclusive sum starts at s = t), so dg_t gets dg_(t+1)
    and dg_(N-1) = 0."""

    def exclusive(dg):
        return torch.cat([dg[..., 1:], torch.zeros_like(dg[..., :1])], dim=-1)

    return wrong_gate_gradient(q, k, v, g, exclusive)


def _entry(name, fn, decay: str, broken: bool, bug: str, caught_by=(), **kw) -> Entry:
    return Entry(name, fn, "identity", True, broken, bug, caught_by=caught_by, decay=decay,
                 normalize=False, **kw)  # fmt: skip


ENTRIES = (
    _entry("decay-gates-segsum", gates_segsum, "gates", False,
           "correct: the quadratic form, Mamba2's segsum decay matrix", cost="quadratic"),
    _entry("decay-gates-recurrent", gates_recurrent, "gates", False,
           "correct: RetNet's recurrent form, token by token"),
    _entry("decay-gamma-chunked-32", gamma_chunked, "constant", False,
           "correct: constant decay in chunks of 32"),
    _entry("decay-gamma-one-step-off", gamma_one_step_off, "constant", True,
           "gamma^(i - j + 1): the decay one step off", ("reference", "decay"), cost="quadratic"),
    _entry("decay-gates-exclusive-prefix", gates_exclusive_prefix, "gates", True,
           "exclusive prefix sums: key j's gate in, query i's out", ("reference", "decay"),
           cost="quadratic"),
    _entry("decay-gates-bf16-prefix", gates_bf16_prefix, "gates", True,
           "the gates' prefix sums accumulated in bfloat16", ("reference", "decay"),
           cost="quadratic"),
    _entry("decay-gates-state-not-decayed", gates_state_not_decayed, "gates", True,
           "the state carried between chunks is not decayed", ("reference", "decay")),
    _entry("decay-gates-exp-apart", gates_exp_apart, "gates", True,
           "exp(G_i) and exp(-G_j) formed apart: overflow", ("decay",)),
    _entry("decay-gates-chunked-state", gates_chunked_state, "gates", False,
           "correct: chunks of 16, its state S carried", state="S", grad=True),
    _entry("decay-gates-dht-dropped", gates_dht_dropped, "gates", True,
           "dht never reaches dh0 (backward only)", ("state-gradient",), state="S", grad=True),
    _entry("decay-gates-initial-state-undecayed", gates_initial_state_undecayed, "gates",
           True, "the initial state seen undecayed", ("initial-state",), state="S"),
    _entry("decay-gates-dg-exclusive", gates_dg_exclusive, "gates", True,
           "dg_t from an exclusive reverse cumsum: dg_(t+1) (backward only)", ("gradient",),
           cost="quadratic", grad=True, smallest=True),
)  # fmt: skip
