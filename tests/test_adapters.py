"""The third-party adapters: each loads, takes its declared layout and returns the right
shape and dtype; missing CUDA fails cleanly. Judging their numbers is vet's job
(tests/test_adapter_verdicts.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from linattn_verify.adapters import ADAPTERS, Adapter, AdapterUnavailable
from linattn_verify.cases import Case
from linattn_verify.under_test import ImplementationFailure, resolve

B, H, N, D, DV, M = 2, 2, 5, 4, 3, 8
# (adapter, dtype) pairs the library itself does not support, and adapters that do not
# take d != dv (the inputs here have d = 4, dv = 3)
_RESHAPE = "the output is reshaped to q's shape: d != dv raises"
LIBRARY_LIMITS = {
    **{
        (name, torch.float64): "fla's chunk_fwd_kernel_o takes a float64 tl.dot into a float32 "
        "accumulator and stores the result through a float64 pointer: it does not compile"
        for name in (
            "fla.linear-attn-chunk",
            "fla.simple-gla-chunk",
            "fla.simple-gla-chunk-gamma",
            "fla.retention-chunk",
            "fla.retention-parallel",
        )
    },
    ("fla.gla-chunk", torch.float64): "fla's chunk_gla_fwd_kernel_o does the same (a float64 "
    "tl.dot into a float32 accumulator, stored through a float64 pointer)",
    **{
        (name, torch.float64): "fast_transformers' causal_product CPU kernel is float32-only"
        for name in (
            "fast-transformers.causal-linear",
            "taylor-series-linear-attention.taylor-series-linear-attn-causal",
        )
    },
    **{
        (f"linear-attention-transformer.{name}", dtype): _RESHAPE
        for name in ("linear-attn", "causal-linear-attn", "causal-linear-attn-bucket1")
        for dtype in (torch.float32, torch.float64)
    },
}


def inputs(adapter: Adapter, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k (B, H, N, d), v (B, H, N, dv) and W (m, d), on the adapter's device."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((B, H, N, D), (B, H, N, D), (B, H, N, DV), (M, D))
    device = "cuda" if adapter.triton and torch.cuda.is_available() else "cpu"
    return tuple(torch.randn(s, generator=gen, dtype=dtype).to(device) for s in shapes)


def implementation(adapter: Adapter):
    """The adapter as an Implementation, or a skip naming what is missing."""
    try:
        return resolve(adapter.name)
    except AdapterUnavailable as err:
        pytest.skip(str(err))


# outputs in another dtype than the inputs' (the contract check's finding on them)
DTYPE_LIMITS = {
    (f"fla.simple-gla-naive{name}", torch.float64): "its output stays float32"
    for name in ("", "-chunk")
}


def cases():
    for name in ADAPTERS:
        for dtype in (torch.float32, torch.float64):
            marks = []
            if limit := LIBRARY_LIMITS.get((name, dtype)):
                marks = [pytest.mark.xfail(reason=limit, raises=ImplementationFailure)]
            if limit := DTYPE_LIMITS.get((name, dtype)):
                marks = [pytest.mark.xfail(reason=limit, raises=AssertionError, strict=True)]
            yield pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.parametrize(("name", "dtype"), list(cases()))
def test_adapter_shape_and_dtype(name: str, dtype: torch.dtype) -> None:
    """Through the Implementation wrapper, which puts the inputs in the adapter's layout and
    raises ImplementationFailure on a wrong shape."""
    impl = implementation(ADAPTERS[name])
    q, k, v, w = inputs(ADAPTERS[name], dtype)
    out = impl(q, k, v, w, Case(B, H, N, D, DV, str(dtype)[6:]).decay(impl.spec.decay))
    assert tuple(out.shape) == (B, H, N, DV)
    assert out.dtype == dtype
    assert out.device == q.device


def test_adapter_declarations() -> None:
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter.layout in ("bhnd", "bnhd")
        assert adapter.cost in ("linear", "quadratic")
        assert adapter.note and adapter.function and adapter.library


def test_fla_naive_files_load_without_importing_fla() -> None:
    """The naive.py files run on their own: fla/__init__.py (Triton) is never executed."""
    pytest.importorskip("einops")
    implementation(ADAPTERS["fla.linear-attn-naive"])  # skips when fla is not installed
    code = (
        "import sys; from linattn_verify.under_test import resolve; "
        "resolve('fla.linear-attn-naive'); resolve('fla.based-naive'); resolve('fla.gla-naive'); "
        "assert 'fla' not in sys.modules, sorted(m for m in sys.modules if m.startswith('fla'))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_triton_adapter_runs_in_the_interpreter_without_cuda() -> None:
    """Said in the command that reruns it, so that a GPU machine runs what ran here."""
    for name in (n for n, a in ADAPTERS.items() if a.triton):
        impl = resolve(name, load=False)
        assert impl.triton == "interpret" and "--triton interpret" in impl.command
