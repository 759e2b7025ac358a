"""fla-core 0.6.0 (flash-linear-attention): the pure-PyTorch naive.py files, loaded on their
own without triton, and the Triton kernels (natively on CUDA, else in Triton's interpreter).

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

The delta rule (DeltaNet, Gated DeltaNet, KDA: specs.DELTA_SOURCE): fla's naive.py functions
and the Triton ones, their q, k of H heads and v of HV = H heads (fla's grouped value heads,
HV a multiple of H, are not exercised: the contract has one head count). Every function
applies the gates before the update (S_(t-1) times exp(g_t) first), as the spec. The Triton
fused-recurrent functions are declared with use_qk_l2norm_in_kernel=False (q, k as given),
and fused_recurrent_delta_rule also with True (L2NORM_SAMPLE; the spec's qk_l2norm: x /
sqrt(|x|^2 + 1e-6), in fla/modules/norm/l2norm.py before its kernel, inside the kernel in
the other fused-recurrent ones), the path fla's DeltaNet, GatedDeltaNet and KDA layers
take. fused_recurrent_kda goes through fla.backends.dispatch, which would hand the call to
flash_kda or tilelang where installed: none is here, so fla's own Triton kernel runs; so do
chunk_kda (the same backends) and chunk_gated_delta_rule (flash_qla). The chunk kernels are
declared as their fused-recurrent twins (use_qk_l2norm_in_kernel=False, their state,
cu_seqlens; chunks of 64, fla's default), and their refusals are findings of their verdicts
(as chunk_gla's float64 is), not translated away: chunk_delta_rule asserts q.dtype !=
float32 (fla/ops/delta_rule/chunk.py:303, "Please use bfloat16"), so float32 inputs raise,
and its float64 does not compile (merge_16x16_to_64x64_inverse_kernel, fla/ops/utils/
solve_tril.py:336, casts a float32 block to the float64 output with
fp_downcast_rounding="rtne", which Triton refuses for a widening cast); float64 in
chunk_gated_delta_rule mixes float64 and float32 blocks in tl.dot (fla/ops/gated_delta_rule/
chunk_fwd.py:142 and 257, "Both operands must be same dtype"; at N = 64 the interpreter
meets the store of line 319 first, which the suite's shim refuses) and in chunk_kda fails in
chunk_gla_fwd_kernel_o (fla/ops/gla/chunk.py:455) as chunk_gla does. chunk_kda asserts a
float32 initial state (fla/ops/kda/chunk.py:466; its docstring's example passes a bfloat16
one, which the assert refuses): the adapter passes the state as given, and the suite gives
it in the dtype of the kernel's own final state, float32, so no call of the suite meets the
assert. In the interpreter a call at N = 64 (B = 1, H = 2, d = 4) takes 0.5 s
(chunk_delta_rule), 0.6 s (chunk_gated_delta_rule) and 6 s (chunk_kda). Left out:
fused_chunk_delta_rule, a stub that raises NotImplementedError ("deprecated. Please use
chunk_delta_rule instead"); naive.py's delta_rule_parallel, which returns (o, A) with the
(B, H, N, N) matrix A and needs N % BM == 0 (BM = 128 by default; N = 64 raises a size
mismatch); fla/ops/delta_rule/parallel.py's parallel_delta_rule, not exported by the package
and without a backward.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import torch

from ..specs import RSQRT_D, Spec
from .base import (
    Adapter,
    AdapterUnavailable,
    Fn,
    import_library,
    largest_divisor_below,
    relu_features,
)

INSTALL = "fla-core==0.6.0 einops"
# the delta-rule kernel adapted with use_qk_l2norm_in_kernel too: the one whose l2norm is
# a kernel of its own, its output stored in the input dtype (the others normalise inside, in
# float32); every other twin would add minutes of interpreter time to each recording
L2NORM_SAMPLE = "fused_recurrent_delta_rule"
INSTALL_TRITON = "fla-core==0.6.0 einops triton==3.9.0 numpy packaging"


@functools.cache
def _fla_file(relative: str) -> ModuleType:
    """One pure-PyTorch file of fla, executed by itself (it imports only torch and einops).

    importlib.util.find_spec("fla") locates the package without running fla/__init__.py
    (which imports fla.layers, fla.models and the Triton kernels): find_spec imports the
    parents of a dotted name only, and "fla" has none. Nothing is stubbed.
    """
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterUnavailable(f"fla is not installed; `pip install --no-deps {INSTALL}`")
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
            f"cannot load {path} ({err}); `pip install --no-deps {INSTALL}`"
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


def _load_fla_naive_linear_attn_state() -> Fn:
    """naive_recurrent_linear_attn with initial_state and output_final_state=True, with relu
    features: its state is the pair (S [B, H, K, V], z), z in fla's [B, 1, H, K] (the key
    prefix sum its normaliser adds), translated to and from our (B, H, F)."""
    naive = _fla_file("ops/linear_attn/naive.py")

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
        naive = getattr(_fla_file("ops/simple_gla/naive.py"), function)
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
        naive = _fla_file("ops/gla/naive.py").naive_recurrent_gla
        if not state:
            return lambda q, k, v, g: naive(q, k, v, gk=g)[0]

        def with_state(q, k, v, g, initial_state=None):
            return naive(q, k, v, gk=g, initial_state=initial_state, output_final_state=True)

        return with_state

    return load


def _load_fla_naive_based() -> Fn:
    """fla/ops/based/naive.py, naive_parallel_based(q, k, v) (scale=None -> d^-1/2,
    use_norm=True): (B, H, T, K) in and out."""
    return _fla_file("ops/based/naive.py").naive_parallel_based


def _load_fla_naive_chunk_based() -> Fn:
    """fla/ops/based/naive.py, naive_chunk_based(q, k, v, chunk_size): (B, H, T, K)."""
    naive = _fla_file("ops/based/naive.py")

    def fla_naive_chunk_based(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return naive.naive_chunk_based(q, k, v, chunk_size=largest_divisor_below(q.shape[-2], 256))

    return fla_naive_chunk_based


def _triton_ops(module: str) -> ModuleType:
    """fla.ops.<module>, without fla's warning that Triton "is not supported on current
    platform" (true of CUDA here: its kernels run in Triton's interpreter)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        return import_library(f"fla.ops.{module}", INSTALL_TRITON)


