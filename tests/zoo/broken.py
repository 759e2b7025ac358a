"""Broken implementations: each carries one realistic kernel bug and is careful otherwise.

float16, bfloat16 and float32 inputs are computed in float32 and float64 inputs in float64,
and the output is cast back to the inputs' dtype, so that only the intended bug shows.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Entry

CHUNK = 16  # tokens per chunk of the chunked mutants


def _widen(*ts: Tensor) -> tuple[Tensor, ...]:
    """The tensors in the compute dtype of the first: float64 for float64, else float32."""
    dtype = torch.float64 if ts[0].dtype == torch.float64 else torch.float32
    return tuple(t.to(dtype) for t in ts)


def _elu1(x: Tensor) -> Tensor:
    """elu(x) + 1 without cancellation: x + 1 above 0, exp(x) below."""
    return torch.exp(torch.clamp(x, max=0.0)) + torch.relu(x)


def _elu1_row_scaled(x: Tensor) -> Tensor:
    """elu(x) + 1 divided by its row's largest entry where the whole row is negative (a
    factor that cancels for queries): no 0/0 from a query row of -60000."""
    shift = torch.clamp(x.amax(dim=-1, keepdim=True), max=0.0)
    return torch.exp(torch.clamp(x, max=0.0) - shift) + torch.relu(x)


def _elu_inputs(q, k, v) -> tuple[Tensor, Tensor, Tensor]:
    qc, kc, vc = _widen(q, k, v)
    return _elu1_row_scaled(qc), _elu1(kc), vc


def _linear(fq, fk, v, eps: float = 0.0) -> Tensor:
    """Non-causal phi(Q) (phi(K)^T V) / (eps + phi(Q) (phi(K)^T 1))."""
    num = fq @ (fk.mT @ v)
    den = fq @ fk.sum(dim=-2).unsqueeze(-1)
    return num / (den + eps)


def _normalised(weights, v) -> Tensor:
    """(weights V) / (weights 1): the quadratic form."""
    return (weights @ v) / weights.sum(dim=-1, keepdim=True)


def _chunked(fq, fk, v, s=None, z=None, state_dtype=None, skip_partial_tile=False):
    """Causal attention in chunks of CHUNK tokens: the state (s, z) of the earlier chunks plus
    the masked block inside each chunk. Returns (out, s, z), the state to resume from."""
    b, h, n, f = fk.shape
    s = fk.new_zeros(b, h, f, v.shape[-1]) if s is None else s
    z = fk.new_zeros(b, h, f) if z is None else z
    outs = []
    for start in range(0, n, CHUNK):
        qc, kc, vc = (t[..., start : start + CHUNK, :] for t in (fq, fk, v))
        inner = (qc @ kc.mT).tril()
        if skip_partial_tile and qc.shape[-2] < CHUNK:
            inner = torch.zeros_like(inner)
        num = qc @ s + inner @ vc
        den = qc @ z.unsqueeze(-1) + inner.sum(dim=-1, keepdim=True)
        outs.append(num / den)
        s, z = s + kc.mT @ vc, z + kc.sum(dim=-2)
        if state_dtype is not None:
            s, z = s.to(state_dtype).to(fk.dtype), z.to(state_dtype).to(fk.dtype)
    return torch.cat(outs, dim=-2), s, z


def causal_mask_off_by_one(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu whose mask lets query i see key i + 1."""
    fq, fk, vc = _elu_inputs(q, k, v)
    return _normalised((fq @ fk.mT).tril(1), vc).to(q.dtype)


