"""The built-in forms of the specs that are not plain (specs.Spec.plain): scaled,
unnormalised or decayed linear attention, causal or not, any dtype, CPU or CUDA.

out_i = c sum_j w_ij phi(q_i).phi(k_j) v_j, divided by eps + c sum_j w_ij phi(q_i).phi(k_j)
when normalised; c the spec's scale, w_ij the decay (1 without one):

- quadratic: the weights materialised (quadratic.py's form, golden and built-in alike);
- linear (non-causal, no decay): phi(Q) (phi(K)^T [V, 1]), the keys at one common scale;
- recurrent (causal): S_i = w_i S_(i-1) + phi(k_i) v_i^T, z_i = w_i z_(i-1) + phi(k_i),
  w_i = gamma or exp(g_i) (diag(exp(g_i)) for channel gates), one token at a time (Sun et
  al. 2023, eq. 6: the recurrent retention);
- chunked (causal): chunks of C tokens, the decay inside a chunk from the prefix sums of its
  log-gates, the state entering it decayed by the chunk's prefix and carried to the next
  (Yang et al. 2024, "Gated linear attention", sec. 3.2, eq. 4-5); channel gates decay
  each feature channel of the state by its own gate, the intra-chunk part materialised in
  log space per channel (sec. 4.2's secondary chunking at its finest, sub-chunks of one
  token: every factor exp(G_im - G_jm) <= 1, none overflows whatever the gates).

Every map, the Performer maps included: features in shifted form where features.needs_shift
says so, phi(x_j) = exp(l_j) body_j (l_j = 0 for the maps without a log-scale). The state
[S | z] is kept in units exp(U), U a running log-magnitude that the decay folds into: a key
j seen by row i weighs exp(G_i - G_j + l_j), G the prefix sums of ln w, and the row works in
units exp(R_i), R_i the largest such log-weight (the entering state's U + G_i among them),
so every factor is at most 1 and the largest is 1. The units are constants of autograd
(the output does not depend on them); the query's log-scale, R_i and c cancel in num / den
(eps rescaled, features.scaled_eps, and divided by c) or are multiplied back
(unnormalised). States in and out are in true units (S = sum_j w_(N-1,j) phi(k_j) v_j^T).
float16/bfloat16/float32 inputs are computed in float32, float64 in float64; autograd goes
through all. The decayed families build on these forms: they pass their decay in (Decay).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...implementations.forms import FORMS
from ...implementations.golden import Weights
from ...inputs import ArgumentCheck, no_decay
from ...specs import Spec, SpecError
from .features import (
    add_shifts,
    common_scale,
    exp,
    needs_shift,
    records_grad,
    scaled_eps,
    scaled_features,
)
from .quadratic import quadratic_form, weights

# State: (S, z) of a normalised spec, S alone otherwise
State = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class Decay:
    """A decay as these forms take it, passed in by the family built on kernelised attention
    (families/decayed/forms.py, families/channel_gates/forms.py): logs(decay, spec, shape,
    dtype), ln w_t in `dtype` of each token, (B, H, N, 1) of `shape`'s (B, H, N, d), or of
    each token and feature channel, (B, H, N, d); weights: the quadratic form's weights with
    the decay in them (implementations.golden.Weights); check: the decay's check
    (inputs.ArgumentCheck)."""

    logs: Callable[..., torch.Tensor]
    weights: Weights
    check: ArgumentCheck


def scaled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    projection: torch.Tensor | None = None,
    chunk_size: int = 64,
    decay: torch.Tensor | None = None,
    initial_state: State | None = None,
    decayed: Decay | None = None,
) -> tuple[torch.Tensor, State | None]:
    """(out (B, H, N, dv) in q's dtype, the state after the last token for the causal
    forms, else None) of `spec` in `form` (FORMS), continuing initial_state;
    decayed: the pieces of the decay whose values `decay` holds (None: no decay)."""
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    if spec.info.needs_projection and projection is None:
        raise SpecError(f"feature map {spec.feature_map!r} needs projection=W of shape (m, d)")
    if decayed is not None and decayed.check(decay, spec, tuple(q.shape)) is None:
        decayed = None  # a spec without a decay
    if form == "quadratic":
        if initial_state is not None:
            raise SpecError("the quadratic form carries no state")
        weighted = weights if decayed is None else decayed.weights
        check = no_decay if decayed is None else decayed.check
        return quadratic_form(q, k, v, spec, projection, decay, weighted, check), None
    if form == "linear" and spec.causal:  # a decay is causal (specs.Spec)
        raise SpecError(f"the linear form is non-causal without a decay, not {spec}")
    if form != "linear" and not spec.causal:
        raise SpecError(f"form {form!r} is causal; {spec} is not: use 'linear'")
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = (t.to(dtype) for t in (q, k, v))
    w = None if projection is None else torch.as_tensor(projection).to(q.device, dtype)
    n_pos, shifted = max(q.shape[-2], k.shape[-2]), needs_shift(spec, qc, kc)
    body_q, scale_q = scaled_features(qc, spec, w, n_pos, 0, shifted)
    body_k, scale_k = scaled_features(kc, spec, w, n_pos, 0, shifted)
    vz = torch.cat([vc, torch.ones_like(vc[..., :1])], dim=-1) if spec.normalize else vc
    if form == "linear":
        phi_k, shift_k = common_scale(body_k, scale_k)
        num_den = body_q @ (phi_k.transpose(-2, -1) @ vz)
        return _finish(num_den, spec, q.shape[-1], add_shifts(scale_q, shift_k), q.dtype), None
    if scale_k is None:
        scale_k = torch.zeros_like(body_k[..., :1])
    log_w = torch.zeros_like(vc[..., :1])
    if decayed is not None:
        log_w = decayed.logs(decay, spec, q.shape, dtype)
    state, units = _initial(initial_state, body_k, vz, spec)
    step = 1 if form == "recurrent" else chunk_size
    out, rows = [], []
    for start in range(0, q.shape[-2], step):
        tokens = slice(start, start + step)
        pieces = (t[..., tokens, :] for t in (body_q, body_k, scale_k, vz))
        piece, row_units, state, units = _chunk(*pieces, log_w[..., tokens, :], state, units)
        out.append(piece)
        rows.append(row_units)
    logs = add_shifts(scale_q, torch.cat(rows, dim=-2))
    state = _times_exp(state, units)  # true units
    dv = v.shape[-1]
    final = (state[..., :dv], state[..., dv]) if spec.normalize else (state, None)
    return _finish(torch.cat(out, dim=-2), spec, q.shape[-1], logs, q.dtype), final


def _initial(initial: State | None, body_k, vz, spec: Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """(the state [S | z] (B, H, F, dv (+ 1)) to start from, its log-units U (B, H, 1, 1)):
    initial_state as given (U = 0), U = -inf where it is zero (none: zero), so that a first
    key sets the units; but a zero state that takes a gradient stays in true units (U = 0),
    or its gradient would be multiplied by exp(-inf) = 0 (keys far below 1 then underflow
    against it, as against any state given)."""
    b, h, _, f = body_k.shape
    if initial is None:
        return body_k.new_zeros(b, h, f, vz.shape[-1]), body_k.new_full((b, h, 1, 1), -math.inf)
    s, z = initial
    want = (b, h, f, vz.shape[-1] - spec.normalize)
    if tuple(s.shape) != want or (spec.normalize and tuple(z.shape) != want[:3]):
        raise SpecError(f"initial_state must be S {want}" + " and z (B, H, F)" * spec.normalize)
    s = s.to(body_k.dtype)
    if spec.normalize:
        s = torch.cat([s, z.to(body_k.dtype)[..., None]], dim=-1)
    given = (s != 0).flatten(-2).any(dim=-1)[..., None, None] | records_grad(s)
    return s, torch.where(given, 0.0, -math.inf).to(s.dtype)


def _chunk(body_q, body_k, scale_k, vz, log_w, state, units):
    """(num [| den] of one chunk in units exp(R_i) per row, R (B, H, C, 1), the state after
    it and its units). log_w (B, H, C, 1) or, for channel gates, (B, H, C, F). G_i the
    chunk's inclusive prefix sums of ln w (Yang et al. 2024, eq. 4-5; per channel, sec. 4.2,
    the intra-chunk part in log space): key j weighs exp(l_j + G_im - G_jm) in feature m at
    row i (j <= i), the entering state exp(U + G_im); R_i the largest of them, the state
    after the chunk in units R_last. Each exponent is a difference of nearby log-scales plus
    the decay's, (l_j - R_i) + (G_im - G_jm) and (U - R_i) + G_im: exact differences where
    the scales are large, and a rounded R costs nothing (the factors make up for it)."""
    prefix = torch.cumsum(log_w, dim=-2)  # G_i, i in the chunk, (B, H, C, 1 or F)
    n = prefix.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool, device=prefix.device).tril()[..., None]
    decays = (prefix[..., :, None, :] - prefix[..., None, :, :]).masked_fill(~keep, -math.inf)
    logs_k = scale_k.transpose(-2, -1)  # l_j, (B, H, 1, C)
    largest = (decays.amax(dim=-1) + logs_k).amax(dim=-1)
    rows = torch.maximum(units[..., 0] + prefix.amax(dim=-1), largest)
    rows = rows.detach()[..., None]  # R_i, (B, H, C, 1)
    weights = exp((logs_k - rows)[..., None] + decays)  # (B, H, C, C, 1 or F)
    entering = exp((units - rows) + prefix)
    if log_w.shape[-1] == 1:
        inner = (body_q @ body_k.transpose(-2, -1)) * weights[..., 0]
        out = entering * (body_q @ state) + inner @ vz
    else:
        inner = torch.einsum("...im,...jm,...ijm->...ij", body_q, body_k, weights)
        out = (entering * body_q) @ state + inner @ vz
    end = rows[..., -1:, :]  # R_last, (B, H, 1, 1)
    to_end = exp((scale_k - end) + decays[..., -1, :, :])  # key j at the chunk's end
    state = exp((units - end) + prefix[..., -1, :, None]) * state
    return out, rows, state + (body_k * to_end).transpose(-2, -1) @ vz, end


def _times_exp(x: torch.Tensor, log: torch.Tensor) -> torch.Tensor:
    """x exp(log) by two factors exp(log / 2), so that a factor overflows only where the
    product of a normal x does; where x is 0, 0 (never 0 * inf) with the derivative
    exp(log) (at most the dtype's largest). The general branch sees x = 1, log = 0 there,
    so that no NaN of it reaches the gradient."""
    zero = x == 0
    safe_x = torch.where(zero, torch.ones_like(x), x)
    safe_log = torch.where(zero, torch.zeros_like(log), log)
    half = safe_log / 2
    general = safe_x * exp(half) * exp(safe_log - half)
    at_zero = x * exp(log).clamp(max=torch.finfo(x.dtype).max)
    return torch.where(zero, at_zero, general)


def _finish(num_den, spec: Spec, d: int, logs, dtype: torch.dtype) -> torch.Tensor:
    """The output in `dtype` of the unscaled num [| den] in units exp(logs) per row (None:
    1): c num / (eps + c den) = num / (eps / c + den) when normalised (the units cancel, eps
    rescaled: no rounding by c), c num exp(logs) otherwise."""
    c = spec.scale_for(d)
    if not spec.normalize:
        return (c * (num_den if logs is None else _times_exp(num_den, logs))).to(dtype)
    num, den = num_den[..., :-1], num_den[..., -1:]
    return (num / (den + scaled_eps(spec.eps / c, logs))).to(dtype)
