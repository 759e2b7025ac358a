"""Kernelised attention's built-in forms: every spec in four forms, any dtype, CPU or CUDA.

Forms (docs/architecture.md, "Vocabulary"):
- quadratic: the (Nq, Nk) weights materialised (quadratic.py's form);
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
needs_shift); the key shift is carried with the state and rescaled when it grows. Scaled
and unnormalised specs take scaled.py's forms, as the decayed families built on these do
(scaled and scaled_with_state, with their decay: WithDecay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from ...implementations.forms import (
    DEFAULT_CHUNK,
    FORMS,
    check_chunk_size,
    check_finite,
    check_tensors,
    compute_dtype,
    defined,
    varlen,
)
from ...specs import Spec, SpecError, summing
from . import native
from .carry import State, absorb, absorb_token, quotient, rescaled
from .chunked import BLOCK_ROWS, chunked
from .features import ELU_SHIFT_BELOW, exp, needs_shift, records_grad, scaled_features
from .quadratic import quadratic_form
from .scaled import Decay, scaled_attention


def forms_of(spec: Spec) -> tuple[str, ...]:
    """The forms that evaluate `spec` (a spec that sums its similarities)."""
    summing(spec, "forms")
    return ("quadratic", "recurrent", "chunked") if spec.causal else ("quadratic", "linear")


def fast_form(spec: Spec) -> str:
    """The form `attention` takes at large N: linear (non-causal) or chunked (causal), the
    last of forms_of."""
    return forms_of(spec)[-1]


def default_form(spec: Spec, nq: int, nk: int, d: int, dv: int, m: int | None) -> str:
    """The form with fewer multiply-adds: quadratic Nq Nk (F + dv) against linear
    (Nq + Nk) F (dv + 1)."""
    f = spec.info.feature_dim(d, m)
    if nq * nk * (f + dv) <= (nq + nk) * f * (dv + 1):
        return "quadratic"
    return fast_form(spec)


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
            state = rescaled(state, torch.maximum(state.shift, scale.amax(dim=-2, keepdim=True)))
            body = body * exp(scale - state.shift)
        state = absorb(state, body, v[..., rows, :])
    s_z = torch.cat([state.s, state.z.unsqueeze(-1)], dim=-1)  # (B, H, F, dv + 1)
    out = v.new_empty(b, h, q.shape[-2], v.shape[-1])
    for start in range(0, q.shape[-2], BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        phi_q, shift_q = scaled_features(q[..., rows, :], spec, w, n_pos, start, shifted)
        num_den = phi_q @ s_z
        out[..., rows, :] = quotient(
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
            state = rescaled(state, shifts[..., i : i + 1, :])
            phi = phi * exp(scale[..., i : i + 1, :] - state.shift)
        state = absorb_token(state, phi, v[..., i : i + 1, :])
        pq = phi_q[..., i : i + 1, :]
        num, den = pq @ state.s, pq @ state.z.unsqueeze(-1)
        sq = None if shift_q is None else shift_q[..., i : i + 1, :]
        rows.append(quotient(num, den, spec, sq, state.shift))
    return torch.cat(rows, dim=-2), state


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str | None = None,
    projection: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    arguments: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention of `spec` in `form` (None: the cheaper of quadratic and linear; the fast
    form for a scaled or unnormalised spec) (families.protocol.Family.attention).

    q, k: (B, H, N, d), v: (B, H, N, dv); any floating dtype, any strides, CPU or CUDA;
    projection W (m, d) for the Performer maps. Returns (B, H, Nq, dv) in q's dtype.
    """
    spec = defined(spec, spec.causal)
    check_tensors(q, k, v, spec, projection)
    if not spec.plain:
        return scaled(q, k, v, spec, form, projection, chunk_size)
    nq, d = q.shape[-2:]
    nk, dv = k.shape[-2], v.shape[-1]
    m = None if projection is None else projection.shape[0]
    form = form or default_form(spec, nq, nk, d, dv, m)
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    if form == "quadratic":
        check_finite(q, k, v, projection)
        return quadratic_form(q, k, v, spec, projection)
    if (form == "linear") == spec.causal:
        need = "'chunked' or 'recurrent'" if spec.causal else "'linear'"
        raise SpecError(f"form {form!r} does not fit causal={spec.causal}: use {need}")
    check_chunk_size(chunk_size)
    dtype = compute_dtype(q)
    qc, kc, vc = (t.to(dtype) for t in (q, k, v))
    w = None if projection is None else torch.as_tensor(projection).to(qc.device, dtype)
    n_pos = max(nq, nk)
    if form == "linear":
        out = _linear_native(qc, kc, vc, spec) if _native_elu(spec, qc, kc, vc) else None
        if out is None:
            check_finite(q, k, v, projection)
            out = _linear(qc, kc, vc, spec, w, n_pos)
        return out.to(q.dtype)
    stream = CausalStream(
        spec.feature_map, projection, spec.eps, chunk_size, max_len=n_pos, form=form
    )
    return stream(q, k, v)


