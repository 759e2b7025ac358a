"""Deterministic cost of an implementation: FLOPs and peak bytes of live intermediates.

FLOPs are counted with torch.utils.flop_counter's formulas, those of FlopCounterMode (matrix
products, the work that dominates attention; elementwise ops are not counted), and the
products it misses:
the in-place ones (s.baddbmm_(a, b) and s.addmm_(a, b), a state updated in place, count 0
in torch 2.13), addbmm, and matrix-vector products. The built-in elu forms compute their
denominators (2 N d per head) in native.c where it is built, and as a matmul where not:
their counts differ by that term between the two. Bytes: a dispatch mode adds the
size of every storage an op allocates and subtracts it when the storage is freed; the peak
of that running total is the largest working set of the call, output included, inputs
excluded. Both are exact and repeatable, on any device.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

Implementation = Callable[..., torch.Tensor]


class PeakLiveBytes(TorchDispatchMode):
    """Peak total size of the storages that ops allocate, while they are alive (views and
    in-place results share their input's storage and are not counted again), the number of
    ops dispatched (each costs microseconds of Python and dispatch whatever its size: the
    work of a kernel that loops over tokens), and the FLOPs of the matrix products among
    them (FLOP_FORMULAS: torch's FlopCounterMode formulas and the products it misses; one
    mode, not FlopCounterMode beside it, whose own work per op is ten times this one's)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.ops = self.flops = 0
        self.tracked: set[int] = set()

    def _freed(self, ptr: int, size: int) -> None:
        self.live -= size
        self.tracked.discard(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        formula = FLOP_FORMULAS.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        for t in out if isinstance(out, tuple | list) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in self.tracked or any(
                isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args
            ):
                continue
            self.tracked.add(ptr)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, ptr, storage.nbytes())
        return out


@dataclass(frozen=True)
class Cost:
    n: int
    flops: int
    peak_bytes: int
    ops: int = 0


def _product_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """self + a @ b, a (..., m, k), b (..., k, n): 2 m k n per matrix of a's batch."""
    return 2 * math.prod(a_shape) * b_shape[-1]


def _mv_flops(a_shape, x_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1]


def _addmv_flops(self_shape, a_shape, x_shape, *args, out_shape=None, **kwargs) -> int:
    return _mv_flops(a_shape, x_shape)


_aten = torch.ops.aten
UNCOUNTED_PRODUCTS = {
    _aten.addmm_: _product_flops,
    _aten.baddbmm_: _product_flops,
    _aten.addbmm: _product_flops,
    _aten.addbmm_: _product_flops,
    _aten.mv: _mv_flops,
    _aten.addmv: _addmv_flops,
    _aten.addmv_: _addmv_flops,
}
# per op overload packet: FLOPs of one call from its arguments and output (out_val=)
FLOP_FORMULAS = {
    **flop_registry,
    **{op: shape_wrapper(formula) for op, formula in UNCOUNTED_PRODUCTS.items()},
}


def measure_cost(fn: Callable[[], object], n: int) -> Cost:
    """FLOPs, peak live bytes and ops of one call of fn."""
    return counted(fn, n)[1]


def counted(fn: Callable[[], object], n: int) -> tuple[object, Cost]:
    """fn's result and the cost of the call (the result does not depend on the counting)."""
    with PeakLiveBytes() as counts:
        result = fn()
    return result, Cost(n, int(counts.flops), counts.peak, counts.ops)


def attention_inputs(
    n: int,
    b: int = 1,
    h: int = 1,
    d: int = 64,
    dv: int = 64,
    seed: int = 0,
    device="cpu",
    dtype: str = "float32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard normal q, k (B, H, n, d) and v (B, H, n, dv) from a seeded generator, drawn in
    float32 and given in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, n, d, generator=g) for _ in range(2))
    v = torch.randn(b, h, n, dv, generator=g)
    return tuple(t.to(device=device, dtype=getattr(torch, dtype)) for t in (q, k, v))


def cost_curve(impl: Implementation, ns: Sequence[int], **inputs) -> list[Cost]:
    """measure_cost of impl(q, k, v) for each sequence length in ns."""
    curve = []
    for n in ns:
        q, k, v = attention_inputs(n, **inputs)
        curve.append(measure_cost(lambda q=q, k=k, v=v: impl(q, k, v), n))
    return curve
