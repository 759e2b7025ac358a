"""fla's adapters of the identity-plus-low-rank (IPLR) rule: fla/ops/generalized_delta_rule/
iplr/ (families/iplr/, docs/iplr.md).

naive.py's iplr_recurrence and iplr_chunkwise take (q, k, v, alpha, beta) in [B, H, T, K]
(alpha is our a, beta our b: S_t = S_(t-1) + beta_t (alpha_t^T S_(t-1)) + k_t v_t^T, checked
against the reference) and return (o, S), S [B, H, K, V] as ours; their scale is fixed
(K^-1/2). iplr_chunkwise asserts T % chunk_size == 0: the adapter passes the largest divisor
of N below N, at most its default 32 (largest_divisor_below). The Triton functions
fused_recurrent_iplr_delta_rule and chunk_iplr_delta_rule take a and b by keyword in [B, T,
H, K], scale None (K^-1/2), cu_seqlens, and return (o, S), S [N, H, K, V].
"""

from __future__ import annotations

from collections.abc import Callable

from ..specs import RSQRT_D, Spec
from .base import Adapter, Fn, largest_divisor_below
from .fla_loading import INSTALL, INSTALL_TRITON, fla_file, triton_ops

NAIVE = "ops/generalized_delta_rule/iplr/naive.py"
MODULE = "generalized_delta_rule.iplr"
IPLR_SPEC = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, family="iplr")
RULE = (
    "IPLR (fla's generalised delta rule): S_t = (I + b_t a_t^T) S_(t-1) + k_t v_t^T, o_t = "
    "K^-1/2 S_t^T q_t, a and b [.., K] per token: the identity spec, unnormalised, scale "
    "d^-0.5, --family iplr."
)


def _naive(function: str, state: bool, chunk: int | None = None) -> Callable[[], Fn]:
    """A loader for naive.py's `function`(q, k, v, alpha, beta) (without triton) in bhnd;
    with `state`, fn(..., initial_state=None) -> (o, S); with `chunk`, its chunk_size, the
    largest divisor of N below N and at most `chunk`."""

    def load() -> Fn:
        naive = getattr(fla_file(NAIVE), function)

        def fla_naive_iplr(q, k, v, a, b, initial_state=None):
            options = {"initial_state": initial_state, "output_final_state": True}
            if chunk is not None:
                options["chunk_size"] = largest_divisor_below(q.shape[2], chunk)
            o, s = naive(q, k, v, a, b, **options)
            return (o, s) if state else o

        return fla_naive_iplr

    return load


def _triton(function: str, state: bool) -> Callable[[], Fn]:
    """A loader for fla.ops.generalized_delta_rule.iplr.<function> (Triton) on [B, T, H, K]
    tensors; with `state`, fn(..., initial_state=None) -> (o, S) (output_final_state=True),
    else its output alone."""

    def load() -> Fn:
        kernel = getattr(triton_ops(MODULE), function)

        def fla_iplr(q, k, v, a, b, initial_state=None, cu_seqlens=None):
            o, s = kernel(q, k, v, a=a, b=b, initial_state=initial_state,
                          output_final_state=state, cu_seqlens=cu_seqlens)  # fmt: skip
            return (o, s) if state else o

        return fla_iplr

    return load


def _naive_adapter(name: str, function: str, note: str, chunk: int | None = None) -> Adapter:
    return Adapter(
        name, "fla-core", f"fla/{NAIVE}:{function}", IPLR_SPEC, "bhnd", RULE + note,
        _naive(function, False, chunk), INSTALL, state="S",
        load_state=_naive(function, True, chunk),
    )  # fmt: skip


def _triton_adapter(name: str, function: str, note: str) -> Adapter:
    return Adapter(
        name, "fla-core", f"fla.ops.{MODULE}.{function}", IPLR_SPEC, "bnhd", RULE + note,
        _triton(function, False), INSTALL_TRITON, triton=True, state="S",
        load_state=_triton(function, True), varlen=True,
    )  # fmt: skip


ADAPTERS = (
    _naive_adapter("fla.iplr-naive", "iplr_recurrence", " A Python loop over T: q, k, v and "
                   "b cast to float32, a left in the input dtype; the output cast back, its "
                   "state S float32."),
    _naive_adapter("fla.iplr-naive-chunk", "iplr_chunkwise", " Chunked (UT transform) in the "
                   "input dtype: it asserts N % chunk_size == 0, so chunk_size is the largest "
                   "divisor of N below N, at most its default 32.", chunk=32),
    _triton_adapter("fla.iplr-fused-recurrent", "fused_recurrent_iplr_delta_rule",
                    " Triton recurrent kernel: state and products in float32, the output in "
                    "the input dtype."),
    _triton_adapter("fla.iplr-chunk", "chunk_iplr_delta_rule", " Triton chunk kernel (chunks "
                    "of 64, the WY representation); it takes **kwargs, so a misspelt keyword "
                    "is dropped unread."),
)  # fmt: skip