def scaled(
    q, k, v, spec: Spec, form, projection, chunk_size, decay=None, decayed: Decay | None = None
) -> torch.Tensor:
    """The output of checked tensors of a spec that is not plain in `form` (None: the fast
    one) by scaled.py's forms; decay: its values, decayed: its pieces (Decay)."""
    form = form or fast_form(spec)
    check_finite(q, k, v, projection)
    return scaled_attention(q, k, v, spec, form, projection, chunk_size, decay, None, decayed)[0]


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
        check_chunk_size(chunk_size)
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
        dtype = compute_dtype(q)
        qc, kc, vc = (t.to(dtype) for t in (q, k, v))
        if self.state is not None and self.state.s.dtype != dtype:  # a carried-in state
            self.state = replace(self.state, s=self.state.s.to(dtype), z=self.state.z.to(dtype))
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
                result = chunked(qc, kc, vc, self.spec, w, n_pos, self.chunk_size, state, True)
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
            out, self.state = chunked(qc, kc, vc, self.spec, w, n_pos, self.chunk_size, self.state)
        return out.to(q.dtype)

    def carry(self, s: torch.Tensor, z: torch.Tensor) -> None:
        """Start from the state S (B, H, F, dv) and z (B, H, F) of a prefix (what carried()
        returned, or any such sums): the next piece continues that sequence."""
        if self.state is not None:
            raise SpecError("carry() starts a stream: this one has already run")
        if self.spec.feature_map == "cosformer":
            raise SpecError("cosformer's weights depend on the whole length: no carried state")
        if s.dim() != 4 or z.shape != s.shape[:3] or not s.is_floating_point():
            shapes = f"S {tuple(s.shape)}, z {tuple(z.shape)}"
            raise SpecError(f"a state is S (B, H, F, dv) and z (B, H, F) of floats, got {shapes}")
        self.state = State(s, z.to(s.dtype), None, 0)

    def carried(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state so far, (S, z) = (sum_j phi(k_j) v_j^T, sum_j phi(k_j)) in true units
        (shifted features scaled back: S may overflow where its units did not), in the
        dtype the stream computes in (float32, or float64 for float64 inputs)."""
        if self.state is None:
            raise SpecError("the stream has seen no token: no state yet")
        state = self.state
        if state.shift is None:
            return state.s, state.z
        scale = exp(state.shift)
        return state.s * scale, state.z * scale[..., 0]

    def _position(self) -> int:
        return 0 if self.state is None else self.state.position

    def _state_shape(self, q: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int]:
        """(B, H, F, dv) of this stream's state."""
        b, h, _, d = q.shape
        m = None if self.projection is None else self.projection.shape[0]
        return b, h, self.spec.info.feature_dim(d, m), v.shape[-1]


def attention_with_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str = "chunked",
    projection: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    initial_state: tuple[torch.Tensor, torch.Tensor] | torch.Tensor | None = None,
    arguments: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, Any]:
    """Causal attention of a sequence that continues the one whose state is initial_state
    = (S, z) (Katharopoulos et al. 2020, eq. 18-20: S = sum_j phi(k_j) v_j^T, z = sum_j
    phi(k_j) over the earlier tokens, decayed as the spec says; S alone for an unnormalised
    spec; None: nothing before). Returns the output (B, H, N, dv) in q's dtype and the state
    after the last token, (S, z) as CausalStream.carried() (S alone, unnormalised)."""
    spec = defined(spec, True)
    if not spec.plain:
        return scaled_with_state(q, k, v, spec, form, projection, chunk_size, initial_state)
    stream = CausalStream(spec.feature_map, projection, spec.eps, chunk_size, form=form)
    if initial_state is not None:
        if not isinstance(initial_state, tuple | list) or len(initial_state) != 2:
            raise SpecError("initial_state is a pair (S, z)")
        stream.carry(*initial_state)
    out = stream(q, k, v)
    return out, stream.carried()


