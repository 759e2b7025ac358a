"""performer-pytorch 1.1.4 (performer_pytorch/performer_pytorch.py): FastAttention and its
two cores.

Left out on purpose: performer_pytorch.causal_linear_attention (the path FastAttention
takes when the CUDA extension of fast_transformers is built): its numerator is
fast_transformers' CausalDotProduct, vetted through "fast-transformers.causal-linear".
"""

from __future__ import annotations

import contextlib
import functools
import io
from types import ModuleType

import torch

from ..specs import Spec
from .base import Adapter, Fn, import_library, relu_features

INSTALL = "performer-pytorch==1.1.4 einops local-attention axial-positional-embedding " \
    "hyper-connections torch-einops-utils"  # fmt: skip


def _performer() -> ModuleType:
    return import_library("performer_pytorch.performer_pytorch", INSTALL)


def _load_fast_attention(causal: bool) -> Fn:
    """FastAttention.forward: softmax_kernel features of q (is_query=True) and k from the
    module's `projection_matrix` buffer, then linear_attention (non-causal) or
    self.causal_linear_fn (causal). __init__ picks the latter: causal_linear_attention
    (fast_transformers' CausalDotProduct) if fast_transformers.causal_product.
    causal_product_cuda imports, else causal_linear_attention_noncuda (pure torch).

    The buffer is set to W on every call, so m = W.shape[0].
    """
    performer = _performer()
    # __init__ draws a projection from the global RNG and, causal without the CUDA
    # extension, prints a notice: keep both from leaking out
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(io.StringIO()):
        module = performer.FastAttention(
            dim_heads=1, nb_features=1, causal=causal, generalized_attention=False
        )

    def fast_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor
    ) -> torch.Tensor:
        module.projection_matrix = projection
        return module(q, k, v)

    return fast_attention


def _load_linear_attention() -> Fn:
    """performer_pytorch.linear_attention(q, k, v): q (K^T V) / (q . sum_j k_j)."""
    return relu_features(_performer().linear_attention)


def _load_causal_noncuda() -> Fn:
    """performer_pytorch.causal_linear_attention_noncuda(q, k, v, chunk_size=128, eps=1e-6)."""
    return relu_features(_performer().causal_linear_attention_noncuda)


_FAVOR = (
    "softmax_kernel gives FAVOR+ positive features (x d^-1/4, exp(W x' - |x'|^2/2)/sqrt(m)) "
    "but subtracts a stabilising max inside the exp (per query row; per head over all keys "
    "and features for keys) and then adds kernel eps=1e-4: phi = (exp(... - max) + 1e-4) "
    "/ sqrt(m), so the 1e-4 does not cancel between numerator and denominator."
)
_IDENTITY = (
    "takes features already mapped; the adapter maps q and k with relu first, as a caller "
    "must, so the spec is relu for every input."
)

ADAPTERS = (
    Adapter(
        "performer-pytorch.fast-attention",
        "performer-pytorch",
        "performer_pytorch.FastAttention",
        Spec("performer-positive"),
        "bhnd",
        _FAVOR + " Normalised by linear_attention, no denominator eps.",
        functools.partial(_load_fast_attention, False),
        INSTALL,
    ),
    Adapter(
        "performer-pytorch.fast-attention-causal",
        "performer-pytorch",
        "performer_pytorch.FastAttention",
        Spec("performer-positive", causal=True, eps=1e-6),
        "bhnd",
        _FAVOR + " Causal: causal_linear_attention_noncuda (pure torch) unless "
        "fast_transformers' CUDA extension imports (then causal_linear_attention); both "
        "add eps=1e-6 to every component of the key cumsum: 1e-6 sum(phi(q_i)), not 1e-6.",
        functools.partial(_load_fast_attention, True),
        INSTALL,
    ),
    Adapter(
        "performer-pytorch.linear-attention",
        "performer-pytorch",
        "performer_pytorch.linear_attention",
        Spec("relu"),
        "bhnd",
        "FastAttention's non-causal core; " + _IDENTITY + " No eps.",
        _load_linear_attention,
        INSTALL,
    ),
    Adapter(
        "performer-pytorch.causal-linear-attention-noncuda",
        "performer-pytorch",
        "performer_pytorch.causal_linear_attention_noncuda",
        Spec("relu", causal=True, eps=1e-6),
        "bhnd",
        "FastAttention's causal core on CPU; " + _IDENTITY + " eps=1e-6 is added to every "
        "component of the key cumsum (1e-6 sum(q_i) in the denominator); chunk_size=128 "
        "goes to Tensor.chunk, so it is the number of chunks, not their length.",
        _load_causal_noncuda,
        INSTALL,
    ),
)
