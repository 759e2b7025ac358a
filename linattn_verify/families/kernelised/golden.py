"""Kernelised attention's golden forms: a plain, careful torch evaluation
(implementations/golden.py's rules) with the golden feature maps (golden_features.py).

Forms (docs/architecture.md, "Vocabulary"):

- quadratic: the (Nq, Nk) similarities materialised, masked, times V (quadratic.py);
- linear: phi(Q) (phi(K)^T V) and phi(Q) (phi(K)^T 1); causal as a scan over the tokens,
  over blocks of them for long sequences, the state carried between them and multiplied by
  each block's decay (GLA's chunk form, Yang et al. 2024, sec. 3.2 and 4.2). The accuracy
  budgets take the forms of golden_forms, the long-context check long_form's.

The decayed families build on it: they pass their decay in (GoldenDecay).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ...implementations.golden import (
    GOLDEN_FORMS,
    Weights,
    check_call,
    computed,
    finish,
    quadratic,
    total,
)
from ...inputs import ArgumentCheck, no_decay
from ...specs import Spec, summing
from . import quadratic as kernelised
from .golden_features import at_one_scale, golden_features, shifted_form

if TYPE_CHECKING:
    import numpy as np

# The causal linear form goes token by token up to SCAN_TOKENS (the order of a recurrent
# kernel: the budgets the zoo and the adapters' verdicts were set with), in blocks of
# SCAN_BLOCK beyond (a token loop at N = 2^16 is the long-context check's largest cost)
SCAN_TOKENS = 4096
SCAN_BLOCK = 64


@dataclass(frozen=True)
class GoldenDecay:
    """A decay as the golden forms take it, passed in by the family built on kernelised
    attention (families/decayed/golden.py, families/channel_gates/golden.py).

    weights: the quadratic form's weights with the decay in them
    (implementations.golden.Weights); logs(decay, spec, n, device): the scan's float64 log-decay
    of each token, (H, N, 1), (B, H, N, 1) or per key channel (B, H, N, d); check: the
    decay's check (inputs.ArgumentCheck); block(q, k, a): the scan's weights inside a block
    whose log-decays are per key channel (None: per token).
    """

    weights: Weights
    logs: Callable[..., torch.Tensor]
    check: ArgumentCheck
    block: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def golden_forms(spec: Spec) -> tuple[str, ...]:
    """The golden forms whose larger error sets `spec`'s accuracy budgets: both associations
    of a plain spec, the quadratic form alone for a scaled, unnormalised or decayed one
    (whose linear form is the long-context check's, long_form)."""
    summing(spec, "golden forms")
    return GOLDEN_FORMS if spec.plain else ("quadratic",)


def long_form(spec: Spec) -> str:
    """The golden form of the long-context check (checks/long_context.py): the linear one,
    O(N)."""
    return "linear"


def golden_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    projection: torch.Tensor | np.ndarray | None = None,
    form: str | None = None,
    decay: torch.Tensor | None = None,
    decayed: GoldenDecay | None = None,
) -> torch.Tensor:
    """Attention for `spec`, evaluated carefully in `form` ("quadratic" or "linear"; None:
    the first of golden_forms); decayed: the decay's pieces (None: no decay).

    The linear form of a scaled spec takes c once: c N / (c D + eps) as N / (D + eps / c)
    normalised (c cancels but against eps), c N unnormalised; a decayed one carries the
    state between blocks times the block's decay (_causal_scan).

    q: (B, H, Nq, d), k: (B, H, Nk, d), v: (B, H, Nk, dv), all of one floating dtype
    (float16, bfloat16, float32, float64) and one device; any strides. projection: W of
    shape (m, d) for the Performer maps (a tensor or array; cast to the compute dtype and
    moved to the inputs' device). Returns (B, H, Nq, dv) in the inputs' dtype and device.

    A zero denominator is not hidden: relu with eps = 0 gives NaN rows where no key has a
    positive similarity. Raises SpecError for bad inputs or an unknown form.
    """
    if isinstance(spec, Spec):
        form = form or golden_forms(summing(spec, "golden forms"))[0]
    check = no_decay if decayed is None else decayed.check
    check_call(q, k, v, spec, projection, form, decay, GOLDEN_FORMS, check)
    if form == "quadratic":
        weights = kernelised.weights if decayed is None else decayed.weights
        return quadratic(q, k, v, spec, projection, decay, weights)
    # sim_ij = exp(shift_i) * (computed weight_ij): the shift cancels in num / den, not in eps
    qc, kc, vc, w = computed(q, k, v, projection)
    big_m = max(qc.shape[-2], kc.shape[-2])
    shifted = shifted_form(spec, qc, kc)
    phi_q, shift_q = golden_features(qc, spec, w, big_m, shifted, divide=True)
    body_k, scale_k = golden_features(kc, spec, w, big_m, shifted, divide=True)
    if spec.causal:
        logs = None if decayed is None else decayed.logs(decay, spec, q.shape[-2], q.device)
        gated = None if decayed is None else decayed.block
        num, den, shift_k = _causal_scan(phi_q, body_k, scale_k, vc, logs, gated)
    else:
        num, den, shift_k = _linear_contract(phi_q, *at_one_scale(body_k, scale_k), vc)
    shift, scale = total(shift_q, shift_k), spec.scale_for(q.shape[-1])
    return finish(num, den, spec, scale, shift, q.dtype)


# ------------------------------------------------------------------------ linear form


