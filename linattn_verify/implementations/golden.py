"""The golden implementation: a plain, careful torch evaluation of every spec.

It sets the accuracy budget (docs/accuracy.md, "The budget"): an implementation's error is judged
against k times the error of this one in the same dtype on the same inputs. So it is written
for accuracy, not speed:

- wide accumulation: float16/bfloat16/float32 inputs are computed in float32, float64
  inputs in float64; the output is rounded once, to the input dtype, at the end;
- exponentials are evaluated in shifted form so that nothing overflows the compute dtype
  (the shifts cancel between numerator and denominator, and scale `eps` accordingly);
- no cancellation where the formula allows none (elu(x) + 1 as where(x > 0, x + 1, exp(x)));
- its own plain feature maps (golden_features.py): torch's exp, sin and cos, nothing shared
  with the fast forms it budgets (no C kernel, no exp2).

Output row i = sum_j sim(q_i, k_j) v_j / (eps + sum_j sim(q_i, k_j)), key j used by query i
iff j <= i when causal (docs/contract.md, "The specs").

Forms (docs/architecture.md, "Vocabulary"):

- quadratic: materialise the (Nq, Nk) similarities, mask, multiply by V;
- linear: phi(Q) (phi(K)^T V) and phi(Q) (phi(K)^T 1); causal as a scan over the tokens,
  over blocks of them for long sequences, the state carried between them and multiplied by
  each block's decay (GLA's chunk form, Yang et al. 2024, sec. 3.2 and 4.2). Every
  kernelised spec but the delta rule's has it; the accuracy budgets take the forms of
  golden_forms, the long-context check long_form's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..inputs import validate
from ..specs import Spec, SpecError, summing
from .golden_features import at_one_scale, eps_in_units, golden_features, shifted_form, total

if TYPE_CHECKING:
    import numpy as np

GOLDEN_FORMS: tuple[str, ...] = ("quadratic", "linear")
GATED_ELEMENTS = 2**24  # channel gates' factors exp(G_im - G_jm) held at once (128 MiB)
# The causal linear form goes token by token up to SCAN_TOKENS (the order of a recurrent
# kernel: the budgets the zoo and the adapters' verdicts were set with), in blocks of
# SCAN_BLOCK beyond (a token loop at N = 2^16 is the long-context check's largest cost)
SCAN_TOKENS = 4096
SCAN_BLOCK = 64
# Channel gates inside a block of the scan in GLA's factored form (q e^a)(k e^-a)^T where the
# block's decay spans at most this: its float64 operands stay within e^256 = 2^369 of the
# features (float64 reaches 2^1023), pairwise factors (N x N x d exps) beyond
FACTORED_SPAN = 256.0


def golden_forms(spec: Spec) -> tuple[str, ...]:
    """The golden forms whose larger error sets `spec`'s accuracy budgets: both associations
    of a plain kernelised spec, the quadratic form alone for softmax (it has no finite
    feature map) and for a scaled, unnormalised or decayed one (whose linear form is the
    long-context check's, long_form). The delta rule's golden form is its family's
    (families/delta/golden.py)."""
    summing(spec, "golden forms")
    return GOLDEN_FORMS if spec.info.kernelised and spec.plain else ("quadratic",)


def long_form(spec: Spec) -> str:
    """The golden form of the long-context check (checks/long_context.py), O(N) where the
    spec allows: the linear one for every kernelised spec, the quadratic form for softmax."""
    return "linear" if spec.info.kernelised else "quadratic"


def golden_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    projection: torch.Tensor | np.ndarray | None = None,
    form: str | None = None,
    decay: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention for `spec`, evaluated carefully in `form` ("quadratic", or "linear" for
    every kernelised spec; None: the first of golden_forms).

    The linear form of a scaled spec takes c once: c N / (c D + eps) as N / (D + eps / c)
    normalised (c cancels but against eps), c N unnormalised; a decayed one carries the
    state between blocks times the block's decay (_causal_scan).

    q: (B, H, Nq, d), k: (B, H, Nk, d), v: (B, H, Nk, dv), all of one floating dtype
    (float16, bfloat16, float32, float64) and one device; any strides. projection: W of
    shape (m, d) for the Performer maps (a tensor or array; cast to the compute dtype and
    moved to the inputs' device). Returns (B, H, Nq, dv) in the inputs' dtype and device.

    A zero denominator is not hidden: relu with eps = 0 gives NaN rows where no key has a
    positive similarity. Raises SpecError for bad inputs, an unknown form, or the linear
    form of softmax (which has no finite feature map).
    """
    if isinstance(spec, Spec):
        form = form or golden_forms(summing(spec, "golden forms"))[0]
    _check_call(q, k, v, spec, projection, form, decay)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    qc, kc, vc = (t.to(compute) for t in (q, k, v))
    w = None
    if projection is not None:
        w = torch.as_tensor(projection).to(device=q.device, dtype=compute)

    # sim_ij = exp(shift_i) * (computed weight_ij): the shift cancels in num / den, not in eps
    if form == "quadratic":
        gates = None
        if spec.decay == "channel-gates":  # per channel: inside the similarities
            gates = torch.cumsum(decay.to(torch.float64), dim=-2)
        weights, shift = quadratic_weights(qc, kc, spec, w, gates)
        if spec.decay is not None and gates is None:
            weights = weights * decay_matrix(decay, spec, qc.shape).to(compute)
        weights = weights * spec.scale_for(q.shape[-1])
        num, den, scale = weights @ vc, weights.sum(dim=-1, keepdim=True), 1.0  # c in weights
    else:
        big_m = max(qc.shape[-2], kc.shape[-2])
        shifted = shifted_form(spec, qc, kc)
        phi_q, shift_q = golden_features(qc, spec, w, big_m, shifted, divide=True)
        body_k, scale_k = golden_features(kc, spec, w, big_m, shifted, divide=True)
        if spec.causal:
            logs = _log_decays(decay, spec, q.shape[-2], q.device)
            num, den, shift_k = _causal_scan(phi_q, body_k, scale_k, vc, logs)
        else:
            num, den, shift_k = _linear_contract(phi_q, *at_one_scale(body_k, scale_k), vc)
        shift, scale = total(shift_q, shift_k), spec.scale_for(q.shape[-1])
    if not spec.normalize:  # c N exp(shift)
        num = num * scale
        return (num if shift is None else num * torch.exp(shift)).to(q.dtype)
    return (num / (den + eps_in_units(spec.eps / scale, shift))).to(q.dtype)


# --------------------------------------------------------------------------- checks


def _check_call(
    q: object, k: object, v: object, spec: object, projection: object, form: object, decay
) -> None:
    """Raise SpecError for anything golden_attention cannot evaluate as the spec says."""
    if not isinstance(spec, Spec):
        raise SpecError(f"spec must be a linattn_verify.Spec, got {type(spec).__name__}")
    if form not in GOLDEN_FORMS:
        raise SpecError(f"unknown form {form!r}; golden forms: {', '.join(GOLDEN_FORMS)}")
    if form == "linear" and not spec.info.kernelised:
        raise SpecError(f"{spec} has no golden {form} form: use form='quadratic'")
    validate(q, k, v, spec, projection, decay)  # shapes, dtypes, values, projection, decay
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not (q.dtype == k.dtype == v.dtype):
        raise SpecError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise SpecError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


# --------------------------------------------------------------------- quadratic form


def quadratic_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    spec: Spec,
    w: torch.Tensor | None,
    gates: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weights, shift): sim_ij = exp(shift_i) * weights_ij, masked (zero) where j > i.

    shift is None when the weights are the similarities themselves. gates: the float64
    prefix sums G (B, H, N, d) of a channel-gated spec's log-gates (_gated_products).
    """
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    mask = None
    if spec.causal:
        mask = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril()
    name = spec.feature_map

    if name == "softmax":
        # Vaswani et al. 2017, eq. 1: sim = exp(q.k / sqrt(d)); the row max is subtracted
        # from the (masked) logits, so every weight is in [0, 1] and the largest is 1.
        logits = (q @ k.transpose(-2, -1)) * d**-0.5
        if mask is not None:
            logits = logits.masked_fill(~mask, -math.inf)
        row_max = logits.amax(dim=-1, keepdim=True)  # finite: key j = i is never masked
        return torch.exp(logits - row_max), row_max

    if name == "taylor":
        # Arora et al. 2024 (Based), sec. 3: sim = 1 + s + s^2/2, s = q.k / sqrt(d).
        s = (q @ k.transpose(-2, -1)) * d**-0.5
        weights, shift = 1.0 + s + 0.5 * (s * s), None
    elif name == "cosformer":
        # Qin et al. 2022, eq. 9-11: relu(q_i).relu(k_j) cos(pi (i - j) / (2M)),
        # M = max(Nq, Nk); the position difference is formed exactly, in integers.
        diff = torch.arange(nq, device=q.device)[:, None] - torch.arange(nk, device=q.device)
        reweight = torch.cos(diff.to(q.dtype) * (math.pi / (2 * max(nq, nk))))
        weights = (torch.relu(q) @ torch.relu(k).transpose(-2, -1)) * reweight
        shift = None
    else:
        shifted = shifted_form(spec, q, k)
        phi_q, shift_q = golden_features(q, spec, w, max(nq, nk), shifted)
        body_k, scale_k = golden_features(k, spec, w, max(nq, nk), shifted)
        if scale_k is None:
            weights, shift_k = _gated_products(phi_q, body_k, gates), None
        elif mask is None:
            phi_k, shift_k = at_one_scale(body_k, scale_k)
            weights = phi_q @ phi_k.transpose(-2, -1)
        else:  # each query's own scale: the largest over the keys it sees (j <= i)
            shift_k = torch.cummax(scale_k, dim=-2).values  # (B, H, N, 1)
            gap = (scale_k.transpose(-2, -1) - shift_k).masked_fill(~mask, -math.inf)
            weights = _gated_products(phi_q, body_k, gates) * torch.exp(gap)
        shift = total(shift_q, shift_k)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights, shift


def _gated_products(
    phi_q: torch.Tensor, phi_k: torch.Tensor, gates: torch.Tensor | None
) -> torch.Tensor:
    """phi(q_i) . phi(k_j), or with channel gates sum_m phi(q_i)_m phi(k_j)_m exp(G_im -
    G_jm) for j <= i (0 above the diagonal; Yang et al. 2024, sec. 4.1's parallel form in
    log space): each factor exp(G_im - G_jm) <= 1 from the float64 prefix sums G, rounded
    once to the compute dtype. GATED_ELEMENTS bounds the (rows, N, d) factors held at once."""
    if gates is None:
        return phi_q @ phi_k.transpose(-2, -1)
    n = gates.shape[-2]
    rows = max(1, GATED_ELEMENTS // max(1, gates[..., 0, 0].numel() * n * gates.shape[-1]))
    keep = torch.ones(n, n, dtype=torch.bool, device=gates.device).tril()[..., None]
    parts = []
    for start in range(0, n, rows):
        block = slice(start, start + rows)
        logs = gates[..., block, None, :] - gates[..., None, :, :]
        factors = torch.exp(logs.masked_fill(~keep[block], -math.inf)).to(phi_q.dtype)
        rows_q = phi_q[..., block, :]
        parts.append(torch.einsum("...im,...jm,...ijm->...ij", rows_q, phi_k, factors))
    return torch.cat(parts, dim=-2)


def decay_matrix(decay: torch.Tensor, spec: Spec, shape: torch.Size) -> torch.Tensor:
    """w_ij in float64, (H, N, N) for gamma and (B, H, N, N) for gates, 0 for j > i:
    gamma^(i - j) = exp((i - j) ln gamma) or exp(G_i - G_j), G the float64 prefix sums of
    the log-gates (Sun et al. 2023, eq. 5; Yang et al. 2024, eq. 3)."""
    n = shape[-2]
    steps = torch.arange(n, device=decay.device, dtype=torch.float64)
    if spec.decay == "constant":
        log_w = (steps[:, None] - steps) * torch.log(decay.to(torch.float64))[:, None, None]
    else:
        prefix = torch.cumsum(decay.to(torch.float64), dim=-1)
        log_w = prefix[..., :, None] - prefix[..., None, :]
    keep = torch.ones(n, n, dtype=torch.bool, device=decay.device).tril()
    return torch.exp(log_w.masked_fill(~keep, -math.inf))


# ------------------------------------------------------------------------ linear form


def _linear_contract(
    phi_q: torch.Tensor, phi_k: torch.Tensor, shift_k: torch.Tensor | None, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Non-causal (numerator, denominator, key shift) = (phi(Q) (phi(K)^T V), phi(Q) (phi(K)^T
    1), shift_k), per (b, h)."""
    state = phi_k.transpose(-2, -1) @ v  # (B, H, F, dv)
    normaliser = phi_k.sum(dim=-2).unsqueeze(-1)  # (B, H, F, 1)
    return phi_q @ state, phi_q @ normaliser, shift_k


