"""The third-party adapters: each loads, takes its declared layout and returns the right
shape and dtype; unknown names and missing CUDA fail cleanly. Agreement with the reference
is recorded (printed with -s), not asserted: judging it is the vet command's job."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from linattn_verify import SpecError, reference
from linattn_verify.adapters import ADAPTERS, Adapter, AdapterUnavailable, get_adapter

B, H, N, D, DV, M = 2, 2, 5, 4, 3, 8
# (adapter, dtype) pairs the library itself does not support
LIBRARY_DTYPE_LIMITS = {
    ("fast-transformers.causal-linear", torch.float64): (
        "fast_transformers' causal_product CPU kernel is float32-only"
    ),
}


def inputs(adapter: Adapter, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k (B, H, N, d), v (B, H, N, dv) and W (m, d), on the adapter's device."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((B, H, N, D), (B, H, N, D), (B, H, N, DV), (M, D))
    device = "cuda" if adapter.device == "cuda" else "cpu"
    return tuple(torch.randn(s, generator=gen, dtype=dtype).to(device) for s in shapes)


def load(adapter: Adapter):
    """adapter.load(), or a skip naming what is missing."""
    if adapter.device == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{adapter.name} needs CUDA")
    try:
        return adapter.load()
    except AdapterUnavailable as err:
        pytest.skip(str(err))


def to_layout(adapter: Adapter, t: torch.Tensor) -> torch.Tensor:
    """A (B, H, N, x) tensor in the adapter's layout, or back (a view)."""
    return t.transpose(1, 2) if adapter.layout == "bnhd" else t


def call(adapter: Adapter, fn, q, k, v, w) -> torch.Tensor:
    """fn on (B, H, N, d) inputs put in the adapter's layout; the output as fn returns it."""
    kwargs = {"projection": w} if adapter.spec.info.needs_projection else {}
    return fn(*(to_layout(adapter, t).contiguous() for t in (q, k, v)), **kwargs)


def cases():
    for name in ADAPTERS:
        for dtype in (torch.float32, torch.float64):
            limit = LIBRARY_DTYPE_LIMITS.get((name, dtype))
            marks = [pytest.mark.xfail(reason=limit, raises=RuntimeError)] if limit else []
            yield pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}")


@pytest.mark.parametrize(("name", "dtype"), list(cases()))
def test_adapter_shape_and_dtype(name: str, dtype: torch.dtype) -> None:
    adapter = ADAPTERS[name]
    fn = load(adapter)
    q, k, v, w = inputs(adapter, dtype)
    out = call(adapter, fn, q, k, v, w)
    want = (B, N, H, DV) if adapter.layout == "bnhd" else (B, H, N, DV)
    assert isinstance(out, torch.Tensor)
    assert tuple(out.shape) == want
    assert out.dtype == dtype
    assert out.device == q.device


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_adapter_against_reference(name: str) -> None:
    """Record max |out - reference| on one float64 input (float32 where the library
    cannot take float64); for relu claims also on |q|, |k|, where identity features
    (what those libraries take) and relu agree."""
    adapter = ADAPTERS[name]
    fn = load(adapter)
    dtype = torch.float32 if (name, torch.float64) in LIBRARY_DTYPE_LIMITS else torch.float64
    q, k, v, w = inputs(adapter, dtype, seed=1)
    variants = {"signed q, k": (q, k)}
    if adapter.spec.feature_map == "relu":
        variants["|q|, |k|"] = (q.abs(), k.abs())
    spec = adapter.spec
    for label, (qq, kk) in variants.items():
        out = to_layout(adapter, call(adapter, fn, qq, kk, v, w))
        out = out.detach().to("cpu", torch.float64).numpy()
        ref = reference(
            qq.cpu(),
            kk.cpu(),
            v.cpu(),
            feature_map=spec.feature_map,
            causal=spec.causal,
            projection=w.cpu() if spec.info.needs_projection else None,
            eps=spec.eps,
        )
        with np.errstate(invalid="ignore"):
            diff = np.abs(out - ref)
        worst = np.nanmax(diff) if not np.isnan(diff).all() else float("nan")
        undefined = int(np.isnan(ref).sum())
        print(
            f"\n[adapter] {name}: claims {spec}; {label}, {str(dtype)[6:]}: "
            f"max |out - reference| = {worst:.3e}"
            + (f" ({undefined} reference elements undefined, 0/0)" if undefined else "")
        )


def test_get_adapter_unknown_name_lists_known() -> None:
    with pytest.raises(SpecError) as err:
        get_adapter("no-such-library.attention")
    assert "no-such-library.attention" in str(err.value)
    assert all(name in str(err.value) for name in ADAPTERS)
    assert get_adapter("fast-transformers.linear") is ADAPTERS["fast-transformers.linear"]


def test_adapter_declarations() -> None:
    for name, adapter in ADAPTERS.items():
        assert adapter.name == name
        assert adapter.layout in ("bhnd", "bnhd")
        assert adapter.device in ("any", "cuda")
        assert adapter.note and adapter.function and adapter.library


def test_fla_naive_files_load_without_importing_fla() -> None:
    """The naive.py files run on their own: fla/__init__.py (Triton) is never executed."""
    pytest.importorskip("einops")
    already = "fla" in sys.modules
    load(ADAPTERS["fla.linear-attn-naive"])
    load(ADAPTERS["fla.based-naive"])
    assert already or "fla" not in sys.modules


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("name", [n for n, a in ADAPTERS.items() if a.device == "cuda"])
def test_cuda_adapter_unavailable_without_cuda(name: str) -> None:
    with pytest.raises(AdapterUnavailable, match="CUDA"):
        ADAPTERS[name].load()
