"""linear-attention-transformer 0.19.1 (linear_attention_transformer/
linear_attention_transformer.py): its global attention functions linear_attn and
causal_linear_attn, called on (B, H, N, d) tensors as SelfAttention calls them.

The claimed spec: the library's README describes its global attention as Q(K^T V) linear
attention and cites Katharopoulos et al. 2020 ("Transformers are RNNs"), whose feature map
is elu(x) + 1: the elu spec, causal for causal_linear_attn. The functions compute other
features; the verdicts say where.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from ..specs import Spec
from .base import Adapter, Fn, import_library, largest_divisor_below

INSTALL = (
    "linear-attention-transformer==0.19.1 einops local-attention axial-positional-embedding "
    "linformer product-key-memory colt5-attention hyper-connections torch-einops-utils "
    "packaging"
)
DEFAULT_BUCKET = 64  # causal_linear_attn's bucket_size when None is given


def _module() -> ModuleType:
    return import_library("linear_attention_transformer.linear_attention_transformer", INSTALL)


def _load_linear_attn() -> Fn:
    """linear_attn(q, k, v): softmax over q's features times d^-1/2, softmax over k's
    positions, q (K^T V)."""
    return _module().linear_attn


def _load_causal_linear_attn(bucket: int | None) -> Fn:
    """causal_linear_attn(q, k, v, bucket_size=...): buckets of bucket_size tokens (it
    asserts N % bucket_size == 0); None: the largest divisor of N below N up to its default
    of 64, so that ragged N run and both of its paths (inside and across buckets) are used."""
    causal_linear_attn = _module().causal_linear_attn

    def bucketed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        size = bucket or largest_divisor_below(q.shape[-2], DEFAULT_BUCKET)
        return causal_linear_attn(q, k, v, bucket_size=size)

    return bucketed


_FEATURES = (
    "q is softmaxed over its features and scaled by d^-1/2; the output is reshaped to q's "
    "shape, so d != dv raises."
)

ADAPTERS = (
    Adapter(
        "linear-attention-transformer.linear-attn",
        "linear-attention-transformer",
        "linear_attention_transformer.linear_attention_transformer.linear_attn",
        Spec("elu"),
        "bhnd",
        "Shen et al.'s efficient attention, not elu + 1 features: " + _FEATURES + " k is "
        "softmaxed over the positions, and q (K^T V) is not divided by a denominator: each "
        "row's weights sum to d^-1/2, not 1.",
        _load_linear_attn,
        INSTALL,
    ),
    Adapter(
        "linear-attention-transformer.causal-linear-attn",
        "linear-attention-transformer",
        "linear_attention_transformer.linear_attention_transformer.causal_linear_attn",
        Spec("elu", causal=True),
        "bhnd",
        "Features softmax(q) d^-1/2 and exp(k), not elu + 1; " + _FEATURES + " The "
        "denominator is clamped at 1e-3. With buckets of more than one token a query sees "
        "the keys of earlier buckets only, not those of its own bucket (itself included): "
        "the rows of the first bucket are 0. bucket_size: the largest divisor of N below N "
        "up to its default 64 (it asserts N % bucket_size == 0).",
        functools.partial(_load_causal_linear_attn, None),
        INSTALL,
    ),
    Adapter(
        "linear-attention-transformer.causal-linear-attn-bucket1",
        "linear-attention-transformer",
        "linear_attention_transformer.linear_attention_transformer.causal_linear_attn",
        Spec("elu", causal=True),
        "bhnd",
        "bucket_size=1, as the library's SelfAttention calls it (blindspot_size=1): every "
        "query sees itself and every earlier key. Features softmax(q) d^-1/2 and exp(k), not "
        "elu + 1; " + _FEATURES + " The denominator is clamped at 1e-3.",
        functools.partial(_load_causal_linear_attn, 1),
        INSTALL,
    ),
)
