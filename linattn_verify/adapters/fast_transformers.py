"""pytorch-fast-transformers 0.4.0 (fast_transformers/attention/*.py): LinearAttention and
CausalLinearAttention. Its C++ extensions build from source in minutes (with nvcc hidden
from PATH on a CPU machine), so it is optional everywhere, CI included."""

from __future__ import annotations

import functools

import torch

from ..specs import Spec
from .base import Adapter, Fn, import_library

INSTALL = "--no-build-isolation pytorch-fast-transformers==0.4.0"


def _load(causal: bool) -> Fn:
    """LinearAttention (linear_attention.py) or CausalLinearAttention
    (causal_linear_attention.py), built per call with query_dimensions = d and the
    defaults feature_map=None (elu_feature_map: elu(x) + 1) and eps=1e-6. forward takes
    (N, L, H, E) tensors and three masks from fast_transformers.masking: attn_mask, which
    must be all ones (LinearAttention) or lower triangular (CausalLinearAttention), and the
    query and key lengths (LengthMask), here all full.

    The all-ones attn_mask is an all-full LengthMask (rows of length S): FullMask(L, S)
    would allocate an L x S bool matrix, a quadratic cost of the mask, not of the attention.
    """
    attention = import_library("fast_transformers.attention", INSTALL)
    masking = import_library("fast_transformers.masking", INSTALL)
    cls = attention.CausalLinearAttention if causal else attention.LinearAttention

    def fast_transformers_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        (b, n_q, _, d), n_k = q.shape, k.shape[1]

        def full(rows: int, n: int):
            lengths = torch.full((rows,), n, dtype=torch.long, device=q.device)
            return masking.LengthMask(lengths, max_len=n)

        mask = masking.TriangularCausalMask(n_q, device=q.device) if causal else full(n_q, n_k)
        return cls(d)(q, k, v, mask, full(b, n_q), full(b, n_k))

    return fast_transformers_attention


ADAPTERS = (
    Adapter(
        "fast-transformers.linear",
        "pytorch-fast-transformers",
        "fast_transformers.attention.LinearAttention",
        Spec("elu", eps=1e-6),
        "bnhd",
        "elu(x)+1 features (elu_feature_map, the default, computed as F.elu(x) + 1), "
        "normalised with eps=1e-6 added to the denominator; plain torch einsums. float16 and "
        "bfloat16 raise: K is multiplied by the key LengthMask's float32 matrix.",
        functools.partial(_load, False),
        INSTALL,
    ),
    Adapter(
        "fast-transformers.causal-linear",
        "pytorch-fast-transformers",
        "fast_transformers.attention.CausalLinearAttention",
        Spec("elu", causal=True, eps=1e-6),
        "bnhd",
        "elu(x)+1 features (F.elu(x) + 1), eps=1e-6 added to the denominator; the numerator "
        "is the causal_product C++ kernel, whose CPU build is float32-only (other dtypes "
        "raise 'expected scalar type ...') and whose CUDA build (causal_product_cuda) is "
        "needed for CUDA tensors.",
        functools.partial(_load, True),
        INSTALL,
    ),
)
