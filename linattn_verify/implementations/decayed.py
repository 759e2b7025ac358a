"""The built-in forms of the specs that are not plain (specs.Spec.plain): scaled,
unnormalised or decayed linear attention, causal or not, any dtype, CPU or CUDA.

out_i = c sum_j w_ij phi(q_i).phi(k_j) v_j, divided by eps + c sum_j w_ij phi(q_i).phi(k_j)
when normalised; c the spec's scale, w_ij the decay (1 without one):

- quadratic: the weights materialised (golden.py's quadratic form);
- linear (non-causal, no decay): phi(Q) (phi(K)^T [V, 1]);
- recurrent (causal): S_i = w_i S_(i-1) + phi(k_i) v_i^T, z_i = w_i z_(i-1) + phi(k_i),
  w_i = gamma or exp(g_i), one token at a time (Sun et al. 2023, eq. 6: the recurrent
  retention);
- chunked (causal): chunks of C tokens, the decay inside a chunk from the prefix sums of its
  log-gates, the state entering it decayed by the chunk's prefix and carried to the next
  (Yang et al. 2024, "Gated linear attention", sec. 3.2, eq. 4-5, with scalar gates).
float16/bfloat16/float32 inputs are computed in float32, float64 in float64; features are
plain (features.plain_features: the maps without a shift); autograd goes through all.
"""

from __future__ import annotations

import math

import torch

from ..inputs import check_decay
from ..specs import Spec, SpecError
from .features import plain_features
from .golden import golden_attention

DECAYED_FORMS = ("quadratic", "linear", "recurrent", "chunked")
# State: (S, z) of a normalised spec, S alone otherwise
State = tuple[torch.Tensor, torch.Tensor | None]


def log_decays(decay: torch.Tensor, spec: Spec, shape: torch.Size, dtype) -> torch.Tensor:
    """ln w_t per token (B, H, N) of `shape`'s (B, H, N, d) in `dtype`: ln gamma for a
    constant decay, g itself for gates."""
    if spec.decay == "constant":
        return torch.log(decay.to(dtype))[None, :, None].expand(*shape[:3])
    return decay.to(dtype)


def decayed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    projection: torch.Tensor | None = None,
    chunk_size: int = 64,
    decay: torch.Tensor | None = None,
    initial_state: State | None = None,
) -> tuple[torch.Tensor, State | None]:
    """(out (B, H, N, dv) in q's dtype, the state after the last token for the causal
    forms, else None) of `spec` in `form` (DECAYED_FORMS), continuing initial_state."""
    if spec.info.needs_projection or spec.feature_map == "softmax":
        raise SpecError(f"the built-in forms of {spec} take plain features only")
    if form not in DECAYED_FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(DECAYED_FORMS)}")
    if spec.decay is not None:
        check_decay(decay, spec, tuple(q.shape))
    if form == "quadratic":
        if initial_state is not None:
            raise SpecError("the quadratic form carries no state")
        return golden_attention(q, k, v, spec, projection, "quadratic", decay), None
    if form == "linear" and (spec.causal or spec.decay is not None):
        raise SpecError(f"the linear form is non-causal without a decay, not {spec}")
    if form != "linear" and not spec.causal:
        raise SpecError(f"form {form!r} is causal; {spec} is not: use 'linear'")
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = (t.to(dtype) for t in (q, k, v))
    n_pos = q.shape[-2]
    phi_q = plain_features(qc, spec.feature_map, n_pos) * spec.scale_for(q.shape[-1])
    phi_k = plain_features(kc, spec.feature_map, n_pos)
    vz = torch.cat([vc, torch.ones_like(vc[..., :1])], dim=-1) if spec.normalize else vc
    if form == "linear":
        num_den = phi_q @ (phi_k.transpose(-2, -1) @ vz)
        return _finish(num_den, spec, q.dtype), None
    log_w = None
    if spec.decay is not None:
        log_w = log_decays(decay, spec, q.shape, dtype)
    state = _initial(initial_state, phi_k, vz, spec)
    step = 1 if form == "recurrent" else chunk_size
    out = []
    for start in range(0, n_pos, step):
        rows = slice(start, start + step)
        lw = None if log_w is None else log_w[..., rows]
        piece, state = _chunk(phi_q[..., rows, :], phi_k[..., rows, :], vz[..., rows, :], lw, state)
        out.append(piece)
    dv = v.shape[-1]
    final = (state[..., :dv], state[..., dv]) if spec.normalize else (state, None)
    return _finish(torch.cat(out, dim=-2), spec, q.dtype), final


def _initial(initial: State | None, phi_k, vz, spec: Spec) -> torch.Tensor:
    """The state [S | z] (B, H, F, dv (+ 1)) to start from, zero without one."""
    b, h, _, f = phi_k.shape
    if initial is None:
        return phi_k.new_zeros(b, h, f, vz.shape[-1])
    s, z = initial
    want = (b, h, f, vz.shape[-1] - spec.normalize)
    if tuple(s.shape) != want or (spec.normalize and tuple(z.shape) != want[:3]):
        raise SpecError(f"initial_state must be S {want}" + " and z (B, H, F)" * spec.normalize)
    s = s.to(phi_k.dtype)
    return torch.cat([s, z.to(phi_k.dtype)[..., None]], dim=-1) if spec.normalize else s


def _chunk(phi_q, phi_k, vz, log_w, state):
    """(num [| den] of one chunk, the state after it): the state entering it decayed by
    exp(G_i) for row i, G the chunk's inclusive prefix sums of ln w; inside it the masked
    weights exp(G_i - G_j) (Yang et al. 2024, eq. 4-5)."""
    inner = (phi_q @ phi_k.transpose(-2, -1)).tril()
    if log_w is None:
        out = phi_q @ state + inner @ vz
        return out, state + phi_k.transpose(-2, -1) @ vz
    prefix = torch.cumsum(log_w, dim=-1)  # G_i, i in the chunk
    n = prefix.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool, device=prefix.device).tril()
    gaps = (prefix[..., :, None] - prefix[..., None, :]).masked_fill(~keep, -math.inf)
    out = torch.exp(prefix)[..., None] * (phi_q @ state) + (inner * torch.exp(gaps)) @ vz
    to_end = torch.exp(prefix[..., -1:] - prefix)[..., None]  # exp(G_last - G_j)
    state = torch.exp(prefix[..., -1])[..., None, None] * state
    return out, state + (phi_k * to_end).transpose(-2, -1) @ vz


def _finish(num_den: torch.Tensor, spec: Spec, dtype: torch.dtype) -> torch.Tensor:
    """The output in `dtype`: num / (eps + den) when normalised, num otherwise."""
    if not spec.normalize:
        return num_den.to(dtype)
    return (num_den[..., :-1] / (num_den[..., -1:] + spec.eps)).to(dtype)
