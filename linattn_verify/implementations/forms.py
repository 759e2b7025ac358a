"""The built-in implementations: every spec in four forms, any dtype, CPU or CUDA.

Forms (DESIGN "Vocabulary"):
- quadratic: the (Nq, Nk) weights materialised (golden.py's quadratic form);
- linear (non-causal): phi(Q) (phi(K)^T [V, 1]), keys and queries taken in blocks of
  BLOCK_ROWS rows so that each block's features stay in cache;
- recurrent (causal): S_i = S_{i-1} + phi(k_i) v_i^T, z_i = z_{i-1} + phi(k_i), one token
  at a time (Katharopoulos et al. 2020, eq. 18-20);
- chunked (causal): chunks of C tokens; the state entering each chunk is an exclusive
  prefix sum of the per-chunk states phi(K_c)^T V_c, and inside a chunk the masked
  quadratic product (Yang et al. 2024, "Gated linear attention", sec. 3.2, without the
  gates); the chunks of a block of about BLOCK_ROWS tokens at once, the state carried from
  block to block, so the working set is O(BLOCK_ROWS (F dv / C + C)) beside the output.
float16/bfloat16/float32 inputs are computed in float32 and float64 in float64; the output
has the inputs' dtype and device. On the CPU in float32 without autograd, elu features come
from native.c (one pass, with the queries' denominators and the input checks folded in),
and the chunked form reuses its scratch tensors from block to block. Performer features,
and elu features of very negative inputs, are kept in shifted form (features.py,
needs_shift); the key shift is carried with the state and rescaled when it grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..inputs import UNIT_ROUNDOFF, check_shapes, dtype_name
from ..specs import Spec, SpecError
from . import native
from .features import (
    ELU_SHIFT_BELOW,
    add_shifts,
    exp,
    needs_shift,
    records_grad,
    scaled_eps,
    scaled_features,
)
from .golden import golden_attention

FORMS = ("quadratic", "linear", "recurrent", "chunked")
# Rows per block of the linear and chunked forms. (64 x R) @ (R x 64) products ran at
# 70-75 GFLOP/s for R = 512 ... 1024 and slower above on this machine's one core, and
# smaller blocks lose to per-op dispatch overhead (benchmarks/bench_implementations.py).
BLOCK_ROWS = 1024
DEFAULT_CHUNK = 64


def check_tensors(q, k, v, spec: Spec, projection) -> None:
    """Raise SpecError unless q, k, v (and W) are floating tensors that fit the spec (their
    values: check_finite)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
        if dtype_name(t) not in UNIT_ROUNDOFF:
            raise SpecError(f"{name} has dtype {t.dtype}; expected a floating dtype")
    if not (q.dtype == k.dtype == v.dtype):
        raise SpecError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise SpecError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    w_shape = None if projection is None else tuple(projection.shape)
    check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), spec, w_shape)


def check_finite(q, k, v, projection) -> None:
    """Raise SpecError if q, k, v or W hold a NaN or an infinity."""
    for name, t in (("q", q), ("k", k), ("v", v), ("projection", projection)):
        if t is None:
            continue
        t = torch.as_tensor(t).detach()
        # a NaN or inf anywhere makes the sum non-finite; a finite sum clears the tensor in
        # one cheap pass, an overflowing one sends it to the full check
        if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
            raise SpecError(f"{name} has a non-finite value")


def default_form(spec: Spec, nq: int, nk: int, d: int, dv: int, m: int | None) -> str:
    """The form with fewer multiply-adds: quadratic Nq Nk (F + dv) against linear
    (Nq + Nk) F (dv + 1); softmax has only the quadratic form."""
    if not spec.info.kernelised:
        return "quadratic"
    f = spec.info.feature_dim(d, m)
    if nq * nk * (f + dv) <= (nq + nk) * f * (dv + 1):
        return "quadratic"
    return "chunked" if spec.causal else "linear"


@dataclass(frozen=True)
class State:
    """What a causal stream carries from one piece to the next.

    s: sum_j phi(k_j) v_j^T (B, H, F, dv) and z: sum_j phi(k_j) (B, H, F), both in units of
    exp(shift) (shift (B, H, 1, 1) for shifted features, else None); position: tokens
    seen so far (cosFormer's positions continue from it).
    """

    s: torch.Tensor
    z: torch.Tensor
    shift: torch.Tensor | None
    position: int

    @classmethod
    def empty(cls, b: int, h: int, f: int, dv: int, like: torch.Tensor, shifted: bool) -> State:
        zeros = like.new_zeros
        shift = like.new_full((b, h, 1, 1), -math.inf) if shifted else None
        return cls(zeros(b, h, f, dv), zeros(b, h, f), shift, 0)


