"""Mamba-2's SSD layer (families/ssd/: Dao & Gu 2024, "Transformers are SSMs", the SSD
layer): kernels written from the equations, a recurrent and a chunked one, and broken ones
of the classes these kernels have. The contract: fn(C, B, x, dt=(B, H, N), A=(H,), D=(H,),
dt_bias=(H,)[, z=(B, H, N, dv)][, initial_state=S (B, H, d, dv)]) -> y, per batch and head,

    dt <- clamp(softplus(dt + dt_bias), dt_min, dt_max),  S <- exp(dt A) S + dt B_t x_t^T,
    y_t = (S^T C_t + D x_t) * silu(z_t),

as mamba_ssm's mamba_chunk_scan_combined with dt_softplus=True and z (--z-gate
--dt-softplus); PLAIN entries claim neither and a dt_limit (no gate, dt + dt_bias clamped).
C and B may have fewer heads than x (mamba_ssm's ngroups; --value-heads G: x of G times
their heads), head h reading group h // G. The packed ones take cu_seqlens=(S + 1,) with B = 1
(--varlen).

The chunked kernels follow the SSD algorithm (sec. 6): per chunk of CHUNK tokens, G the
chunk's inclusive prefix sums of dt A, Y = (C B^T . exp(G_i - G_j))_(j<=i) (dt x) +
(exp(G) . C) S, S <- exp(G_last) S + (exp(G_last - G) . B)^T (dt x). float16, bfloat16
and float32 inputs are computed in float32 (the state and the chunk states too: mamba_ssm
keeps them in float32), float64 in float64, the output cast back once."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from . import Entry

CHUNK = 16  # tokens per chunk of the chunked kernels


def _widen(*tensors):
    """The tensors in the compute dtype: float64 for float64, float32 otherwise."""
    dtype = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    return tuple(t.to(dtype) for t in tensors)


def _steps(dt, a, dt_bias, limit, flaw):
    """(dt, dt A) per token after the dt transform (limit None: softplus, no clamp; else
    (dt_min, dt_max), no softplus); flaw "a-sign" flips A's sign in the second chunk's steps
    (a chunk boundary's sign error)."""
    dt = dt + dt_bias[:, None]
    dt = F.softplus(dt) if limit is None else dt.clamp(*limit)
    steps = dt * a[:, None]
    if flaw == "a-sign":
        steps = steps.clone()
        steps[..., CHUNK : 2 * CHUNK] = -steps[..., CHUNK : 2 * CHUNK]
    return dt, steps


def _ssd(c, b, x, dt, A, D, dt_bias, z, chunked, limit, flaw=None, initial_state=None):
    """(y, final S) of the SSD layer, z None without the gate; flaw: one of the broken
    variants (see ENTRIES)."""
    out_dtype, groups = x.dtype, x.shape[1] // c.shape[1]
    c, b, x, dt, A, D, dt_bias = _widen(c, b, x, dt, A, D, dt_bias)
    if flaw == "group-order":  # head h reads group h % G instead of h // (H / G)
        c, b = (t.repeat(1, groups, 1, 1) for t in (c, b))
    else:
        c, b = (t.repeat_interleave(groups, 1) for t in (c, b))
    dt, steps = _steps(dt, A, dt_bias, limit, flaw)
    injected = x * dt[..., None]
    keys = b * dt[..., None] if flaw == "dt-twice" else b
    state = x.new_zeros(*x.shape[:2], c.shape[-1], x.shape[-1])
    if initial_state is not None:
        state = initial_state.to(x.dtype)
    rows = []
    if not chunked:
        for t in range(x.shape[2]):
            state = torch.exp(steps[..., t, None, None]) * state
            state = state + keys[..., t, :, None] * injected[..., t, None, :]
            rows.append(c[..., t, None, :] @ state)
    else:
        for start in range(0, x.shape[2], CHUNK):
            part = slice(start, start + CHUNK)
            cc, kc, xc = c[..., part, :], keys[..., part, :], injected[..., part, :]
            g = torch.cumsum(steps[..., part], -1)
            gap = g[..., :, None] - g[..., None, :]
            mask = torch.ones_like(gap, dtype=torch.bool).tril()
            inner = (cc @ kc.transpose(-2, -1)) * torch.exp(gap.masked_fill(~mask, -torch.inf))
            rows.append(inner @ xc + (torch.exp(g)[..., None] * cc) @ state)
            state = torch.exp(g[..., -1:])[..., None] * state
            state = state + (torch.exp(g[..., -1:] - g)[..., None] * kc).transpose(-2, -1) @ xc
    y = torch.cat(rows, 2)
    gate = 1 if z is None else F.silu(z.to(x.dtype))
    if flaw == "skip-after-gate":
        y = y * gate + D[:, None, None] * x
    else:
        y = (y + D[:, None, None] * x) * gate
    return y.to(out_dtype), state


def _kernel(chunked: bool, limit, flaw: str | None = None, with_state: bool = False):
    """A kernel of the contract: the SSD layer, correct (flaw None) or broken."""

    def fn(q, k, v, dt, A, D, dt_bias, z=None, initial_state=None):
        y, state = _ssd(q, k, v, dt, A, D, dt_bias, z, chunked, limit, flaw, initial_state)
        return (y, state) if with_state else y

    return fn


def _packed(chunked: bool, leak: bool):
    """A kernel of the contract that also takes packed batches (cu_seqlens, B = 1): each
    sequence from a zero state, or (leak) the packed row as one sequence, the state running
    on across the boundaries (mamba_ssm's seq_idx ignored)."""

    def fn(q, k, v, dt, A, D, dt_bias, z=None, cu_seqlens=None):
        if cu_seqlens is None or leak:
            return _ssd(q, k, v, dt, A, D, dt_bias, z, chunked, None)[0]
        bounds = cu_seqlens.tolist()
        outs = [v[:, :, :0]]
        for start, stop in itertools.pairwise(bounds):
            if start == stop:  # an empty sequence: no rows
                continue
            part = slice(start, stop)
            gate = None if z is None else z[:, :, part]
            cut = (t[:, :, part] for t in (q, k, v, dt))
            outs.append(_ssd(*cut, A, D, dt_bias, gate, chunked, None)[0])
        return torch.cat(outs, 2)

    return fn


MAMBA = (("z_gate", True), ("dt_softplus", True))  # mamba_ssm's usual call
PLAIN = (("dt_min", 0.002), ("dt_max", 0.05))  # no gate, no softplus, a dt_limit


def _entry(name, chunked, bug, flaw=None, caught_by=(), state=None, claim=MAMBA,
           groups=1) -> Entry:  # fmt: skip
    limit = None if claim is MAMBA else tuple(value for _, value in claim)
    fn = _kernel(chunked, limit, flaw, state is not None)
    return Entry(name, fn, "identity", True, flaw is not None, bug, caught_by=caught_by,
                 normalize=False, family="ssd", claim=claim, state=state,
                 value_heads=groups)  # fmt: skip


ENTRIES = (
    _entry("ssd-recurrent", False, "correct: the recurrence token by token", state="S"),
    _entry("ssd-chunked", True, "correct: the chunked SSD algorithm", state="S"),
    _entry("ssd-chunked-plain", True, "correct: the chunked SSD algorithm, no gate, dt "
           "clamped", state="S", claim=PLAIN),
    _entry("ssd-grouped", True, "correct: C and B shared by groups of 2 heads (ngroups)",
           groups=2),
    _entry("ssd-group-order", True, "head h reads group h % G instead of h // (H / G)",
           "group-order", ("value-heads",), groups=2),
    Entry("ssd-varlen", _packed(True, False), "identity", True, False,
          "correct: packed sequences, each from a zero state", normalize=False,
          family="ssd", claim=MAMBA, varlen=True),
    Entry("ssd-varlen-leak", _packed(True, True), "identity", True, True,
          "the state leaks across packed sequences (seq_idx ignored)", caught_by=("varlen",),
          normalize=False, family="ssd", claim=MAMBA, varlen=True),
    _entry("ssd-dt-twice", True, "dt applied to B and to x (twice)", "dt-twice",
           ("reference", "associativity")),
    _entry("ssd-skip-after-gate", False, "D x added after the z gate instead of before",
           "skip-after-gate", ("reference", "associativity")),
    _entry("ssd-a-sign", True, "exp(A dt) with A's sign flipped in the second chunk",
           "a-sign", ("reference", "associativity")),
)  # fmt: skip