def _fla_triton(module: str, function: str, returns_state: bool, **kwargs) -> Callable[[], Fn]:
    """A loader for fla.ops.<module>.<function>, called as function(q, k, v, **kwargs) on
    (B, T, H, K) tensors; the linear_attn kernels take mapped features (relu_features) and
    return (o, final_state)."""

    def load() -> Fn:
        kernel = getattr(_triton_ops(module), function)

        def fla_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = kernel(q, k, v, **kwargs)
            return out[0] if returns_state else out

        return relu_features(fla_kernel) if module == "linear_attn" else fla_kernel

    return load


def _simple_gla_triton(function: str, decay: str, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.simple_gla.<function> (Triton) on (B, T, H, K) tensors: gates as
    its g (B, T, H), a constant decay gamma (H,) as its g_gamma = ln gamma; scale None
    (K^-1/2); packed batches by its cu_seqlens; with `state`, fn(..., initial_state=None)
    -> (o, S), S [B, H, K, V] as ours (output_final_state=True)."""

    def load() -> Fn:
        kernel = getattr(_triton_ops("simple_gla"), function)

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
        kernel = getattr(_triton_ops("gla"), function)

        def fla_gla(q, k, v, g, initial_state=None, cu_seqlens=None):
            o, s = kernel(q, k, v, **{gates: g}, initial_state=initial_state,
                          output_final_state=True, cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_gla

    return load


def _naive_delta(
    relative: str, function: str, state: bool, layout: str, chunk: int | None = None
) -> Callable[[], Fn]:
    """A loader for fla/<relative>'s `function`(q, k, v, beta=, [g=]) (a naive.py file,
    without triton) in `layout`; every one returns (o, S), S [B, H, K, V] as ours. With
    `state`: fn(..., initial_state=None) -> (o, S) (output_final_state=True). With `chunk`:
    its chunk_size, the largest divisor of N below N and at most `chunk` (its default), for
    a function that asserts N % chunk_size == 0 (largest_divisor_below)."""

    def load() -> Fn:
        naive = getattr(_fla_file(relative), function)

        def fla_naive_delta(q, k, v, initial_state=None, **values):
            if chunk is not None:
                tokens = q.shape[2 if layout == "bhnd" else 1]
                values["chunk_size"] = largest_divisor_below(tokens, chunk)
            if state:
                values |= {"initial_state": initial_state, "output_final_state": True}
            o, s = naive(q, k, v, **values)
            return (o, s) if state else o

        return fla_naive_delta

    return load


def _delta_triton(module: str, function: str, l2norm: bool, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.<module>.<function> (Triton) on (B, T, H, K) tensors, beta
    (B, T, H) and the gates (g, (B, T, H) or (B, T, H, K)) by keyword, scale None (K^-1/2),
    use_qk_l2norm_in_kernel=`l2norm`; packed batches by its cu_seqlens; with `state`,
    fn(..., initial_state=None) -> (o, S), S [B, H, K, V] as ours (output_final_state=True,
    state_v_first False); without, its output alone (output_final_state=False)."""

    def load() -> Fn:
        kernel = getattr(_triton_ops(module), function)

        def fla_delta(q, k, v, initial_state=None, cu_seqlens=None, **values):
            o, s = kernel(q, k, v, **values, initial_state=initial_state,
                          output_final_state=state, use_qk_l2norm_in_kernel=l2norm,
                          cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_delta

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
        kernel = getattr(_triton_ops("retention"), function)
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
DELTA_SPEC = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, delta_rule=True)
_DELTA_RULES = {
    None: "DeltaNet (Yang et al. 2024): S_t = (I - beta_t k_t k_t^T) S_(t-1) + beta_t k_t "
    "v_t^T, o_t = K^-1/2 S_t^T q_t, beta (B, T, H): the identity spec, unnormalised, scale "
    "d^-0.5, the delta rule.",
    "gates": "Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025): S_(t-1) times exp(g_t) first, "
    "g (B, T, H) log-gates, then DeltaNet's update, o_t = K^-1/2 S_t^T q_t: the identity "
    "spec, unnormalised, scale d^-0.5, the delta rule with gates.",
    "channel-gates": "KDA (Kimi Linear 2025): S_(t-1) times diag(exp(g_t)) first, g (B, T, "
    "H, K) log-gates per key channel, then DeltaNet's update, o_t = K^-1/2 S_t^T q_t: the "
    "identity spec, unnormalised, scale d^-0.5, the delta rule with channel gates.",
}
# what each Triton function does besides the spec, by its name
_DELTA_TRITON = {
    "fused_recurrent_delta_rule": "State and products in float32, the output in the input dtype.",
    "fused_recurrent_gated_delta_rule": "State and products in float32, the output in the "
    "input dtype; its backward raises NotImplementedError (fla/ops/gated_delta_rule/"
    "fused_recurrent.py:302); it takes **kwargs, so a misspelt keyword is dropped unread.",
    "fused_recurrent_kda": "State and products in float32, the output in the input dtype; it "
    "is no autograd Function: its output carries no gradient.",
    "chunk_delta_rule": "Chunks of 64 (the WY representation, a triangular solve per chunk); "
    "w, u, the chunk states and v_new stored in the input dtype, the final state float32. It "
    "asserts q.dtype != float32 (fla/ops/delta_rule/chunk.py:303): float32 inputs raise; "
    "float64 does not compile (merge_16x16_to_64x64_inverse_kernel, fla/ops/utils/"
    "solve_tril.py:336, casts float32 to float64 with fp_downcast_rounding); it takes "
    "**kwargs, so a misspelt keyword is dropped unread.",
    "chunk_gated_delta_rule": "Chunks of 64; the final state float32, the output in the input "
    "dtype. float64 does not compile (float64 and float32 blocks in one tl.dot, fla/ops/"
    "gated_delta_rule/chunk_fwd.py:142 and 257); it takes **kwargs, so a misspelt keyword is "
    "dropped unread.",
    "chunk_kda": "Chunks of 64; the final state float32, the output in the input dtype. It "
    "asserts a float32 initial state (fla/ops/kda/chunk.py:466), which the suite gives (a "
    "state in the dtype of the kernel's own final state); float64 does not compile "
    "(chunk_gla_fwd_kernel_o, as chunk_gla's); it takes **kwargs, so a misspelt keyword is "
    "dropped unread.",
}
# the delta-rule functions that take grouped value heads (q, k [B, T, H, K], v, beta, g
# [B, T, HV, ...], head hv reading hv // (HV // H)), declared so: the value-heads check calls
# them with HV = 2 H. chunk_gated_delta_rule and chunk_kda take them too, not declared: their
# verdicts were recorded without the check. fused_recurrent_delta_rule and chunk_delta_rule
# do not (their strides are H's: given HV > H they return wrong values or NaN)
GROUPED_VALUE_HEADS = (
    "naive_recurrent_kda", "naive_chunk_kda", "fused_recurrent_gated_delta_rule",
    "fused_recurrent_kda",
)  # fmt: skip
UNDECLARED_VALUE_HEADS = ("chunk_gated_delta_rule", "chunk_kda")


