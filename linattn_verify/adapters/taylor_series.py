"""taylor-series-linear-attention 0.2.x (taylor_series_linear_attention/attention.py):
TaylorSeriesLinearAttn, the module with its attention inline in forward.

The module projects its input x with to_q and to_kv (Linear layers, then heads split as
'b n (h d) -> b h n d'). The adapter builds it with combine_heads=False, no prenorm, no
rotary embedding, dim_head = d, and sets the projections to 0/1 selection matrices over
x = [q, k, v] (each token's heads side by side): each projected entry is one input entry
exactly (the other terms are exact zeros), so the module sees q, k and v as given. Keys
and values share dim_head, so v goes through in pieces of d columns (the last one padded
with zero columns, cut off again): each output column depends on its own value column only.

Its kernel is 1 + s + s^2/2 with s = (d^-1/2 q) . k, from the features [1, x, vec(x x^T) /
sqrt 2] (Based, Arora et al. 2024): the taylor spec. The denominator is clamped at 1e-5
(eps=1e-5 in forward), not added to. Causal needs fast_transformers' CausalDotProduct: the
constructor calls exit() without it, so the causal adapter checks first.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..specs import Spec
from .base import Adapter, AdapterUnavailable, Fn, import_library

INSTALL = (
    "taylor-series-linear-attention==0.2.0 einops jaxtyping wadler-lindig rotary-embedding-torch"
)


def _selection(rows: int, cols: int, offset: int, dtype, device) -> torch.Tensor:
    """(rows, cols) weights of a Linear that picks input entries offset ... offset + rows."""
    weight = torch.zeros(rows, cols, dtype=dtype, device=device)
    weight[:, offset : offset + rows] = torch.eye(rows, dtype=dtype, device=device)
    return weight


@functools.cache
def _module(causal: bool, h: int, d: int, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """TaylorSeriesLinearAttn over x = [q, k, v] with selection projections (see above)."""
    attention = import_library("taylor_series_linear_attention.attention", INSTALL)
    width = h * d
    with torch.random.fork_rng(devices=[]):  # __init__ draws weights from the global RNG
        module = attention.TaylorSeriesLinearAttn(
            3 * width, dim_head=d, heads=h, causal=causal, combine_heads=False
        )
    module = module.to(dtype=dtype, device=device).requires_grad_(False)
    module.to_q[0].weight.copy_(_selection(width, 3 * width, 0, dtype, device))
    kv = torch.cat([_selection(width, 3 * width, o, dtype, device) for o in (width, 2 * width)])
    module.to_kv[0].weight.copy_(kv)
    return module


def _tokens(*heads: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) tensors side by side per token: (B, N, len(heads) H d)."""
    return torch.cat([t.transpose(1, 2).flatten(2) for t in heads], dim=-1)


def _load(causal: bool) -> Fn:
    """The module as fn(q, k, v) on (B, H, N, d); non-causal cross-attention passes the keys
    and values as `context` (q rows zero there, k and v rows zero in x)."""
    if causal and importlib.util.find_spec("fast_transformers") is None:
        raise AdapterUnavailable(
            "the causal TaylorSeriesLinearAttn needs pytorch-fast-transformers (its "
            "constructor exits without it); `pip install --no-deps --no-build-isolation "
            "pytorch-fast-transformers==0.4.0`"
        )
    import_library("taylor_series_linear_attention.attention", INSTALL)

    def taylor_series_linear_attn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        b, h, nq, d = q.shape
        dv = v.shape[-1]
        module = _module(causal, h, d, q.dtype, str(q.device))
        pieces = []
        for start in range(0, dv, d):
            piece = v[..., start : start + d]
            piece = torch.nn.functional.pad(piece, (0, d - piece.shape[-1]))
            if causal:
                out = module(_tokens(q, k, piece))
            else:
                zq, zk = torch.zeros_like(q), torch.zeros_like(k)
                out = module(_tokens(q, zq, zq), context=_tokens(zk, k, piece))
            pieces.append(out.reshape(b, nq, h, d).transpose(1, 2))
        return torch.cat(pieces, dim=-1)[..., :dv]

    return taylor_series_linear_attn


_NOTE = (
    "taylor features [1, x, vec(x x^T) / sqrt 2] of q d^-1/2 and k: 1 + s + s^2/2, the "
    "taylor spec; the denominator is clamped at 1e-5, not added to. The adapter calls the "
    "module with 0/1 selection projections (exact) and v in pieces of d columns"
)

ADAPTERS = (
    Adapter(
        "taylor-series-linear-attention.taylor-series-linear-attn",
        "taylor-series-linear-attention",
        "taylor_series_linear_attention.TaylorSeriesLinearAttn",
        Spec("taylor"),
        "bhnd",
        _NOTE + "; q and k in the input dtype, einsums in the input dtype.",
        functools.partial(_load, False),
        INSTALL,
    ),
    Adapter(
        "taylor-series-linear-attention.taylor-series-linear-attn-causal",
        "taylor-series-linear-attention",
        "taylor_series_linear_attention.TaylorSeriesLinearAttn",
        Spec("taylor", causal=True),
        "bhnd",
        _NOTE + "; the numerator from fast_transformers' CausalDotProduct (float32 only on "
        "the CPU), the denominator from a cumsum of the key features.",
        functools.partial(_load, True),
        INSTALL + " pytorch-fast-transformers",
    ),
)
