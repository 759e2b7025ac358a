"""Broken kernels whose bug is small and shows on typical inputs: each must come out wrong or
inaccurate on typical inputs, ranked above any robustness warning (tests/test_zoo.py).
Careful otherwise (broken.py's helpers: float32 or float64 computation, features without
cancellation)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Entry
from .broken import CHUNK, _elu1, _elu_inputs, _linear, _widen


def output_bias(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """elu attention scaled by 1 + 1e-5: an error proportional to the output, which zero-mean
    values hide and values with a mean show."""
    fq, fk, vc = _elu_inputs(q, k, v)
    return (_linear(fq, fk, vc) * (1 + 1e-5)).to(q.dtype)


def cosformer_query_offset(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """cosFormer with the queries' positions one ahead: cos(pi (i + 1 - j) / 2M)."""
    qc, kc, vc = _widen(q, k, v)
    big_m = max(q.shape[-2], k.shape[-2])
    i = torch.arange(q.shape[-2], device=q.device, dtype=qc.dtype) + 1
    j = torch.arange(k.shape[-2], device=q.device, dtype=qc.dtype)
    weights = (F.relu(qc) @ F.relu(kc).mT) * torch.cos(math.pi * (i[:, None] - j) / (2 * big_m))
    return ((weights @ vc) / weights.sum(dim=-1, keepdim=True)).to(q.dtype)


def bf16_state_once(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal chunked elu whose state is rounded to bfloat16 once, after the first chunk."""
    qc, kc, vc = _widen(q, k, v)
    fq, fk = _elu1(qc), _elu1(kc)
    b, h, n, d = fq.shape
    s, z = fq.new_zeros(b, h, d, vc.shape[-1]), fq.new_zeros(b, h, d)
    out = []
    for index, start in enumerate(range(0, n, CHUNK)):
        cq, ck, cv = (t[:, :, start : start + CHUNK] for t in (fq, fk, vc))
        inner = (cq @ ck.mT).tril()
        num = cq @ s + inner @ cv
        den = (cq * z.unsqueeze(-2)).sum(-1, keepdim=True) + inner.sum(-1, keepdim=True)
        out.append(num / den)
        s, z = s + ck.mT @ cv, z + ck.sum(dim=-2)
        if index == 0:
            s, z = s.bfloat16().to(s.dtype), z.bfloat16().to(z.dtype)
    return torch.cat(out, dim=2).to(q.dtype)


def elu_alpha(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """elu with alpha = 0.99 (F.elu's alpha left from a config): phi = 0.99 (e^x - 1) + 1."""
    qc, kc, vc = _widen(q, k, v)
    phi = lambda x: torch.where(x > 0, x + 1, 0.99 * torch.expm1(x) + 1)  # noqa: E731
    return _linear(phi(qc), phi(kc), vc).to(q.dtype)


def favor_feature_stabiliser(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """FAVOR+ whose keys are stabilised per random feature (each feature's own max over the
    keys), which changes the kernel: the factor differs from feature to feature."""
    qc, kc, vc, w = _widen(q, k, v, projection)

    def phi(x: Tensor, dims) -> Tensor:
        xs = x * x.shape[-1] ** -0.25
        logits = xs @ w.mT - (xs * xs).sum(dim=-1, keepdim=True) / 2
        return torch.exp(logits - logits.amax(dim=dims, keepdim=True)) / math.sqrt(w.shape[0])

    return _linear(phi(qc, -1), phi(kc, -2), vc).to(q.dtype)


def relu_leak(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """relu attention with F.leaky_relu's default slope 0.01 in place of relu."""
    qc, kc, vc = _widen(q, k, v)
    return _linear(F.leaky_relu(qc), F.leaky_relu(kc), vc).to(q.dtype)


def _subtle(name: str, fn, feature_map: str, causal: bool, bug: str, caught_by, **extra) -> Entry:
    return Entry(name, fn, feature_map, causal, broken=True, bug=bug, caught_by=caught_by, **extra)


ENTRIES: tuple[Entry, ...] = (
    _subtle("output-bias-1e-5", output_bias, "elu", False,
            "every output scaled by 1 + 1e-5", ("reference",)),
    _subtle("cosformer-query-offset", cosformer_query_offset, "cosformer", False,
            "the queries' positions one ahead of the keys'", ("reference",), cost="quadratic"),
    _subtle("bf16-state-once", bf16_state_once, "elu", True,
            "the chunk state rounded to bfloat16 once, after the first chunk", ("reference",)),
    _subtle("elu-alpha-0.99", elu_alpha, "elu", False,
            "elu with alpha = 0.99: phi = 0.99 (e^x - 1) + 1", ("reference",)),
    _subtle("favor-feature-stabiliser", favor_feature_stabiliser, "performer-positive", False,
            "keys stabilised per random feature, which changes the kernel", ("reference",)),
    _subtle("relu-leak", relu_leak, "relu", False,
            "leaky_relu (slope 0.01) in place of relu", ("reference",)),
)  # fmt: skip
