"""Correct kernels written the textbook way, as a careful engineer writes them from the papers:
features F.elu(x) + 1 (Katharopoulos et al. 2020, eq. 7), softmax with its max subtracted,
FAVOR+ with the usual max stabilisers (Choromanski et al. 2021, as performer-pytorch's
softmax_kernel without its kernel_epsilon), torch's SDPA; half-precision inputs computed in
float32, the others in their own dtype. They must pass vet by default: what they get wrong
is at the edges (all-negative rows whose features cancel in expm1(x) + 1, overflow at the
dtype's limits), which is a robustness warning, not a bug.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Entry

CHUNK = 16  # the chunked loop's chunk


def _compute(*ts: Tensor) -> tuple[Tensor, ...]:
    """float32 for half-precision inputs, else their own dtype."""
    dtype = torch.float32 if ts[0].dtype in (torch.float16, torch.bfloat16) else ts[0].dtype
    return tuple(t.to(dtype) for t in ts)


def _elu1(x: Tensor) -> Tensor:
    return F.elu(x) + 1


def elu_einsum(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """phi(Q) (phi(K)^T V) / (phi(Q) . sum_j phi(K_j)), by einsum."""
    qc, kc, vc = _compute(q, k, v)
    fq, fk = _elu1(qc), _elu1(kc)
    kv = torch.einsum("bhnd,bhne->bhde", fk, vc)
    num = torch.einsum("bhnd,bhde->bhne", fq, kv)
    den = torch.einsum("bhnd,bhd->bhn", fq, fk.sum(dim=-2)).unsqueeze(-1)
    return (num / den).to(q.dtype)


def elu_float64(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The linear form in float64 whatever the input dtype."""
    fq, fk = _elu1(q.double()), _elu1(k.double())
    num = fq @ (fk.transpose(-1, -2) @ v.double())
    den = fq @ fk.sum(dim=-2, keepdim=True).transpose(-1, -2)
    return (num / den).to(q.dtype)


