"""fla's adapters of the delta rule: delta_rule, gated_delta_rule and kda.

The delta rule (DeltaNet, Gated DeltaNet, KDA: families/delta/fields.py): fla's naive.py
functions and the Triton ones, their q, k of H heads and v of HV = H heads (fla's grouped
value heads, HV a multiple of H, are not exercised: the contract has one head count). Every
function applies the gates before the update (S_(t-1) times exp(g_t) first), as the spec.
The Triton fused-recurrent functions are declared with use_qk_l2norm_in_kernel=False (q, k
as given), and fused_recurrent_delta_rule also with True (L2NORM_SAMPLE; the spec's
qk_l2norm: x / sqrt(|x|^2 + 1e-6), in fla/modules/norm/l2norm.py before its kernel, inside
the kernel in the other fused-recurrent ones), the path fla's DeltaNet, GatedDeltaNet and
KDA layers take. fused_recurrent_kda goes through fla.backends.dispatch, which would hand
the call to flash_kda or tilelang where installed: none is here, so fla's own Triton kernel
runs; so do chunk_kda (the same backends) and chunk_gated_delta_rule (flash_qla). The chunk
kernels are declared as their fused-recurrent twins (use_qk_l2norm_in_kernel=False, their
state, cu_seqlens; chunks of 64, fla's default). chunk_delta_rule asserts q.dtype != float32
(fla/ops/delta_rule/chunk.py:303, "Please use bfloat16"): its adapter claims float16 and
bfloat16 alone (CLAIMED_DTYPES), and vet says in one line what float32 and float64 do
outside that claim (its float64 does not compile: merge_16x16_to_64x64_inverse_kernel,
fla/ops/utils/solve_tril.py:336, casts a float32 block to the float64 output with
fp_downcast_rounding="rtne", which Triton refuses for a widening cast). The other refusals
are findings of their verdicts (as chunk_gla's float64 is), not translated away: float64 in
chunk_gated_delta_rule mixes float64 and float32 blocks in tl.dot
(fla/ops/gated_delta_rule/chunk_fwd.py:142 and 257, "Both operands must be same dtype"; at N
= 64 the interpreter meets the store of line 319 first, which the suite's shim refuses) and
in chunk_kda fails in chunk_gla_fwd_kernel_o (fla/ops/gla/chunk.py:455) as chunk_gla does.
chunk_kda asserts a float32 initial state (fla/ops/kda/chunk.py:466; its docstring's example
passes a bfloat16 one, which the assert refuses): the adapter passes the state as given, and
the suite gives it in the dtype of the kernel's own final state, float32, so no call of the
suite meets the assert. In the interpreter a call at N = 64 (B = 1, H = 2, d = 4) takes 0.5
s (chunk_delta_rule), 0.6 s (chunk_gated_delta_rule) and 6 s (chunk_kda). Left out:
fused_chunk_delta_rule, a stub that raises NotImplementedError ("deprecated. Please use
chunk_delta_rule instead"); naive.py's delta_rule_parallel, which returns (o, A) with the
(B, H, N, N) matrix A and needs N % BM == 0 (BM = 128 by default; N = 64 raises a size
mismatch); fla/ops/delta_rule/parallel.py's parallel_delta_rule, not exported by the package
and without a backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..specs import RSQRT_D, Spec
from .base import Adapter, Fn, largest_divisor_below
from .fla_loading import INSTALL, INSTALL_TRITON, fla_file, triton_ops

# the delta-rule kernel adapted with use_qk_l2norm_in_kernel too: the one whose l2norm is
# a kernel of its own, its output stored in the input dtype (the others normalise inside, in
# float32); every other twin would add minutes of interpreter time to each recording
L2NORM_SAMPLE = "fused_recurrent_delta_rule"


def _naive_delta(
    relative: str, function: str, state: bool, layout: str, chunk: int | None = None
) -> Callable[[], Fn]:
    """A loader for fla/<relative>'s `function`(q, k, v, beta=, [g=]) (a naive.py file,
    without triton) in `layout`; every one returns (o, S), S [B, H, K, V] as ours. With
    `state`: fn(..., initial_state=None) -> (o, S) (output_final_state=True). With `chunk`:
    its chunk_size, the largest divisor of N below N and at most `chunk` (its default), for
    a function that asserts N % chunk_size == 0 (largest_divisor_below)."""

    def load() -> Fn:
        naive = getattr(fla_file(relative), function)

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
        kernel = getattr(triton_ops(module), function)

        def fla_delta(q, k, v, initial_state=None, cu_seqlens=None, **values):
            o, s = kernel(q, k, v, **values, initial_state=initial_state,
                          output_final_state=state, use_qk_l2norm_in_kernel=l2norm,
                          cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_delta

    return load


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
# the input dtypes a function's own assert allows, where it refuses some: chunk_delta_rule
# asserts q.dtype != float32 (fla/ops/delta_rule/chunk.py:303, "Please use bfloat16")
CLAIMED_DTYPES = {"chunk_delta_rule": ("float16", "bfloat16")}
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
            dtypes=CLAIMED_DTYPES.get(function),
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
