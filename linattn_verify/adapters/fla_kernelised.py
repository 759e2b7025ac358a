"""fla's adapters of linear_attn, simple_gla, gla, retention and based (kernelised sums,
scalar and channel gates): their naive.py files and their Triton kernels.

Left out on purpose: fla's naive_chunk_linear_attn (fla/ops/linear_attn/naive.py) hard-codes
chunks of 64 and raises unless N % 64 == 0; padding the sequence would be more than
translating, and naive_recurrent_linear_attn in the same file computes the same thing for
every N. The unnormalised kernels are the simple-GLA and GLA ones (identity features,
scalar or channel gates); linear_attn's normalize=False is simple GLA with gates of 0,
and naive_retention fixes its gammas inside its body (1 - 2^(-5-h)), where no suite's
gamma can reach them: not adapted. The
Triton retention functions build the same gammas from torch.arange in their own module,
where the adapter gives the suite's (_HeadIndices). fla.ops.gla.fused_chunk_gla is still
exported in 0.6.0 but is a stub (fla/ops/gla/fused_chunk.py) that raises NotImplementedError
("deprecated. Please use `chunk_gla` instead"): not adapted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace

import torch

from ..head_dims import UNDECLARED, HeadDims
from ..specs import RSQRT_D, Spec
from .base import Adapter, Fn, calling, largest_divisor_below
from .fla_loading import INSTALL, INSTALL_TRITON, fla_file, triton_ops

# how fla's linear_attn functions are called: features mapped by the caller, o kept
LINEAR_ATTN_CALL = "kernel(torch.relu(q), torch.relu(k), v, normalize=True)[0]"
LINEAR_ATTN_WHY = (
    "fla's linear_attn functions take features already mapped (fla's layers apply the "
    "feature map first): the caller maps q and k, here with relu; they return (o, final_state), "
    "of which o is kept."
)


def _load_fla_naive_linear_attn() -> Fn:
    """fla/ops/linear_attn/naive.py, naive_recurrent_linear_attn(q, k, v, normalize=True):
    (B, T, H, K) in and out; returns (o, final_state), of which o is kept."""
    naive = fla_file("ops/linear_attn/naive.py").naive_recurrent_linear_attn
    return calling(naive, LINEAR_ATTN_CALL, LINEAR_ATTN_WHY)


def _load_fla_naive_linear_attn_state() -> Fn:
    """naive_recurrent_linear_attn with initial_state and output_final_state=True, with relu
    features: its state is the pair (S [B, H, K, V], z), z in fla's [B, 1, H, K] (the key
    prefix sum its normaliser adds), translated to and from our (B, H, F)."""
    naive = fla_file("ops/linear_attn/naive.py")

    def fla_naive_linear_attn_state(q, k, v, initial_state=None):
        init = None
        if initial_state is not None:
            s, z = initial_state
            init = (s, z.unsqueeze(1))
        out, (s, z) = naive.naive_recurrent_linear_attn(
            torch.relu(q), torch.relu(k), v, initial_state=init, output_final_state=True,
            normalize=True,
        )  # fmt: skip
        return out, (s, z[:, 0])

    return fla_naive_linear_attn_state


def _load_simple_gla(function: str, state: bool) -> Callable[[], Fn]:
    """fla/ops/simple_gla/naive.py's `function`(q, k, v, g) on (B, T, H, K) tensors and
    log-gates g (B, T, H), scale None (K^-1/2); with `state`, fn(q, k, v, g,
    initial_state=None) -> (o, S), S [B, H, K, V] as ours."""

    def load() -> Fn:
        naive = getattr(fla_file("ops/simple_gla/naive.py"), function)
        if not state:
            return lambda q, k, v, g: naive(q, k, v, g)[0]

        def with_state(q, k, v, g, initial_state=None):
            return naive(q, k, v, g, initial_state=initial_state, output_final_state=True)

        return with_state

    return load


def _load_gla_naive(state: bool) -> Callable[[], Fn]:
    """fla/ops/gla/naive.py's naive_recurrent_gla(q, k, v, gk) on (B, T, H, K) tensors and
    per-channel log-gates, the suite's g (B, T, H, K) as its gk; it takes no scale (K^-1/2
    inside); with `state`, fn(q, k, v, g, initial_state=None) -> (o, S), S [B, H, K, V] as
    ours (output_final_state=True)."""

    def load() -> Fn:
        naive = fla_file("ops/gla/naive.py").naive_recurrent_gla
        if not state:
            return lambda q, k, v, g: naive(q, k, v, gk=g)[0]

        def with_state(q, k, v, g, initial_state=None):
            return naive(q, k, v, gk=g, initial_state=initial_state, output_final_state=True)

        return with_state

    return load


def _load_fla_naive_based() -> Fn:
    """fla/ops/based/naive.py, naive_parallel_based(q, k, v) (scale=None -> d^-1/2,
    use_norm=True): (B, H, T, K) in and out."""
    return fla_file("ops/based/naive.py").naive_parallel_based


def _load_fla_naive_chunk_based() -> Fn:
    """fla/ops/based/naive.py, naive_chunk_based(q, k, v, chunk_size): (B, H, T, K)."""
    naive = fla_file("ops/based/naive.py")

    def fla_naive_chunk_based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return naive.naive_chunk_based(q, k, v, chunk_size=largest_divisor_below(q.shape[-2], 256))

    return fla_naive_chunk_based


def _fla_triton(module: str, function: str) -> Callable[[], Fn]:
    """A loader for fla.ops.<module>.<function> (Triton) on (B, T, H, K) tensors: the
    linear_attn ones called as LINEAR_ATTN_CALL (relu features, normalize=True, o of (o,
    final_state)), the others as they are, function(q, k, v)."""

    def load() -> Fn:
        kernel = getattr(triton_ops(module), function)
        if module == "linear_attn":
            return calling(kernel, LINEAR_ATTN_CALL, LINEAR_ATTN_WHY)
        return kernel

    return load


def _simple_gla_triton(function: str, decay: str, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.simple_gla.<function> (Triton) on (B, T, H, K) tensors: gates as
    its g (B, T, H), a constant decay gamma (H,) as its g_gamma = ln gamma; scale None
    (K^-1/2); packed batches by its cu_seqlens; with `state`, fn(..., initial_state=None)
    -> (o, S), S [B, H, K, V] as ours (output_final_state=True)."""

    def load() -> Fn:
        kernel = getattr(triton_ops("simple_gla"), function)

        def fla_simple_gla(q, k, v, initial_state=None, cu_seqlens=None, **values):
            if decay == "constant":
                decays = {"g_gamma": torch.log(values["gamma"].double()).float()}
            else:
                decays = {"g": values["g"]}
            o, s = kernel(q, k, v, **decays, initial_state=initial_state,
                          output_final_state=True, cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_simple_gla

    return load


def _gla_triton(function: str, gates: str, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.gla.<function> (Triton) on (B, T, H, K) tensors, the suite's
    per-channel log-gates g (B, T, H, K) as its keyword `gates` (chunk_gla's g,
    fused_recurrent_gla's gk: the latter takes **kwargs, so a g= would be dropped unread and
    the kernel run ungated); scale None (K^-1/2); packed batches by its cu_seqlens; with
    `state`, fn(..., initial_state=None) -> (o, S), S [B, H, K, V] as ours
    (output_final_state=True)."""

    def load() -> Fn:
        kernel = getattr(triton_ops("gla"), function)

        def fla_gla(q, k, v, g, initial_state=None, cu_seqlens=None):
            o, s = kernel(q, k, v, **{gates: g}, initial_state=initial_state,
                          output_final_state=True, cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_gla

    return load


class _HeadIndices:
    """`torch` inside one of fla's retention functions for a call: arange(H), from which fla
    builds its gammas as 1 - 2^(-5 - h), gives h = -log2(1 - gamma) - 5 for the suite's
    gamma (in float32, as fla's arange); every other name is torch's."""

    def __init__(self, gamma: torch.Tensor) -> None:
        self.gamma = gamma

    def arange(self, n: int, dtype=None, device=None) -> torch.Tensor:
        if n != self.gamma.numel():
            raise ValueError(f"arange({n}) for {self.gamma.numel()} heads' gammas")
        return (-torch.log2(1 - self.gamma.double()) - 5).to(dtype=dtype, device=device)

    def __getattr__(self, name: str):
        return getattr(torch, name)


def _retention(function: str, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.retention.<function> (Triton) on (B, T, H, K) tensors, its
    fixed gammas 1 - 2^(-5 - h) replaced by the suite's gamma (H,) for the call (_HeadIndices:
    every line of the function is fla's); packed batches by cu_seqlens; with `state`,
    fn(..., initial_state=None) -> (o, S) (output_final_state=True)."""

    def load() -> Fn:
        kernel = getattr(triton_ops("retention"), function)
        module = sys.modules[kernel.__module__]

        def fla_retention(q, k, v, gamma, initial_state=None, cu_seqlens=None):
            carried = {"initial_state": initial_state, "output_final_state": True} if state else {}
            module.torch = _HeadIndices(gamma)
            try:
                o, s = kernel(q, k, v, cu_seqlens=cu_seqlens, **carried)
            finally:
                module.torch = torch
            return (o, s) if state else o

        return fla_retention

    return load


_FLA_LINEAR = (
    "fla's kernels take features already mapped (its layers apply the feature map first); "
    "the adapter maps q and k with relu, so the spec is relu. With normalize=True "
    "they divide by (scale q_i) . cumsum_j k_j + 1e-10, scale = d^-1/2 by default: the "
    "spec relu, eps = 1e-10, scale = d^-1/2 (eps is not scaled)."
)
_BASED = (
    "Based: sim = 1 + s + s^2/2 with s = (d^-1/2 q) . k, causal, divided by the row sum "
    "+ 1e-6 (use_norm=True): exactly the taylor spec with eps=1e-6."
)

LINEAR_SPEC = Spec("relu", causal=True, eps=1e-10, scale=RSQRT_D)
SIMPLE_GLA_SPEC = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, decay="gates")
_SIMPLE_GLA = (
    "Simple GLA: o_i = K^-1/2 sum_{j<=i} exp(G_i - G_j) (q_i . k_j) v_j, G the prefix sums "
    "of the log-gates g (B, T, H): the identity spec, unnormalised, scale d^-0.5, gates; "
    "computed in float32 whatever the input dtype."
)
GLA_SPEC = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, decay="channel-gates")
_GLA = (
    "GLA (Yang et al. 2024, sec. 4.1): o_i = K^-1/2 sum_{j<=i} sum_m q_im k_jm exp(G_im - "
    "G_jm) v_j, G the prefix sums of the per-channel log-gates g (B, T, H, K): the identity "
    "spec, unnormalised, scale d^-0.5, channel gates; computed in float32 whatever the input "
    "dtype."
)
BASED_SPEC = Spec("taylor", causal=True, eps=1e-6)
# chunk_simple_gla's backward (chunk_bwd_dv, fla/ops/common/chunk_o.py:606) asserts `K % 2
# == 0 and V % 2 == 0` in float16 and bfloat16 (Triton miscompiles their masked odd tails)
EVEN_BACKWARD = HeadDims(even_backward=True)


def _based(name: str, function: str, layout: str, note: str, load, **options) -> Adapter:
    """An fla adapter of the Based kernels (the taylor spec, eps = 1e-6)."""
    install = INSTALL_TRITON if options.get("triton") else INSTALL
    return Adapter(name, "fla-core", function, BASED_SPEC, layout, _BASED + note, load, install,
                   **options)  # fmt: skip


ADAPTERS = (
    Adapter(
        "fla.linear-attn-naive",
        "fla-core",
        "fla/ops/linear_attn/naive.py:naive_recurrent_linear_attn",
        LINEAR_SPEC,
        "bnhd",
        _FLA_LINEAR + " A Python loop over T in float32 whatever the input dtype; the "
        "output is cast back.",
        _load_fla_naive_linear_attn,
        INSTALL,
        state="Sz",
        load_state=_load_fla_naive_linear_attn_state,
    ),
    Adapter("fla.simple-gla-naive", "fla-core", "fla/ops/simple_gla/naive.py:"
            "naive_parallel_simple_gla", SIMPLE_GLA_SPEC, "bnhd", _SIMPLE_GLA + " Quadratic "
            "form; its output stays float32.", _load_simple_gla("naive_parallel_simple_gla",
            False), INSTALL, cost="quadratic"),
    Adapter("fla.simple-gla-naive-recurrent", "fla-core", "fla/ops/simple_gla/naive.py:"
            "naive_recurrent_simple_gla", SIMPLE_GLA_SPEC, "bnhd", _SIMPLE_GLA + " A Python "
            "loop over T; the output cast back, its state S float32.",
            _load_simple_gla("naive_recurrent_simple_gla", False), INSTALL, state="S",
            load_state=_load_simple_gla("naive_recurrent_simple_gla", True)),
    Adapter("fla.simple-gla-naive-chunk", "fla-core", "fla/ops/simple_gla/naive.py:"
            "naive_chunk_simple_gla", SIMPLE_GLA_SPEC, "bnhd", _SIMPLE_GLA + " Chunks of 64 "
            "(T padded); its output stays float32.", _load_simple_gla("naive_chunk_simple_gla",
            False), INSTALL, state="S", load_state=_load_simple_gla("naive_chunk_simple_gla",
            True)),
    Adapter("fla.gla-naive", "fla-core", "fla/ops/gla/naive.py:naive_recurrent_gla", GLA_SPEC,
            "bnhd", _GLA + " A Python loop over T; the output cast back, its state S float32; "
            "its gates keyword is gk.", _load_gla_naive(False), INSTALL, state="S",
            load_state=_load_gla_naive(True)),
    _based("fla.based-naive", "fla/ops/based/naive.py:naive_parallel_based", "bhnd",
           " Quadratic form, in the input dtype.", _load_fla_naive_based, cost="quadratic"),
    _based("fla.based-naive-chunk", "fla/ops/based/naive.py:naive_chunk_based", "bhnd",
           " Chunked form; it needs N % chunk_size == 0, so chunk_size is the largest divisor "
           "of N below N, at most its default 256.", _load_fla_naive_chunk_based),
    *(
        Adapter(
            f"fla.linear-attn-{short}",
            "fla-core",
            f"fla.ops.linear_attn.{function}",
            LINEAR_SPEC,
            "bnhd",
            _FLA_LINEAR + f" Triton {how}, called with normalize=True.",
            _fla_triton("linear_attn", function),
            INSTALL_TRITON,
            triton=True,
            head_dims=EVEN_BACKWARD if short == "chunk" else UNDECLARED,
        )
        for short, function, how in (
            ("chunk", "chunk_linear_attn", "chunk kernel (chunk_simple_gla)"),
            ("fused-chunk", "fused_chunk_linear_attn", "fused chunk kernel"),
            ("fused-recurrent", "fused_recurrent_linear_attn", "recurrent kernel"),
        )
    ),
    *(
        Adapter(
            f"fla.simple-gla-{short}{'-gamma' * (decay == 'constant')}",
            "fla-core",
            f"fla.ops.simple_gla.{function}",
            replace(SIMPLE_GLA_SPEC, decay=decay),
            "bnhd",
            _SIMPLE_GLA.replace("computed in float32 whatever the input dtype", f"Triton {how}")
            + (" The constant decay as its g_gamma = ln gamma." if decay == "constant" else ""),
            _simple_gla_triton(function, decay, False),
            INSTALL_TRITON,
            triton=True,
            state="S",
            load_state=_simple_gla_triton(function, decay, True),
            varlen=True,
            head_dims=EVEN_BACKWARD if short == "chunk" else UNDECLARED,
        )
        for short, function, how in (
            ("chunk", "chunk_simple_gla", "chunk kernel"),
            ("fused-recurrent", "fused_recurrent_simple_gla", "recurrent kernel"),
        )
        for decay in ("gates", "constant")
    ),
    *(
        Adapter(
            f"fla.gla-{short}",
            "fla-core",
            f"fla.ops.gla.{function}",
            GLA_SPEC,
            "bnhd",
            _GLA.replace("computed in float32 whatever the input dtype", f"Triton {how}")
            + f" The gates as its {gates}=.",
            _gla_triton(function, gates, False),
            INSTALL_TRITON,
            triton=True,
            state="S",
            load_state=_gla_triton(function, gates, True),
            varlen=True,
        )
        for short, function, gates, how in (
            ("chunk", "chunk_gla", "g", "chunk kernel"),
            ("fused-recurrent", "fused_recurrent_gla", "gk", "recurrent kernel"),
        )
    ),
    *(
        Adapter(
            f"fla.retention-{short}",
            "fla-core",
            f"fla.ops.retention.{function}",
            replace(SIMPLE_GLA_SPEC, decay="constant"),
            "bnhd",
            "Retention (Sun et al. 2023): o_i = K^-1/2 sum_{j<=i} gamma_h^(i-j) (q_i . k_j) v_j, "
            "the identity spec, unnormalised, scale d^-0.5, constant decay; fla fixes gamma_h "
            "= 1 - 2^(-5-h), the adapter gives its formula h = -log2(1 - gamma) - 5 for the "
            f"suite's gamma. Triton {how}.",
            _retention(function, False),
            INSTALL_TRITON,
            triton=True,
            cost=cost,
            state="S" if state else None,
            load_state=_retention(function, True) if state else None,
            varlen=True,
            head_dims=EVEN_BACKWARD if short == "chunk" else UNDECLARED,
        )
        for short, function, how, state, cost in (
            ("chunk", "chunk_retention", "chunk kernel (chunk_simple_gla)", True, "linear"),
            ("fused-recurrent", "fused_recurrent_retention", "recurrent kernel", True, "linear"),
            ("parallel", "parallel_retention", "parallel kernel, quadratic", False, "quadratic"),
        )
    ),
    _based("fla.based-parallel", "fla.ops.based.parallel_based", "bnhd",
           " Triton kernel, fp32 accumulation; asserts d <= 128.",
           _fla_triton("based", "parallel_based"), triton=True, cost="quadratic"),
    _based("fla.based-fused-chunk", "fla.ops.based.fused_chunk_based", "bnhd",
           " Triton fused chunk kernel; asserts d <= 16 ('only support feature dimension up "
           "to 16', fla/ops/based/fused_chunk.py:384): it claims d <= 16.",
           _fla_triton("based", "fused_chunk_based"), triton=True,
           head_dims=HeadDims(16)),
)  # fmt: skip