def _grouped(function: str) -> str:
    """What a Triton delta-rule adapter's note says of its state's layout and of fla's
    grouped value heads (HV a multiple of H)."""
    state = " Its state [N, HV, K, V] (state_v_first=False) is ours." * (
        function in GROUPED_VALUE_HEADS + UNDECLARED_VALUE_HEADS
    )
    if function in GROUPED_VALUE_HEADS:
        return state + " fla's grouped value heads are declared (--value-heads 2)."
    if function in UNDECLARED_VALUE_HEADS:
        return state + " It takes grouped value heads; not declared (recorded without them)."
    return " It takes no grouped value heads: called with as many value heads as query heads."


def _value_heads(function: str) -> int:
    """The G the delta-rule `function` is declared with (GROUPED_VALUE_HEADS: 2, else 1)."""
    return 2 if function in GROUPED_VALUE_HEADS else 1


def _based(name: str, function: str, layout: str, note: str, load, **options) -> Adapter:
    """An fla adapter of the Based kernels (the taylor spec, eps = 1e-6)."""
    install = INSTALL_TRITON if options.get("triton") else INSTALL
    return Adapter(name, "fla-core", function, BASED_SPEC, layout, _BASED + note, load, install,
                   **options)  # fmt: skip


def _naive_delta_adapter(
    name: str,
    module: str,
    function: str,
    decay: str | None,
    layout: str,
    note: str,
    chunk: int | None = None,
    state: bool = True,
) -> Adapter:
    """An fla adapter of fla/ops/<module>/naive.py's delta-rule `function` (DELTA_SPEC with
    `decay`), with its state S unless `state` is False (_naive_delta)."""
    relative = f"ops/{module}/naive.py"
    spec = replace(DELTA_SPEC, decay=decay, value_heads=_value_heads(function))
    return Adapter(
        name, "fla-core", f"fla/{relative}:{function}", spec, layout,
        _DELTA_RULES[decay] + note, _naive_delta(relative, function, False, layout, chunk),
        INSTALL, state="S" if state else None,
        load_state=_naive_delta(relative, function, True, layout, chunk) if state else None,
    )  # fmt: skip


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
            _fla_triton("linear_attn", function, True, normalize=True),
            INSTALL_TRITON,
            triton=True,
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
        )
        for short, function, how, state, cost in (
            ("chunk", "chunk_retention", "chunk kernel (chunk_simple_gla)", True, "linear"),
            ("fused-recurrent", "fused_recurrent_retention", "recurrent kernel", True, "linear"),
            ("parallel", "parallel_retention", "parallel kernel, quadratic", False, "quadratic"),
        )
    ),
    _based("fla.based-parallel", "fla.ops.based.parallel_based", "bnhd",
           " Triton kernel, fp32 accumulation; asserts d <= 128.",
           _fla_triton("based", "parallel_based", False), triton=True, cost="quadratic"),
    _based("fla.based-fused-chunk", "fla.ops.based.fused_chunk_based", "bnhd",
           " Triton fused chunk kernel; asserts d <= 16.",
           _fla_triton("based", "fused_chunk_based", False), triton=True),
    _naive_delta_adapter("fla.delta-rule-naive", "delta_rule", "delta_rule_recurrence", None,
                         "bhnd", " A Python loop over T in float32 whatever the input dtype; "
                         "the output cast back, its state S float32; its scale is fixed "
                         "(d_k^-0.5)."),
    _naive_delta_adapter("fla.delta-rule-naive-chunk", "delta_rule", "delta_rule_chunkwise",
                         None, "bhnd", " Chunked (UT transform) in the input dtype: it "
                         "asserts N % chunk_size == 0, so chunk_size is the largest divisor of "
                         "N below N, at most its default 32; float16 and bfloat16 raise (attn "
                         "+ torch.eye(dtype=float) is float32, then attn @ v mixes dtypes); it "
                         "takes no initial state, so no --state.", chunk=32, state=False),
    _naive_delta_adapter("fla.gated-delta-rule-naive", "gated_delta_rule",
                         "naive_recurrent_gated_delta_rule", "gates", "bnhd", " A Python loop "
                         "over T in float32; its output stays float32 whatever the input "
                         "dtype, its state S float32."),
    _naive_delta_adapter("fla.gated-delta-rule-naive-chunk", "gated_delta_rule",
                         "naive_chunk_gated_delta_rule", "gates", "bnhd", " Chunks of 64 in "
                         "float32 (T padded by fla with zeros); its output stays float32 "
                         "whatever the input dtype, its state S float32."),
    _naive_delta_adapter("fla.kda-naive", "kda", "naive_recurrent_kda", "channel-gates", "bnhd",
                         " A Python loop over T in float32; the output cast back, its state S "
                         "float32."),
    _naive_delta_adapter("fla.kda-naive-chunk", "kda", "naive_chunk_kda", "channel-gates",
                         "bnhd", " Chunked in float32, the output cast back, its state S "
                         "float32: it asserts N % chunk_size == 0, so chunk_size is the "
                         "largest divisor of N below N, at most its default 64.", chunk=64),
    *(
        Adapter(
            f"fla.{module.replace('_', '-')}-{short}{'-l2norm' * l2norm}",
            "fla-core",
            f"fla.ops.{module}.{function}",
            replace(DELTA_SPEC, decay=decay, qk_l2norm=l2norm, value_heads=_value_heads(function)),
            "bnhd",
            _DELTA_RULES[decay] + f" Triton {how}, use_qk_l2norm_in_kernel={l2norm}"
            + (" (q and k normalised by fla, x / sqrt(|x|^2 + 1e-6): qk-l2norm). " if l2norm
               else ". ")
            + _DELTA_TRITON[function] + _grouped(function),
            _delta_triton(module, function, l2norm, False),
            INSTALL_TRITON,
            triton=True,
            state="S",
            load_state=_delta_triton(module, function, l2norm, True),
            varlen=True,
        )
        for module, decay, short, function, how in (
            ("delta_rule", None, "fused-recurrent", "fused_recurrent_delta_rule",
             "recurrent kernel"),
            ("gated_delta_rule", "gates", "fused-recurrent", "fused_recurrent_gated_delta_rule",
             "recurrent kernel"),
            ("kda", "channel-gates", "fused-recurrent", "fused_recurrent_kda", "recurrent kernel"),
            ("delta_rule", None, "chunk", "chunk_delta_rule", "chunk kernel"),
            ("gated_delta_rule", "gates", "chunk", "chunk_gated_delta_rule", "chunk kernel"),
            ("kda", "channel-gates", "chunk", "chunk_kda", "chunk kernel"),
        )
        for l2norm in (False, True)
        if not l2norm or function == L2NORM_SAMPLE
    ),
)  # fmt: skip