def _linear_contract(
    phi_q: torch.Tensor, phi_k: torch.Tensor, shift_k: torch.Tensor | None, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Non-causal (numerator, denominator, key shift) = (phi(Q) (phi(K)^T V), phi(Q) (phi(K)^T
    1), shift_k), per (b, h)."""
    state = phi_k.transpose(-2, -1) @ v  # (B, H, F, dv)
    normaliser = phi_k.sum(dim=-2).unsqueeze(-1)  # (B, H, F, 1)
    return phi_q @ state, phi_q @ normaliser, shift_k


def _causal_scan(
    phi_q: torch.Tensor,
    body_k: torch.Tensor,
    scale_k: torch.Tensor | None,
    v: torch.Tensor,
    logs: torch.Tensor | None = None,
    gated: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Causal (numerator, denominator, key shift per row), token by token up to SCAN_TOKENS
    tokens and SCAN_BLOCK tokens at a time beyond (Katharopoulos et al. 2020, eq. 10-12):
    S_i = sum_{j<=i} w_ij phi(k_j) v_j^T, z_i = sum_{j<=i} w_ij phi(k_j), out_i = phi(q_i)
    S_i / phi(q_i) z_i: the state of the blocks before plus the masked products inside the
    block. With log-scales, row i is in units of the running maximum of the scales up to i,
    and the state in those of the end of the blocks before it, rescaled as the maximum grows.

    logs (GoldenDecay.logs): w_ij = exp(l_(j+1) + ... + l_i), per key channel for channel gates,
    in GLA's chunk form (Yang et al. 2024, sec. 3.2, 4.2): with a_i the float64 sum of the
    block's log-decays up to i, row i reads the state times exp(a_i), the block's keys
    weigh exp(a_i - a_j) and join the state times exp(a_end - a_j), the state itself times
    exp(a_end). Every factor exp(.) <= 1, formed in float64 with the log-scales' and rounded
    once (_factor; per key channel inside a block: gated, GoldenDecay.block): nothing
    overflows, a decay too strong for the dtype underflows to 0."""
    n, dv = body_k.shape[-2], v.shape[-1]
    s = v.new_zeros(*body_k.shape[:-2], body_k.shape[-1], dv + 1)  # [S, z]
    vz = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    shifts = None if scale_k is None else torch.cummax(scale_k, dim=-2).values
    out = []
    block = 1 if n <= SCAN_TOKENS else SCAN_BLOCK
    # split once: a slice per block would give the backward a full-size gradient per block
    pieces = [t.split(block, dim=-2) for t in (phi_q, body_k, vz)]
    log_pieces = None if logs is None else logs.split(block, dim=-2)
    for index, start in enumerate(range(0, n, block)):
        stop = min(start + block, n)
        q, k, x = (piece[index] for piece in pieces)
        a = a_end = None
        if log_pieces is not None:
            a = torch.cumsum(log_pieces[index], dim=-2)  # (.., L, 1) or (.., L, F)
            a_end = a[..., -1:, :]
        row = key = state = gap = None  # differences of log-scales, in the compute dtype
        if shifts is not None:
            here, prev = shifts[..., start:stop, :], shifts[..., max(start - 1, 0), None, :]
            end = shifts[..., stop - 1, None, :]
            gap = (scale_k[..., start:stop, :].transpose(-2, -1) - here).clamp(max=0.0)
            row, key, state = prev - here, scale_k[..., start:stop, :] - end, prev - end
        before = _read(q, s, _factor(row, a, q.dtype))
        out.append(before + _block_weights(q, k, a, gap, gated) @ x)
        join = _factor(key, None if a is None or stop - start == 1 else a_end - a, q.dtype)
        keep = _factor(state, a_end, q.dtype)  # (.., 1, 1) or (.., 1, F)
        k = k if join is None else k * join
        s = s if keep is None else s * keep.transpose(-2, -1)
        s = s + k.transpose(-2, -1) @ x
    num_den = torch.cat(out, dim=-2)
    return num_den[..., :dv], num_den[..., dv:], shifts


def _factor(
    x: torch.Tensor | None, logs: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """exp(x + logs) in `dtype`: x a difference of log-scales (in dtype), logs a sum of
    log-decays (float64), either absent (None where both are); formed in float64 where a
    decay takes part and rounded once."""
    if logs is None:
        return None if x is None else torch.exp(x)
    return torch.exp(logs if x is None else x.to(torch.float64) + logs).to(dtype)


def _read(q: torch.Tensor, s: torch.Tensor, factor: torch.Tensor | None) -> torch.Tensor:
    """The state as the rows read it: q s times a factor per row (.., L, 1), or (q times a
    factor per key channel (.., L, F)) s."""
    if factor is None:
        return q @ s
    return (q @ s) * factor if factor.shape[-1] == 1 else (q * factor) @ s


def _block_weights(
    q: torch.Tensor, k: torch.Tensor, a: torch.Tensor | None, gap: torch.Tensor | None, gated
) -> torch.Tensor:
    """The weights inside a block, masked (0 where j > i): phi(q_i).phi(k_j) exp(gap_ij)
    exp(a_i - a_j), a per token or per key channel (gated(q, k, a): GoldenDecay.block);
    w_ii = 1, so a block of one token is undecayed."""
    decay = None
    if a is None or a.shape[-2] == 1 or a.shape[-1] == 1:
        inner = (q @ k.transpose(-2, -1)).tril()
        if a is not None and a.shape[-2] > 1:
            decay = (a - a.transpose(-2, -1)).tril()
    else:
        inner = gated(q, k, a)
    factor = _factor(gap, decay, q.dtype)
    return inner if factor is None else inner * factor.tril()