def anti_causal_mask(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu masked with triu instead of tril: query i sees keys j >= i."""
    fq, fk, vc = _elu_inputs(q, k, v)
    return _normalised((fq @ fk.mT).triu(), vc).to(q.dtype)


def missing_normaliser(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu that returns the numerator only."""
    fq, fk, vc = _elu_inputs(q, k, v)
    return (fq @ (fk.mT @ vc)).to(q.dtype)


def bf16_kv_state(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Chunked causal elu whose state is rounded to bfloat16 after every chunk."""
    out, _, _ = _chunked(*_elu_inputs(q, k, v), state_dtype=torch.bfloat16)
    return out.to(q.dtype)


def elu_without_plus_one(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal attention with phi = elu (the + 1 forgotten)."""
    qc, kc, vc = _widen(q, k, v)
    return _linear(F.elu(qc), F.elu(kc), vc).to(q.dtype)


def oversized_eps(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu adding 1e-3 to the denominator while claiming eps = 0."""
    return _linear(*_elu_inputs(q, k, v), eps=1e-3).to(q.dtype)


def ragged_tail_chunk(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Chunked causal elu whose 16 x 16 tile skips the within-chunk block of a partial chunk."""
    out, _, _ = _chunked(*_elu_inputs(q, k, v), skip_partial_tile=True)
    return out.to(q.dtype)


def batch_mixing(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu whose KV state and normaliser are summed over the batch."""
    fq, fk, vc = _elu_inputs(q, k, v)
    s = (fk.mT @ vc).sum(dim=0, keepdim=True)
    z = fk.sum(dim=(0, -2)).unsqueeze(-1)
    return ((fq @ s) / (fq @ z)).to(q.dtype)


def _bnhd_elu(q, k, v) -> Tensor:
    """Non-causal elu for the (B, N, H, d) layout, correct in itself."""
    out = _linear(*_elu_inputs(*(t.transpose(1, 2) for t in (q, k, v))))
    return out.transpose(1, 2)


def head_mixing_reshape(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """An adapter to a (B, N, H, d) kernel that reshapes where it must transpose."""
    b, h, n, _ = q.shape
    out = _bnhd_elu(*(t.reshape(b, n, h, t.shape[-1]) for t in (q, k, v)))
    return out.reshape(b, h, n, -1).to(q.dtype)


def causal_numerator_full_denominator(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu with a masked numerator over an unmasked denominator."""
    fq, fk, vc = _elu_inputs(q, k, v)
    weights = fq @ fk.mT
    return ((weights.tril() @ vc) / weights.sum(dim=-1, keepdim=True)).to(q.dtype)


def _as_if_contiguous(t: Tensor) -> Tensor:
    """t's storage read with row-major strides, as a raw-pointer kernel would read it."""
    strides = torch.empty(t.shape, device="meta").stride()
    return torch.as_strided(t, t.shape, strides, t.storage_offset())


def contiguous_stride_assumption(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu that ignores the inputs' strides."""
    qs, ks, vs = (_as_if_contiguous(t) for t in (q, k, v))
    return _linear(*_elu_inputs(qs, ks, vs)).to(q.dtype)


def float32_output(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu returning its float32 compute dtype for float16/bfloat16 inputs."""
    return _linear(*_elu_inputs(q, k, v))


def fp16_normaliser(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu whose normaliser sum_j phi(k_j) is accumulated in the input dtype."""
    fq, fk, vc = _elu_inputs(q, k, v)
    z = fk.to(q.dtype).sum(dim=-2).to(fk.dtype)
    return ((fq @ (fk.mT @ vc)) / (fq @ z.unsqueeze(-1))).to(q.dtype)


def elu_input_dtype(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu whose features elu(x) + 1 are formed in the input dtype."""
    fq, fk, vc = _widen(F.elu(q) + 1, F.elu(k) + 1, v)
    return _linear(fq, fk, vc).to(q.dtype)


def relu_plus_one(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal attention with phi = relu(x) + 1 where the spec says elu(x) + 1."""
    qc, kc, vc = _widen(q, k, v)
    return _linear(torch.relu(qc) + 1, torch.relu(kc) + 1, vc).to(q.dtype)


def leftover_position_decay(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu weighted by a leftover decay 0.99^|i - j|."""
    fq, fk, vc = _elu_inputs(q, k, v)
    i = torch.arange(q.shape[-2], device=q.device)[:, None]
    j = torch.arange(k.shape[-2], device=q.device)[None, :]
    decay = torch.pow(0.99, (i - j).abs().to(fq.dtype))
    return _normalised((fq @ fk.mT) * decay, vc).to(q.dtype)


class _ForgetfulStream:
    """Chunked causal elu over pieces that carry S but restart the normaliser z at zero."""

    def __init__(self) -> None:
        self.s: Tensor | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out, self.s, _ = _chunked(*_elu_inputs(q, k, v), s=self.s)
        return out.to(q.dtype)


def stream_forgets_normaliser(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The forgetful stream in one piece (right: the bug needs a second piece)."""
    return _ForgetfulStream()(q, k, v)


def softmax_no_max_subtraction(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal softmax as exp(s) without subtracting the row maximum."""
    qc, kc, vc = _widen(q, k, v)
    return _normalised(torch.exp(qc @ kc.mT / math.sqrt(q.shape[-1])), vc).to(q.dtype)


def softmax_missing_scale(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax of q.k without the 1/sqrt(d)."""
    qc, kc, vc = _widen(q, k, v)
    s = qc @ kc.mT
    visible = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
    s = s.masked_fill(~visible, -math.inf)
    return _normalised(torch.exp(s - s.amax(dim=-1, keepdim=True)), vc).to(q.dtype)


def _performer(q, k, v, w, exponent) -> Tensor:
    """Non-causal Performer with features exp(exponent(x, W)), shifted by the row maximum
    for queries and the largest over all keys of a head (shifts cancel; so does 1/sqrt(m))."""
    qc, kc, vc, wc = _widen(q, k, v, w)
    lq, lk = exponent(qc, wc), exponent(kc, wc)
    fq = torch.exp(lq - lq.amax(dim=-1, keepdim=True))
    fk = torch.exp(lk - lk.amax(dim=(-2, -1), keepdim=True))
    return _linear(fq, fk, vc).to(q.dtype)


def _exponent_no_norm_factor(x, w) -> Tensor:
    return (x * x.shape[-1] ** -0.25) @ w.mT


def _exponent_no_input_scaling(x, w) -> Tensor:
    return x @ w.mT - 0.5 * (x * x).sum(dim=-1, keepdim=True)


def performer_no_norm_factor(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """performer-positive without exp(-|x'|^2/2) (harmless for queries, not for keys)."""
    return _performer(q, k, v, projection, _exponent_no_norm_factor)


def performer_no_input_scaling(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """performer-positive with x' = x instead of x d^(-1/4)."""
    return _performer(q, k, v, projection, _exponent_no_input_scaling)


def performer_unstabilised(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """performer-positive evaluated literally in the input dtype, exponent unshifted."""
    w = projection.to(q.dtype)

    def phi(x: Tensor) -> Tensor:
        xs = x * x.shape[-1] ** -0.25
        exponent = xs @ w.mT - 0.5 * (xs * xs).sum(dim=-1, keepdim=True)
        return torch.exp(exponent) / math.sqrt(w.shape[0])

    return _linear(phi(q), phi(k), v)


def _cosformer_phi(x, angle_step: float) -> Tensor:
    """[relu(x_i) cos(a_i), relu(x_i) sin(a_i)] with a_i = i angle_step."""
    angle = torch.arange(x.shape[-2], device=x.device, dtype=x.dtype) * angle_step
    r = torch.relu(x)
    return torch.cat([r * angle.cos()[:, None], r * angle.sin()[:, None]], dim=-1)


def cosformer_angle_missing_two(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal cosFormer with angle pi (i - j) / M instead of pi (i - j) / (2M)."""
    qc, kc, vc = _widen(q, k, v)
    step = math.pi / max(q.shape[-2], k.shape[-2])
    return _linear(_cosformer_phi(qc, step), _cosformer_phi(kc, step), vc).to(q.dtype)


def taylor_missing_half(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal taylor with 1 + s + s^2 instead of 1 + s + s^2/2."""
    qc, kc, vc = _widen(q, k, v)
    s = qc @ kc.mT / math.sqrt(q.shape[-1])
    return _normalised(1 + s + s * s, vc).to(q.dtype)


def _broken(name: str, fn, feature_map: str, causal: bool, bug: str, **extra) -> Entry:
    return Entry(name, fn, feature_map, causal, broken=True, bug=bug, **extra)


ENTRIES: tuple[Entry, ...] = (
    _broken(
        "causal-mask-off-by-one",
        causal_mask_off_by_one,
        "elu",
        causal=True,
        bug="the causal mask is tril(1): query i also sees key i + 1",
        caught_by=("causality",),
    ),
    _broken(
        "anti-causal-mask",
        anti_causal_mask,
        "elu",
        causal=True,
        bug="the causal mask is triu: query i sees the keys j >= i instead of j <= i",
        caught_by=("causality",),
    ),
    _broken(
        "missing-normaliser",
        missing_normaliser,
        "elu",
        causal=False,
        bug="returns sum_j sim_ij v_j without dividing by sum_j sim_ij",
        caught_by=("reference", "convex-hull"),
    ),
    _broken(
        "bf16-kv-state",
        bf16_kv_state,
        "elu",
        causal=True,
        bug="the running state S, z of the chunked form is rounded to bfloat16 after each chunk "
        "of 16 (a precision bug: only less accurate, and only beyond the first chunk)",
        caught_by=("reference",),
    ),
    _broken(
        "elu-without-plus-one",
        elu_without_plus_one,
        "elu",
        causal=False,
        bug="phi(x) = elu(x): the + 1 is forgotten, so similarities can be negative",
        caught_by=("reference",),
    ),
    _broken(
        "oversized-eps",
        oversized_eps,
        "elu",
        causal=False,
        bug="adds 1e-3 to the denominator while claiming eps = 0",
        caught_by=("reference",),
    ),
    _broken(
        "ragged-tail-chunk",
        ragged_tail_chunk,
        "elu",
        causal=True,
        bug="chunked (16) form whose within-chunk block is skipped for a partial last chunk: "
        "right when N % 16 == 0",
        caught_by=("reference",),
    ),
    _broken(
        "batch-mixing",
        batch_mixing,
        "elu",
        causal=False,
        bug="the KV state and normaliser are summed over the batch: right only when B == 1",
        caught_by=("batch-head",),
    ),
    _broken(
        "head-mixing-reshape",
        head_mixing_reshape,
        "elu",
        causal=False,
        bug="an adapter to a (B, N, H, d) kernel reshapes instead of transposing: heads and "
        "tokens are interleaved (right only when H == 1 or N == 1)",
        caught_by=("batch-head",),
    ),
    _broken(
        "causal-numerator-full-denominator",
        causal_numerator_full_denominator,
        "elu",
        causal=True,
        bug="the numerator is masked, the denominator sums over all keys",
        caught_by=("causality",),
    ),
    _broken(
        "contiguous-stride-assumption",
        contiguous_stride_assumption,
        "elu",
        causal=False,
        bug="reads the inputs' storage with row-major strides: right on contiguous inputs only",
        caught_by=("layout",),
    ),
    _broken(
        "float32-output-dtype",
        float32_output,
        "elu",
        causal=False,
        bug="returns its float32 compute dtype for float16 and bfloat16 inputs",
        caught_by=("contract",),
    ),
    _broken(
        "fp16-normaliser",
        fp16_normaliser,
        "elu",
        causal=False,
        bug="the normaliser sum_j phi(k_j) is accumulated in the input dtype: overflows float16 "
        "for large sums (at the dtype's limits here; in typical inputs from N ~ 56k)",
        caught_by=("reference",),
        regime="extreme",
    ),
    _broken(
        "elu-input-dtype-cancellation",
        elu_input_dtype,
        "elu",
        causal=False,
        bug="phi is formed as elu(x) + 1 in the input dtype: cancels to 0 below about -8 in "
        "float16 (-17 in float32), and a row of such values gives 0/0",
        caught_by=("reference",),
        regime="stress",
    ),
    _broken(
        "relu-plus-one-for-elu",
        relu_plus_one,
        "elu",
        causal=False,
        bug="phi(x) = relu(x) + 1 where the spec says elu(x) + 1: wrong for negative inputs",
        caught_by=("reference",),
    ),
    _broken(
        "leftover-position-decay",
        leftover_position_decay,
        "elu",
        causal=False,
        bug="similarities are multiplied by a leftover decay 0.99^|i - j|: not permutation "
        "equivariant",
        caught_by=("permutation",),
    ),
    _broken(
        "stream-forgets-normaliser",
        stream_forgets_normaliser,
        "elu",
        causal=True,
        bug="its stream carries S between pieces but restarts z at zero: one piece is right, "
        "split pieces are not",
        stream=_ForgetfulStream,
        caught_by=("split-resume",),
    ),
    _broken(
        "softmax-no-max-subtraction",
        softmax_no_max_subtraction,
        "softmax",
        causal=False,
        bug="exp(s) without subtracting the row maximum: overflows (inf/inf) for logits above "
        "88 in float32",
        caught_by=("positivity",),
    ),
    _broken(
        "softmax-missing-scale",
        softmax_missing_scale,
        "softmax",
        causal=True,
        bug="softmax of q.k without the 1/sqrt(d): right only when d == 1",
        caught_by=("reference",),
    ),
    _broken(
        "performer-no-norm-factor",
        performer_no_norm_factor,
        "performer-positive",
        causal=False,
        bug="phi lacks the factor exp(-|x'|^2/2): cancels for queries, reweights the keys",
        caught_by=("reference",),
    ),
    _broken(
        "performer-no-input-scaling",
        performer_no_input_scaling,
        "performer-positive",
        causal=False,
        bug="x' = x instead of x d^(-1/4): right only when d == 1",
        caught_by=("reference",),
    ),
    _broken(
        "performer-unstabilised",
        performer_unstabilised,
        "performer-positive",
        causal=False,
        bug="exp(W x' - |x'|^2/2) unshifted and in the input dtype: underflows to 0/0 or "
        "overflows for large norms",
        caught_by=("positivity",),
    ),
    _broken(
        "cosformer-angle-missing-two",
        cosformer_angle_missing_two,
        "cosformer",
        causal=False,
        bug="the angle is pi (i - j) / M instead of pi (i - j) / (2M): distant pairs get "
        "negative weights",
        caught_by=("reference",),
    ),
    _broken(
        "taylor-missing-half",
        taylor_missing_half,
        "taylor",
        causal=False,
        bug="1 + s + s^2 instead of 1 + s + s^2/2",
        caught_by=("reference",),
    ),
)
