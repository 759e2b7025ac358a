"""Third-party linear-attention libraries behind the project's calling contract.

    out = fn(q, k, v)                  # q, k: (B, H, N, d), v: (B, H, N, dv)
    out = fn(q, k, v, projection=W)    # Performer specs: W is (m, d)

or the same in (B, N, H, d) where an adapter declares layout "bnhd" (DESIGN.md, "The
implementation contract"). An adapter translates calling conventions and layouts and
nothing more: the library's eps, scaling, normalisation, feature-map details and dtype
handling are its own. `spec` is what the library claims to compute, in our vocabulary
(specs.py); `note` says where the library departs from it or what it leaves out. The checks
judge the rest.

Libraries are imported by `load()`, never at import time. Install them with
`pip install --no-deps ...` so that pip never replaces the installed torch build.

Left out on purpose:
- fla's naive_chunk_linear_attn (fla/ops/linear_attn/naive.py) hard-codes chunks of 64 and
  raises unless N % 64 == 0; padding the sequence would be more than translating, and
  naive_recurrent_linear_attn in the same file computes the same thing for every N.
- performer_pytorch.causal_linear_attention (the path FastAttention takes when the CUDA
  extension of fast_transformers is built): its numerator is fast_transformers'
  CausalDotProduct, vetted through "fast-transformers.causal-linear".
- Un-normalised variants (fla's normalize=False / use_norm=False): not attention in the
  sense of our specs (no denominator at all).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from .checks.core import Implementation
from .specs import Spec, SpecError

Fn = Callable[..., torch.Tensor]

# pip advice per library; --no-deps keeps pip away from torch
_PERFORMER = "performer-pytorch einops local-attention axial-positional-embedding"
_FAST_TRANSFORMERS = "--no-build-isolation pytorch-fast-transformers==0.4.0"
_FLA_NAIVE = "fla-core einops"
_FLA_TRITON = "fla-core einops triton"


class AdapterUnavailable(SpecError):
    """The adapter's library does not import here, or it needs CUDA and there is none (a
    target that cannot be loaded: a usage error)."""


@dataclass(frozen=True)
class Adapter:
    """One third-party entry point behind the contract.

    name: short and unique; library: the pip distribution; function: the object called;
    spec: what the library claims, in our vocabulary; layout: "bhnd" or "bnhd", the layout
    of the callable that load() returns; note: what the library does, where it departs
    from `spec`; load: imports the library lazily and returns fn (raises
    AdapterUnavailable); device: "any", or "cuda" for GPU-only kernels.
    """

    name: str
    library: str
    function: str
    spec: Spec
    layout: str
    note: str
    load: Callable[[], Fn]
    device: str = "any"
    cost: str = "linear"  # the growth it claims: "quadratic" for a quadratic form


def _import(module: str, install: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as err:  # OSError: a compiled extension that fails to load
        raise AdapterUnavailable(
            f"cannot import {module} ({type(err).__name__}: {err}); install it with "
            f"`pip install --no-deps {install}` (--no-deps: leave the torch build alone)"
        ) from None


def _require_cuda(function: str) -> None:
    if not torch.cuda.is_available():
        raise AdapterUnavailable(
            f"{function} is a Triton kernel and needs a CUDA device; "
            "torch.cuda.is_available() is False here"
        )


# --- performer-pytorch: performer_pytorch/performer_pytorch.py ------------------------


def _performer() -> ModuleType:
    return _import("performer_pytorch.performer_pytorch", _PERFORMER)


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


def relu_features(core: Fn) -> Fn:
    """A core that takes mapped features (phi(q), phi(k), v), called with phi = relu: the
    feature map a caller applies, not a fix of the core."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return core(torch.relu(q), torch.relu(k), v)

    return attention


def _load_performer_linear_attention() -> Fn:
    """performer_pytorch.linear_attention(q, k, v): q (K^T V) / (q . sum_j k_j)."""
    return relu_features(_performer().linear_attention)


def _load_performer_causal_noncuda() -> Fn:
    """performer_pytorch.causal_linear_attention_noncuda(q, k, v, chunk_size=128, eps=1e-6)."""
    return relu_features(_performer().causal_linear_attention_noncuda)


# --- pytorch-fast-transformers: fast_transformers/attention/*.py -----------------------