def elu_cumsum(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal: prefix sums of phi(k_j) v_j^T and of phi(k_j) by cumsum (eq. 18-20)."""
    qc, kc, vc = _compute(q, k, v)
    fq, fk = _elu1(qc), _elu1(kc)
    s = torch.cumsum(fk.unsqueeze(-1) * vc.unsqueeze(-2), dim=2)
    z = torch.cumsum(fk, dim=2)
    num = torch.einsum("bhnd,bhnde->bhne", fq, s)
    den = (fq * z).sum(dim=-1, keepdim=True)
    return (num / den).to(q.dtype)


def elu_chunked(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal, chunk by chunk: the state from earlier chunks, the masked block inside."""
    qc, kc, vc = _compute(q, k, v)
    fq, fk = _elu1(qc), _elu1(kc)
    b, h, n, d = fq.shape
    s = fq.new_zeros(b, h, d, vc.shape[-1])
    z = fq.new_zeros(b, h, d)
    out = []
    for start in range(0, n, CHUNK):
        cq, ck, cv = (t[:, :, start : start + CHUNK] for t in (fq, fk, vc))
        inner = (cq @ ck.transpose(-1, -2)).tril()
        num = cq @ s + inner @ cv
        den = (cq * z.unsqueeze(-2)).sum(-1, keepdim=True) + inner.sum(-1, keepdim=True)
        out.append(num / den)
        s = s + ck.transpose(-1, -2) @ cv
        z = z + ck.sum(dim=-2)
    return torch.cat(out, dim=2).to(q.dtype)


def softmax_sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def softmax_max_stabilised(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax(Q K^T / sqrt(d)) V with each row's largest logit subtracted."""
    qc, kc, vc = _compute(q, k, v)
    logits = qc @ kc.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        mask = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~mask, -math.inf)
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    return ((weights @ vc) / weights.sum(dim=-1, keepdim=True)).to(q.dtype)


def _favor(x: Tensor, w: Tensor, stabiliser: Tensor) -> Tensor:
    """exp(W x' - |x'|^2 / 2 - stabiliser) / sqrt(m), x' = x d^(-1/4) (FAVOR+)."""
    xs = x * x.shape[-1] ** -0.25
    logits = xs @ w.transpose(0, 1) - (xs * xs).sum(dim=-1, keepdim=True) / 2
    return torch.exp(logits - stabiliser(logits)) / math.sqrt(w.shape[0])


def _favor_attention(q, k, v, projection, key_max) -> Tensor:
    qc, kc, vc, w = _compute(q, k, v, projection)
    fq = _favor(qc, w, lambda a: a.amax(dim=-1, keepdim=True))  # each query's own max
    fk = _favor(kc, w, key_max)
    num = fq @ (fk.transpose(-1, -2) @ vc)
    den = fq @ fk.sum(dim=-2, keepdim=True).transpose(-1, -2)
    return (num / den).to(q.dtype)


def favor_global_max(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """FAVOR+ non-causal; keys stabilised by the largest exponent of the head."""
    return _favor_attention(q, k, v, projection, lambda a: a.amax(dim=(-2, -1), keepdim=True))


class _EluEinsumWithBackward(torch.autograd.Function):
    """elu_einsum's forward (non-causal) with its backward written by hand."""

    @staticmethod
    def forward(ctx, q, k, v):
        qc, kc, vc = _compute(q, k, v)
        fq, fk = _elu1(qc), _elu1(kc)
        kv, z = fk.transpose(-1, -2) @ vc, fk.sum(dim=-2, keepdim=True)
        den = fq @ z.transpose(-1, -2)
        out = (fq @ kv) / den
        ctx.save_for_backward(qc, kc, vc, out, den)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        qc, kc, vc, out, den = ctx.saved_tensors
        fq, fk = _elu1(qc), _elu1(kc)
        g = grad.to(qc.dtype) / den  # dL/dnum; dL/dden = -(g . out)
        kv = fk.transpose(-1, -2) @ vc
        gq = g @ kv.transpose(-1, -2) - (g * out).sum(-1, keepdim=True) * fk.sum(-2, keepdim=True)
        a_grad = fq.transpose(-1, -2) @ g  # d x dv: what each key feature multiplies
        gk = vc @ a_grad.transpose(-1, -2) - (
            (g * out).sum(-1, keepdim=True).transpose(-1, -2) @ fq
        )
        gv = fk @ (fq.transpose(-1, -2) @ g)
        dphi = lambda x: torch.where(x > 0, 1.0, torch.exp(x))  # noqa: E731
        return ((gq * dphi(qc)).to(grad.dtype), (gk * dphi(kc)).to(grad.dtype), gv.to(grad.dtype))


def elu_einsum_backward(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return _EluEinsumWithBackward.apply(q, k, v)


def _textbook(name: str, fn, feature_map: str, causal: bool, how: str, **extra) -> Entry:
    return Entry(name, fn, feature_map, causal, broken=False, bug=how, **extra)


def softmax_sdpa_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return softmax_sdpa(q, k, v, causal=True)


def softmax_max_stabilised_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return softmax_max_stabilised(q, k, v, causal=True)


ENTRIES: tuple[Entry, ...] = (
    _textbook("textbook-elu-einsum", elu_einsum, "elu", False, "F.elu(x) + 1, einsum"),
    _textbook("textbook-elu-float64", elu_float64, "elu", False, "F.elu(x) + 1 in float64"),
    _textbook("textbook-elu-cumsum", elu_cumsum, "elu", True, "causal prefix sums by cumsum"),
    _textbook("textbook-elu-chunked", elu_chunked, "elu", True, "causal chunks of 16"),
    _textbook("textbook-softmax-sdpa", softmax_sdpa, "softmax", False, "torch's SDPA",
              cost="quadratic"),
    _textbook("textbook-softmax-sdpa-causal", softmax_sdpa_causal, "softmax", True,
              "torch's SDPA, is_causal", cost="quadratic"),
    _textbook("textbook-softmax-max", softmax_max_stabilised, "softmax", False,
              "row max subtracted", cost="quadratic"),
    _textbook("textbook-softmax-max-causal", softmax_max_stabilised_causal, "softmax", True,
              "row max subtracted, masked", cost="quadratic"),
    _textbook("textbook-favor-global-max", favor_global_max, "performer-positive", False,
              "FAVOR+, queries by their row max, keys by the head's max"),
    _textbook("textbook-elu-backward", elu_einsum_backward, "elu", False,
              "F.elu(x) + 1 einsum with a hand-written backward", grad=True),
)  # fmt: skip
