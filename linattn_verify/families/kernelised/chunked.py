"""The chunked form: causal attention in chunks of C tokens, the state entering each chunk an
exclusive prefix sum of the per-chunk states phi(K_c)^T V_c, the masked quadratic product
inside a chunk (Yang et al. 2024, "Gated linear attention", sec. 3.2, without the gates);
the chunks of a block of about BLOCK_ROWS tokens at once, the state carried from block to
block."""

from __future__ import annotations

import math

import torch

from ...specs import Spec
from . import native
from .carry import State, prefixes, quotient
from .features import ELU_SHIFT_BELOW, exp, records_grad, scaled_features

# Rows per block of the linear and chunked forms: enough to amortise per-op dispatch, few
# enough that a block's features stay in cache (README, "Built-in implementations").
BLOCK_ROWS = 1024


class Scratch:
    """Tensors reused from block to block when no gradient is recorded: memory fresh from
    the OS costs a page fault per 4 KiB page on first touch (on a virtual machine about as
    long as the block's matmuls take: README). With a gradient to record,
    `out` gives None (torch allocates; out= is not differentiable) and `get` a new tensor."""

    def __init__(self, like: torch.Tensor, reuse: bool) -> None:
        self.like, self.reuse, self.tensors = like, reuse, {}

    def get(self, name: str, *shape: int) -> torch.Tensor:
        size = math.prod(shape)
        t = self.tensors.get(name)
        if t is None or t.numel() < size:
            t = self.like.new_empty(size)
            if self.reuse:
                self.tensors[name] = t
        return t[:size].view(shape)

    def out(self, name: str, *shape: int) -> torch.Tensor | None:
        return self.get(name, *shape) if self.reuse else None