def _load_fast_transformers(causal: bool) -> Fn:
    """LinearAttention (linear_attention.py) or CausalLinearAttention
    (causal_linear_attention.py), built per call with query_dimensions = d and the
    defaults feature_map=None (elu_feature_map: elu(x) + 1) and eps=1e-6. forward takes
    (N, L, H, E) tensors and three masks from fast_transformers.masking: attn_mask, which
    must be all ones (LinearAttention) or lower triangular (CausalLinearAttention), and the
    query and key lengths (LengthMask), here all full.

    The all-ones attn_mask is an all-full LengthMask (rows of length S): FullMask(L, S)
    would allocate an L x S bool matrix, a quadratic cost of the mask, not of the attention.
    """
    attention = _import("fast_transformers.attention", _FAST_TRANSFORMERS)
    masking = _import("fast_transformers.masking", _FAST_TRANSFORMERS)
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


# --- fla-core: pure-PyTorch naive.py files, loaded on their own -------------------------


@functools.cache
def _fla_file(relative: str) -> ModuleType:
    """One pure-PyTorch file of fla, executed by itself (it imports only torch and einops).

    importlib.util.find_spec("fla") locates the package without running fla/__init__.py
    (which imports fla.layers, fla.models and the Triton kernels): find_spec imports the
    parents of a dotted name only, and "fla" has none. Nothing is stubbed.
    """
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterUnavailable(f"fla is not installed; `pip install --no-deps {_FLA_NAIVE}`")
    path = Path(next(iter(spec.submodule_search_locations)), relative)
    name = "_linattn_verify_fla_" + relative.removesuffix(".py").replace("/", "_")
    file_spec = importlib.util.spec_from_file_location(name, path)
    if file_spec is None or file_spec.loader is None or not path.is_file():
        raise AdapterUnavailable(f"{path} is missing: this fla is not fla-core 0.6.0")
    module = importlib.util.module_from_spec(file_spec)
    try:
        file_spec.loader.exec_module(module)
    except ImportError as err:
        raise AdapterUnavailable(
            f"cannot load {path} ({err}); `pip install --no-deps {_FLA_NAIVE}`"
        ) from None
    return module


def _load_fla_naive_linear_attn() -> Fn:
    """fla/ops/linear_attn/naive.py, naive_recurrent_linear_attn(q, k, v, normalize=True):
    (B, T, H, K) in and out; returns (o, final_state), of which o is kept."""
    naive = _fla_file("ops/linear_attn/naive.py")

    def fla_naive_linear_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out, _ = naive.naive_recurrent_linear_attn(q, k, v, normalize=True)
        return out

    return relu_features(fla_naive_linear_attn)


def _load_fla_naive_based() -> Fn:
    """fla/ops/based/naive.py, naive_parallel_based(q, k, v) (scale=None -> d^-1/2,
    use_norm=True): (B, H, T, K) in and out."""
    return _fla_file("ops/based/naive.py").naive_parallel_based


def chunk_size_for(n: int, largest: int = 256) -> int:
    """The chunk size passed to fla's naive_chunk_based for sequence length n: it needs
    n % chunk_size == 0, so the largest divisor of n below n (both its inter- and
    intra-chunk paths then run) and at most `largest` (its default); 1 for n <= 1."""
    return max((c for c in range(1, min(n - 1, largest) + 1) if n % c == 0), default=1)


def _load_fla_naive_chunk_based() -> Fn:
    """fla/ops/based/naive.py, naive_chunk_based(q, k, v, chunk_size): (B, H, T, K)."""
    naive = _fla_file("ops/based/naive.py")

    def fla_naive_chunk_based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return naive.naive_chunk_based(q, k, v, chunk_size=chunk_size_for(q.shape[-2]))

    return fla_naive_chunk_based


# --- fla-core: Triton kernels (CUDA only) -----------------------------------------------


def _fla_triton(module: str, function: str, returns_state: bool, **kwargs) -> Callable[[], Fn]:
    """A loader for fla.ops.<module>.<function>, called as function(q, k, v, **kwargs) on
    (B, T, H, K) tensors; the linear_attn kernels take mapped features (relu_features) and
    return (o, final_state)."""

    def load() -> Fn:
        _require_cuda(f"fla.ops.{module}.{function}")
        kernel = getattr(_import(f"fla.ops.{module}", _FLA_TRITON), function)

        def fla_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = kernel(q, k, v, **kwargs)
            return out[0] if returns_state else out

        return relu_features(fla_kernel) if module == "linear_attn" else fla_kernel

    return load


# --- the registry ---------------------------------------------------------------------

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
_FLA_LINEAR = (
    "fla's kernels take features already mapped (its layers apply the feature map first); "
    "the adapter maps q and k with relu, so the spec is relu. With normalize=True "
    "they divide by (scale q_i) . cumsum_j k_j + 1e-10, scale = d^-1/2 by default, so in "
    "our normalisation the eps is 1e-10 sqrt(d)."
)
_BASED = (
    "Based: sim = 1 + s + s^2/2 with s = (d^-1/2 q) . k, causal, divided by the row sum "
    "+ 1e-6 (use_norm=True): exactly the taylor spec with eps=1e-6."
)