def scaled_with_state(
    q, k, v, spec: Spec, form, projection, chunk_size, initial_state, decay=None, decayed=None
) -> tuple[torch.Tensor, Any]:
    """attention_with_state of a spec that is not plain, by scaled.py's forms; decay: its
    values, decayed: its pieces (Decay)."""
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    if initial_state is not None and spec.normalize:
        if not isinstance(initial_state, tuple | list) or len(initial_state) != 2:
            raise SpecError("initial_state is a pair (S, z)")
    elif initial_state is not None:
        initial_state = (initial_state, None)
    out, (s, z) = scaled_attention(
        q, k, v, spec, form, projection, chunk_size, decay, initial_state, decayed
    )
    return out, ((s, z) if spec.normalize else s)


# attention() of a packed batch, called as Family.attention_varlen is (implementations.forms.varlen)
attention_varlen = partial(varlen, attention)


@dataclass(frozen=True)
class WithDecay:
    """The forms of a family built on these with a decay (families/decayed/,
    families/channel_gates/): scaled.py's forms with its Decay, its values among its
    arguments gamma= or g= (pack: Family.pack), its log-gates (1, H, T) or per key channel
    (1, H, T, d) (gate_dims) sliced with a packed batch's tokens. Its methods are the
    family's attention, attention_with_state and attention_varlen (families.protocol.Family)."""

    decay: Decay
    gate_dims: int
    pack: Callable[[Spec, dict[str, Any]], Any]
    forms_of = staticmethod(forms_of)  # kernelised attention's forms

    def attention(
        self,
        q,
        k,
        v,
        spec: Spec,
        form=None,
        projection=None,
        chunk_size=DEFAULT_CHUNK,
        arguments=None,
    ) -> torch.Tensor:
        spec = defined(spec, spec.causal)
        check_tensors(q, k, v, spec, projection)
        values = self.pack(spec, arguments or {})
        return scaled(q, k, v, spec, form, projection, chunk_size, values, self.decay)

    def attention_with_state(
        self,
        q,
        k,
        v,
        spec: Spec,
        form="chunked",
        projection=None,
        chunk_size=DEFAULT_CHUNK,
        initial_state=None,
        arguments=None,
    ) -> tuple[torch.Tensor, Any]:
        spec = defined(spec, True)
        values = self.pack(spec, arguments or {})
        return scaled_with_state(
            q, k, v, spec, form, projection, chunk_size, initial_state, values, self.decay
        )

    def attention_varlen(
        self,
        q,
        k,
        v,
        spec,
        cu_seqlens,
        form=None,
        projection=None,
        chunk_size=DEFAULT_CHUNK,
        arguments=None,
    ) -> torch.Tensor:
        return varlen(
            self.attention,
            q,
            k,
            v,
            spec,
            cu_seqlens,
            form,
            projection,
            chunk_size,
            arguments,
            self.gate_dims,
        )