def _rescaled(state: State, shift: torch.Tensor | None) -> State:
    """The state in units of exp(shift), shift >= state.shift (shape (B, H, 1, 1))."""
    if shift is None:
        return state
    decay = exp(state.shift - shift)  # 0 for an empty state (shift -inf)
    return replace(state, s=state.s * decay, z=state.z * decay[..., 0], shift=shift)


def _absorb(state: State, phi_k: torch.Tensor, v: torch.Tensor) -> State:
    """The state after keys phi_k (in the state's units) with values v."""
    s = state.s + phi_k.transpose(-2, -1) @ v
    return replace(state, s=s, z=state.z + phi_k.sum(dim=-2), position=state.position + v.shape[-2])


def _absorb_token(state: State, phi_k: torch.Tensor, v: torch.Tensor) -> State:
    """_absorb for one token, as an outer product (no sum over a length-1 axis)."""
    s = state.s + phi_k.transpose(-2, -1) * v
    return replace(state, s=s, z=state.z + phi_k[..., 0, :], position=state.position + 1)


def _quotient(num, den, spec: Spec, shift_q, shift_k) -> torch.Tensor:
    return num / (den + scaled_eps(spec.eps, add_shifts(shift_q, shift_k)))


def _prefixes(
    first: torch.Tensor, steps: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first + steps[:, 0] + ... + steps[:, t-1] for each t < T, stacked on dim 1; and the
    total), each step added to the running sum in order, as the recurrent form adds tokens
    (never a difference of prefix sums, which would lose a small prefix next to a large
    step). With `out` (no autograd) the sums are formed in it, with no new memory."""
    if out is None:
        sums = [first]
        for t in range(steps.shape[1]):
            sums.append(sums[-1] + steps[:, t])
        return torch.stack(sums[:-1], dim=1), sums[-1]
    out[:, 0] = first
    for t in range(1, steps.shape[1]):
        torch.add(out[:, t - 1], steps[:, t - 1], out=out[:, t])
    return out, out[:, -1] + steps[:, -1]


def _native_elu(spec: Spec, *tensors: torch.Tensor) -> bool:
    """Whether elu features can come from native.c (CPU float32, no autograd)."""
    return spec.feature_map == "elu" and not records_grad(*tensors) and native.usable(*tensors)


def _linear_native(q, k, v, spec: Spec) -> torch.Tensor | None:
    """_linear for elu from native.c: each block's features in one pass, the queries'
    denominators phi(q_i) . z in the same pass; (B H) flattened so each product is one
    batched matmul. None when an input is non-finite or below ELU_SHIFT_BELOW (the caller
    then checks the inputs and takes _linear): the kernel's pass is the check."""
    b, h, nk, d = k.shape
    nq, dv = q.shape[-2], v.shape[-1]
    qf, kf, vf = (t.reshape(b * h, *t.shape[-2:]) for t in (q, k, v))
    s, z = v.new_zeros(b * h, d, dv), v.new_zeros(b * h, 1, d)
    phi = v.new_empty(b * h, min(BLOCK_ROWS, max(nq, nk)), d)
    for start in range(0, nk, BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        keys = kf[:, rows]
        f = phi[:, : keys.shape[1]]
        if not native.elu_features(keys, f, ELU_SHIFT_BELOW):
            return None
        s.baddbmm_(f.transpose(1, 2), vf[:, rows])
        z += f.sum(dim=1, keepdim=True)
    if not bool(torch.isfinite(s).all()):  # a non-finite value (every feature is > 0)
        return None
    out = v.new_empty(b * h, nq, dv)
    den = v.new_empty(b * h, phi.shape[1], 1)
    for start in range(0, nq, BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        queries = qf[:, rows]
        n = queries.shape[1]
        f, dn = phi[:, :n], den[:, :n]
        if not native.elu_features(queries, f, ELU_SHIFT_BELOW, z, n, dn):
            return None
        block = out[:, rows]
        torch.bmm(f, s, out=block)
        block.div_(dn.add_(spec.eps) if spec.eps else dn)
    return out.view(b, h, nq, dv)


def _linear(q, k, v, spec: Spec, w, n_pos: int) -> torch.Tensor:
    """Non-causal phi(Q)(phi(K)^T [V, 1]) in row blocks; keys at one running scale."""
    b, h, _, _ = k.shape
    state, shifted = None, needs_shift(spec, q, k)
    for start in range(0, k.shape[-2], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        body, scale = scaled_features(k[..., rows, :], spec, w, n_pos, start, shifted)
        if state is None:
            state = State.empty(b, h, body.shape[-1], v.shape[-1], v, scale is not None)
        if scale is not None:
            state = _rescaled(state, torch.maximum(state.shift, scale.amax(dim=-2, keepdim=True)))
            body = body * exp(scale - state.shift)
        state = _absorb(state, body, v[..., rows, :])
    s_z = torch.cat([state.s, state.z.unsqueeze(-1)], dim=-1)  # (B, H, F, dv + 1)
    out = v.new_empty(b, h, q.shape[-2], v.shape[-1])
    for start in range(0, q.shape[-2], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        phi_q, shift_q = scaled_features(q[..., rows, :], spec, w, n_pos, start, shifted)
        num_den = phi_q @ s_z
        out[..., rows, :] = _quotient(
            num_den[..., :-1], num_den[..., -1:], spec, shift_q, state.shift
        )
    return out


def _recurrent(q, k, v, spec: Spec, w, n_pos: int, state: State) -> tuple[torch.Tensor, State]:
    """Causal, one token at a time from `state`; the key scale is the running maximum of
    the keys seen so far (never a later key's: early queries would lose theirs)."""
    shifted = state.shift is not None
    phi_q, shift_q = scaled_features(q, spec, w, n_pos, state.position, shifted)
    body, scale = scaled_features(k, spec, w, n_pos, state.position, shifted)
    shifts = None
    if scale is not None:
        shifts = torch.maximum(torch.cummax(scale, dim=-2).values, state.shift)
    rows = []
    for i in range(q.shape[-2]):
        phi = body[..., i : i + 1, :]
        if shifts is not None:
            state = _rescaled(state, shifts[..., i : i + 1, :])
            phi = phi * exp(scale[..., i : i + 1, :] - state.shift)
        state = _absorb_token(state, phi, v[..., i : i + 1, :])
        pq = phi_q[..., i : i + 1, :]
        num, den = pq @ state.s, pq @ state.z.unsqueeze(-1)
        sq = None if shift_q is None else shift_q[..., i : i + 1, :]
        rows.append(_quotient(num, den, spec, sq, state.shift))
    return torch.cat(rows, dim=-2), state


class _Scratch:
    """Tensors reused from block to block when no gradient is recorded: memory fresh from
    the OS costs a page fault per 4 KiB page on first touch (about 2.6 us on our CI's
    virtual machine, as long as the block's matmuls take). With a gradient to record,
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


def _chunked(q, k, v, spec: Spec, w, n_pos: int, chunk: int, state: State, use_native=False):
    """Causal, in blocks of about BLOCK_ROWS tokens (a whole number of chunks), each
    block's chunks at once; the state runs from block to block. With use_native (elu from
    native.c): None when the kernel flags an input (see _linear_native)."""
    step = max(chunk, BLOCK_ROWS // chunk * chunk)
    out = v.new_empty(*q.shape[:-1], v.shape[-1])
    scratch = _Scratch(v, reuse=not records_grad(q, k, v, w, state.s, state.z))
    for start in range(0, q.shape[-2], step):
        rows = slice(start, start + step)
        block = (q[..., rows, :], k[..., rows, :], v[..., rows, :], spec, w, n_pos, chunk, state)
        if state.shift is not None:
            out[..., rows, :], state = _chunk_block_shifted(*block)
            continue
        state = _chunk_block(*block, use_native, scratch, out[..., rows, :])
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


def _chunk_block(q, k, v, spec, w, n_pos, chunk, state, use_native, scratch, dest):
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
    prefix_s, s = _prefixes(
        state.s.reshape(bh, f, dv), chunk_s.view(bh, nc, f, dv), scratch.out("s", bh, nc, f, dv)
    )
    prefix_z, z = _prefixes(
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


def _chunk_block_shifted(q, k, v, spec: Spec, w, n_pos: int, chunk: int, state: State):
    """_chunk_block with key log-scales (Performer maps, elu of very negative inputs):
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
    out = _quotient(num, den, spec, shift_q, rows.reshape(b, h, -1, 1)[..., :n, :])
    after = State(s, z, ends[..., -1:].unsqueeze(-1), state.position + n)
    return out, after


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "elu",
    causal: bool = False,
    form: str | None = None,
    projection: torch.Tensor | None = None,
    eps: float = 0.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """Attention of `feature_map` in `form` (None: the cheaper of quadratic and linear).

    q, k: (B, H, N, d), v: (B, H, N, dv); any floating dtype, any strides, CPU or CUDA;
    projection W (m, d) for the Performer maps. Returns (B, H, Nq, dv) in q's dtype.
    """
    spec = Spec(feature_map, causal=causal, eps=eps)
    check_tensors(q, k, v, spec, projection)
    nq, d = q.shape[-2:]
    nk, dv = k.shape[-2], v.shape[-1]
    m = None if projection is None else projection.shape[0]
    form = form or default_form(spec, nq, nk, d, dv, m)
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    if form == "quadratic":
        check_finite(q, k, v, projection)
        return golden_attention(q, k, v, spec, projection, "quadratic")
    if not spec.info.kernelised:
        raise SpecError(f"{feature_map!r} has no finite feature map: only form='quadratic'")
    if (form == "linear") == causal:
        need = "'chunked' or 'recurrent'" if causal else "'linear'"
        raise SpecError(f"form {form!r} does not fit causal={causal}: use {need}")
    _check_chunk_size(chunk_size)
    dtype = _compute_dtype(q)
    qc, kc, vc = (t.to(dtype) for t in (q, k, v))
    w = None if projection is None else torch.as_tensor(projection).to(qc.device, dtype)
    n_pos = max(nq, nk)
    if form == "linear":
        out = _linear_native(qc, kc, vc, spec) if _native_elu(spec, qc, kc, vc) else None
        if out is None:
            check_finite(q, k, v, projection)
            out = _linear(qc, kc, vc, spec, w, n_pos)
        return out.to(q.dtype)
    stream = CausalStream(feature_map, projection, eps, chunk_size, max_len=n_pos, form=form)
    return stream(q, k, v)


def _check_chunk_size(chunk_size: object) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")


class CausalStream:
    """Causal attention over a sequence given in pieces: pieces == one pass.

    stream = CausalStream("elu"); out1 = stream(q1, k1, v1); out2 = stream(q2, k2, v2)
    carries S, z (and the key shift of shifted features, and the position for cosFormer, which
    needs max_len: its M is the length of the whole sequence). form: "chunked" (each piece
    in chunks of chunk_size) or "recurrent" (token by token).
    """

    def __init__(
        self,
        feature_map: str,
        projection: torch.Tensor | None = None,
        eps: float = 0.0,
        chunk_size: int = DEFAULT_CHUNK,
        max_len: int | None = None,
        form: str = "chunked",
    ) -> None:
        self.spec = Spec(feature_map, causal=True, eps=eps)
        if not self.spec.info.kernelised:
            raise SpecError(f"{feature_map!r} has no finite feature map: it cannot stream")
        if feature_map == "cosformer" and max_len is None:
            raise SpecError("cosformer streams need max_len (its M is the sequence length)")
        _check_chunk_size(chunk_size)
        self.projection, self.chunk_size, self.max_len = projection, chunk_size, max_len
        if form not in ("chunked", "recurrent"):
            raise SpecError(f"a stream's form is 'chunked' or 'recurrent', got {form!r}")
        self.recurrent = form == "recurrent"
        self.state: State | None = None
        self.layout: tuple | None = None  # (B, H, d, dv, dtype, device) of the first piece

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        check_tensors(q, k, v, self.spec, self.projection)
        layout = (*q.shape[:2], q.shape[-1], v.shape[-1], q.dtype, q.device)
        if self.layout is not None and layout != self.layout:
            raise SpecError(
                f"a piece of (B, H, d, dv, dtype, device) = {layout} does not continue a "
                f"stream of {self.layout}"
            )
        self.layout = layout
        dtype = _compute_dtype(q)
        qc, kc, vc = (t.to(dtype) for t in (q, k, v))
        w = (
            None
            if self.projection is None
            else torch.as_tensor(self.projection).to(qc.device, dtype)
        )
        n_pos = self.max_len or self._position() + q.shape[-2]
        if self.max_len is not None and self._position() + q.shape[-2] > self.max_len:
            raise SpecError(f"the stream is longer than max_len = {self.max_len}")
        carried = () if self.state is None else (self.state.s, self.state.z)
        if not self.recurrent and _native_elu(self.spec, qc, kc, vc, *carried):
            state = self.state or State.empty(*self._state_shape(q, v), vc, shifted=False)
            if state.shift is None:
                result = _chunked(qc, kc, vc, self.spec, w, n_pos, self.chunk_size, state, True)
                if result is not None:
                    out, self.state = result
                    return out.to(q.dtype)
        check_finite(q, k, v, self.projection)
        if self.state is None:
            shifted = needs_shift(self.spec, qc, kc)
            self.state = State.empty(*self._state_shape(q, v), vc, shifted)
        elif self.state.shift is None and needs_shift(self.spec, qc, kc):
            # from here on in shifted form; the state so far is in units of exp(0)
            self.state = replace(self.state, shift=vc.new_zeros(*vc.shape[:2], 1, 1))
        if self.recurrent:
            out, self.state = _recurrent(qc, kc, vc, self.spec, w, n_pos, self.state)
        else:
            out, self.state = _chunked(qc, kc, vc, self.spec, w, n_pos, self.chunk_size, self.state)
        return out.to(q.dtype)

    def _position(self) -> int:
        return 0 if self.state is None else self.state.position

    def _state_shape(self, q: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
        """(B, H, F, dv) of this stream's state."""
        b, h, _, d = q.shape
        m = None if self.projection is None else self.projection.shape[0]
        return b, h, self.spec.info.feature_dim(d, m), v.shape[-1]