_ALL = (
    Adapter(
        "performer-pytorch.fast-attention",
        "performer-pytorch",
        "performer_pytorch.FastAttention",
        Spec("performer-positive"),
        "bhnd",
        _FAVOR + " Normalised by linear_attention, no denominator eps.",
        functools.partial(_load_fast_attention, False),
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
    ),
    Adapter(
        "performer-pytorch.linear-attention",
        "performer-pytorch",
        "performer_pytorch.linear_attention",
        Spec("relu"),
        "bhnd",
        "FastAttention's non-causal core; " + _IDENTITY + " No eps.",
        _load_performer_linear_attention,
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
        _load_performer_causal_noncuda,
    ),
    Adapter(
        "fast-transformers.linear",
        "pytorch-fast-transformers",
        "fast_transformers.attention.LinearAttention",
        Spec("elu", eps=1e-6),
        "bnhd",
        "elu(x)+1 features (elu_feature_map, the default, computed as F.elu(x) + 1), "
        "normalised with eps=1e-6 added to the denominator; plain torch einsums. float16 and "
        "bfloat16 raise: K is multiplied by the key LengthMask's float32 matrix.",
        functools.partial(_load_fast_transformers, False),
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
        functools.partial(_load_fast_transformers, True),
    ),
    Adapter(
        "fla.linear-attn-naive",
        "fla-core",
        "fla/ops/linear_attn/naive.py:naive_recurrent_linear_attn",
        Spec("relu", causal=True, eps=1e-10),
        "bnhd",
        _FLA_LINEAR + " A Python loop over T in float32 whatever the input dtype; the "
        "output is cast back.",
        _load_fla_naive_linear_attn,
    ),
    Adapter(
        "fla.based-naive",
        "fla-core",
        "fla/ops/based/naive.py:naive_parallel_based",
        Spec("taylor", causal=True, eps=1e-6),
        "bhnd",
        _BASED + " Quadratic form, in the input dtype.",
        _load_fla_naive_based,
        cost="quadratic",
    ),
    Adapter(
        "fla.based-naive-chunk",
        "fla-core",
        "fla/ops/based/naive.py:naive_chunk_based",
        Spec("taylor", causal=True, eps=1e-6),
        "bhnd",
        _BASED + " Chunked form; it needs N % chunk_size == 0, so chunk_size is "
        "chunk_size_for(N): the largest divisor of N below N, at most 256.",
        _load_fla_naive_chunk_based,
    ),
    *(
        Adapter(
            f"fla.linear-attn-{short}",
            "fla-core",
            f"fla.ops.linear_attn.{function}",
            Spec("relu", causal=True, eps=1e-10),
            "bnhd",
            _FLA_LINEAR + f" Triton {how}, called with normalize=True.",
            _fla_triton("linear_attn", function, True, normalize=True),
            device="cuda",
        )
        for short, function, how in (
            ("chunk", "chunk_linear_attn", "chunk kernel (chunk_simple_gla)"),
            ("fused-chunk", "fused_chunk_linear_attn", "fused chunk kernel"),
            ("fused-recurrent", "fused_recurrent_linear_attn", "recurrent kernel"),
        )
    ),
    Adapter(
        "fla.based-parallel",
        "fla-core",
        "fla.ops.based.parallel_based",
        Spec("taylor", causal=True, eps=1e-6),
        "bnhd",
        _BASED + " Triton kernel, fp32 accumulation; asserts d <= 128.",
        _fla_triton("based", "parallel_based", False),
        device="cuda",
        cost="quadratic",
    ),
    Adapter(
        "fla.based-fused-chunk",
        "fla-core",
        "fla.ops.based.fused_chunk_based",
        Spec("taylor", causal=True, eps=1e-6),
        "bnhd",
        _BASED + " Triton fused chunk kernel; asserts d <= 16.",
        _fla_triton("based", "fused_chunk_based", False),
        device="cuda",
    ),
)
ADAPTERS: dict[str, Adapter] = {adapter.name: adapter for adapter in _ALL}
assert len(ADAPTERS) == len(_ALL), "adapter names must be unique"


def adapter_implementation(adapter: Adapter) -> Implementation:
    """The adapter as an Implementation (loads its library; AdapterUnavailable if it cannot)."""
    return Implementation(
        adapter.load(), adapter.spec, adapter.name, f"--impl {adapter.name}", adapter.layout
    )