def _log_decays(
    decay: torch.Tensor | None, spec: Spec, n: int, device: torch.device
) -> torch.Tensor | None:
    """The log-decay of each token in float64, (H, N, 1) ln gamma, (B, H, N, 1) g or (B, H,
    N, d) the channel gates g, for the scan to sum inside its blocks; None without a decay."""
    if spec.decay is None:
        return None
    logs = decay.to(device=device, dtype=torch.float64)
    if spec.decay == "constant":
        return torch.log(logs)[:, None, None].expand(-1, n, 1)
    return logs[..., None] if spec.decay == "gates" else logs


def _causal_scan(
    phi_q: torch.Tensor,
    body_k: torch.Tensor,
    scale_k: torch.Tensor | None,
    v: torch.Tensor,
    logs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Causal (numerator, denominator, key shift per row), token by token up to SCAN_TOKENS
    tokens and SCAN_BLOCK tokens at a time beyond (Katharopoulos et al. 2020, eq. 10-12):
    S_i = sum_{j<=i} w_ij phi(k_j) v_j^T, z_i = sum_{j<=i} w_ij phi(k_j), out_i = phi(q_i)
    S_i / phi(q_i) z_i: the state of the blocks before plus the masked products inside the
    block. With log-scales, row i is in units of the running maximum of the scales up to i,
    and the state in those of the end of the blocks before it, rescaled as the maximum grows.

    logs (_log_decays): w_ij = exp(l_(j+1) + ... + l_i), per key channel for channel gates,
    in GLA's chunk form (Yang et al. 2024, sec. 3.2, 4.2): with a_i the float64 sum of the
    block's log-decays up to i, row i reads the state times exp(a_i), the block's keys
    weigh exp(a_i - a_j) and join the state times exp(a_end - a_j), the state itself times
    exp(a_end). Every factor exp(.) <= 1, formed in float64 with the log-scales' and rounded
    once (_factor; channel gates inside a block: _gated_block): nothing overflows, a decay
    too strong for the dtype underflows to 0."""
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
        out.append(before + _block_weights(q, k, a, gap) @ x)
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
    q: torch.Tensor, k: torch.Tensor, a: torch.Tensor | None, gap: torch.Tensor | None
) -> torch.Tensor:
    """The weights inside a block, masked (0 where j > i): phi(q_i).phi(k_j) exp(gap_ij)
    exp(a_i - a_j), a per token or per key channel (_gated_block); w_ii = 1, so a block of
    one token is undecayed."""
    decay = None
    if a is None or a.shape[-2] == 1 or a.shape[-1] == 1:
        inner = (q @ k.transpose(-2, -1)).tril()
        if a is not None and a.shape[-2] > 1:
            decay = (a - a.transpose(-2, -1)).tril()
    else:
        inner = _gated_block(q, k, a)
    factor = _factor(gap, decay, q.dtype)
    return inner if factor is None else inner * factor.tril()


def _gated_block(q: torch.Tensor, k: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """sum_m q_im k_jm exp(a_im - a_jm) for j <= i (0 above), a (.., L, F) the block's
    float64 prefix sums of the channel gates, formed in float64 and rounded once to q's
    dtype: as (q_i exp(a_i)) . (k_j exp(-a_j)), GLA's chunk form (Yang et al. 2024, sec.
    4.2), where the block's decay spans at most FACTORED_SPAN, else factor by factor
    (_gated_products, whose exp(a_im - a_jm) <= 1 cannot overflow)."""
    q64, k64 = q.to(torch.float64), k.to(torch.float64)
    if bool((a[..., -1, :] >= -FACTORED_SPAN).all()):  # a decreases: its last row is least
        inner = ((q64 * torch.exp(a)) @ (k64 * torch.exp(-a)).transpose(-2, -1)).tril()
    else:
        inner = _gated_products(q64, k64, a)
    return inner.to(q.dtype)