def chunked(q, k, v, spec: Spec, w, n_pos: int, chunk: int, state: State, use_native=False):
    """Causal, in blocks of about BLOCK_ROWS tokens (a whole number of chunks), each
    block's chunks at once; the state runs from block to block. With use_native (elu from
    native.c): None when the kernel flags an input (see _linear_native)."""
    step = max(chunk, BLOCK_ROWS // chunk * chunk)
    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    scratch = Scratch(v, reuse=not records_grad(q, k, v, w, state.s, state.z))
    for start in range(0, q.shape[-2], step):
        rows = slice(start, start + step)
        block = (q[..., rows, :], k[..., rows, :], v[..., rows, :], spec, w, n_pos, chunk, state)
        if state.shift is not None:
            out[..., rows, :], state = chunk_block_shifted(*block)
            continue
        state = chunk_block(*block, use_native, scratch, out[..., rows, :])
        if state is None:
            return None
    return out, state


def _chunks(t: torch.Tensor, chunk: int, pad: int, value: float = 0.0) -> torch.Tensor:
    """(B, H, N, X) -> (B, H, nc, chunk, X), padded at the end with `value`."""
    t = torch.nn.functional.pad(t, (0, 0, 0, pad), value=value)
    return t.reshape(*t.shape[:2], -1, chunk, t.shape[-1])


def _padded(x: torch.Tensor, rows: int, into: torch.Tensor | None = None) -> torch.Tensor:
    """x (B, H, n, X) as (B H, rows, X) with zero rows appended, written into `into` if
    given."""
    x = x.reshape(-1, *x.shape[-2:])
    if into is None:
        return torch.nn.functional.pad(x, (0, 0, 0, rows - x.shape[1]))
    into[:, : x.shape[1]] = x
    into[:, x.shape[1] :] = 0
    return into


def chunk_block(q, k, v, spec, w, n_pos, chunk, state, use_native, scratch, dest):
    """Causal attention of one block from an unshifted `state` into `dest`: every chunk of
    `chunk` tokens at once (see the module docstring), (B H) and the chunks flattened into
    one batch of matmuls. Returns the state after the block, or None when native.c flags
    an input (use_native)."""
    b, h, n, d = q.shape
    bh, nc, dv = b * h, -(-n // chunk), v.shape[-1]
    rows = nc * chunk  # padded: zero keys add nothing; padded query rows are dropped
    if use_native:
        fk = scratch.get("fk", bh, rows, d)
        fk[:, n:] = 0
        if not native.elu_features(k.reshape(bh, n, d), fk[:, :n], ELU_SHIFT_BELOW):
            return None
    else:
        body = scaled_features(k, spec, w, n_pos, state.position)[0]
        fk = _padded(body, rows, scratch.out("fk", bh, rows, body.shape[-1]))
    f = fk.shape[-1]
    fkc = fk.view(bh * nc, chunk, f)
    vc = _padded(v, rows, scratch.out("v", bh, rows, dv)).view(bh * nc, chunk, dv)
    chunk_s = torch.bmm(fkc.transpose(1, 2), vc, out=scratch.out("chunk_s", bh * nc, f, dv))
    prefix_s, s = prefixes(
        state.s.reshape(bh, f, dv), chunk_s.view(bh, nc, f, dv), scratch.out("s", bh, nc, f, dv)
    )
    prefix_z, z = prefixes(
        state.z.reshape(bh, f), fkc.sum(dim=1).view(bh, nc, f), scratch.out("z", bh, nc, f)
    )
    if use_native:
        fq, den = scratch.get("fq", bh, rows, d), scratch.get("den", bh, rows, 1)
        fq[:, n:], den[:, n:] = 0, 1
        if not native.elu_features(
            q.reshape(bh, n, d), fq[:, :n], ELU_SHIFT_BELOW, prefix_z, chunk, den[:, :n]
        ):
            return None
        if not bool(torch.isfinite(s).all()):  # a non-finite value (every feature is > 0)
            return None
    else:
        body = scaled_features(q, spec, w, n_pos, state.position)[0]
        fq = _padded(body, rows, scratch.out("fq", bh, rows, f))
        den = (fq.view(bh, nc, chunk, f) * prefix_z.unsqueeze(2)).sum(-1, keepdim=True)
        den = den.view(bh, rows, 1)
    fqc = fq.view(bh * nc, chunk, f)
    inner = torch.bmm(fqc, fkc.transpose(1, 2), out=scratch.out("inner", bh * nc, chunk, chunk))
    inner.tril_()
    num = torch.bmm(fqc, prefix_s.view(bh * nc, f, dv), out=scratch.out("num", bh * nc, chunk, dv))
    num.baddbmm_(inner, vc)
    den.add_(inner.sum(dim=-1, keepdim=True).view(bh, rows, 1))
    if spec.eps:
        den.add_(spec.eps)
    num, den = (t.view(b, h, rows, -1)[:, :, :n] for t in (num, den))
    if scratch.reuse:
        torch.div(num, den, out=dest)
    else:
        dest.copy_(num / den)
    return State(s.view(b, h, f, dv), z.view(b, h, f), None, state.position + n)


def chunk_block_shifted(q, k, v, spec: Spec, w, n_pos: int, chunk: int, state: State):
    """chunk_block with key log-scales (Performer maps, elu of very negative inputs):
    every query works at the running maximum R_i of the scales of the keys it sees, and
    each chunk's state at the maximum after it, so no later key can push an earlier
    query's weights below the smallest float."""
    b, h, n, _ = q.shape
    phi_q, shift_q = scaled_features(q, spec, w, n_pos, state.position, True)
    body, scale = scaled_features(k, spec, w, n_pos, state.position, True)
    pad = -n % chunk  # zero keys add nothing; padded query rows are dropped
    fq, fk, vc = (_chunks(t, chunk, pad) for t in (phi_q, body, v))
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    logs = _chunks(scale, chunk, pad, -math.inf)[..., 0]  # (B, H, nc, C)
    inside = torch.cummax(logs, dim=-1).values  # running max within each chunk
    ends = torch.maximum(torch.cummax(inside[..., -1], dim=-1).values, state.shift[..., 0])
    starts = torch.cat([state.shift[..., 0], ends[..., :-1]], dim=-1)  # (B, H, nc)
    rows = torch.maximum(inside, starts.unsqueeze(-1))  # R_i, (B, H, nc, C)
    fk_end = fk * exp(logs - ends.unsqueeze(-1)).unsqueeze(-1)
    chunk_s, chunk_z = fk_end.transpose(-2, -1) @ vc, fk_end.sum(dim=-2)
    s, z, prefixes_s, prefixes_z = state.s, state.z, [], []
    for t in range(chunk_s.shape[2]):  # a scan: each step rescales to the new maximum
        prefixes_s.append(s)
        prefixes_z.append(z)
        decay = exp(starts[..., t] - ends[..., t])  # (B, H)
        s = s * decay[..., None, None] + chunk_s[:, :, t]
        z = z * decay[..., None] + chunk_z[:, :, t]
    prefix_s, prefix_z = torch.stack(prefixes_s, 2), torch.stack(prefixes_z, 2)
    to_row = exp(starts.unsqueeze(-1) - rows).unsqueeze(-1)  # (B, H, nc, C, 1)
    gap = (logs.unsqueeze(-2) - rows.unsqueeze(-1)).masked_fill(~causal, -math.inf)
    inner = (fq @ fk.transpose(-2, -1)) * exp(gap)
    num = (fq @ prefix_s) * to_row + inner @ vc
    den = (fq * prefix_z.unsqueeze(-2)).sum(-1, keepdim=True) * to_row
    den = den + inner.sum(-1, keepdim=True)
    num, den = (t.reshape(b, h, -1, t.shape[-1])[..., :n, :] for t in (num, den))
    out = quotient(num, den, spec, shift_q, rows.reshape(b, h, -1, 1)[..., :n, :])
    after = State(s, z, ends[..., -1:].unsqueeze(-1), state.position + n)
    return out, after
