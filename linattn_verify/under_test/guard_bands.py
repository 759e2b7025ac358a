"""Guard bands around the memory a raw-pointer kernel (Triton) touches: each floating input is
a view into a larger buffer filled with NaN, and every floating buffer allocated during the
call (its outputs, its scratch) is one too, poisoned with NaN before the kernel writes it. A
read past a tensor's end then shows as NaN in the output, a write past it as a changed
guard band, and a read of memory never written as NaN: what a GPU would return silently
(whatever memory holds) becomes a finding naming the tensor ("reads past the end of k").

Only the forward call is guarded: a backward run later by autograd reads the guarded
inputs its forward saved, but allocates its own buffers unguarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GUARD_MIN = 4096  # elements of guard band on each side, at least (and at least the tensor's)
NAMES = ("q", "k", "v")  # fn's positional tensors


class OutOfBounds(Exception):
    """The kernel read or wrote past a tensor's end, or read memory it never wrote."""


@dataclass
class _Band:
    """One guarded buffer: what it is called, the buffer, and the view the kernel gets."""

    name: str
    buffer: torch.Tensor
    view: torch.Tensor
    guard: int

    def intact(self, fill: float) -> bool:
        """Whether both guard bands still hold `fill` (NaN compares by its bits)."""
        bands = (self.buffer[: self.guard], self.buffer[self.buffer.numel() - self.guard :])
        if math.isnan(fill):
            return all(bool(torch.isnan(b).all()) for b in bands)
        return all(bool((b == fill).all()) for b in bands)


def _span(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """Elements from a strided tensor's first element to its last, inclusive."""
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))


def _band(name: str, shape, stride, dtype, device, fill: float) -> _Band:
    """A buffer of guard + span + guard elements filled with `fill`, and the strided view at
    its middle."""
    if any(s == 0 and n > 1 for n, s in zip(shape, stride, strict=True)):
        stride = torch.empty(tuple(shape), device="meta").stride()  # an expanded input: dense
    span = _span(tuple(shape), tuple(stride))
    guard = max(GUARD_MIN, span)
    buffer = torch.full((span + 2 * guard,), fill, dtype=dtype, device=device)
    return _Band(name, buffer, buffer.as_strided(tuple(shape), tuple(stride), guard), guard)


class _Into(torch.autograd.Function):
    """x copied into the view of a guarded buffer; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
        view.copy_(x)
        return view

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


_EMPTY = {
    torch.ops.aten.empty.memory_format: lambda a, k: (a[0], None),
    torch.ops.aten.empty_strided.default: lambda a, k: (a[0], a[1]),
    torch.ops.aten.empty_like.default: lambda a, k: (a[0].shape, None),
    torch.ops.aten.new_empty.default: lambda a, k: (a[1], None),
    torch.ops.aten.new_empty_strided.default: lambda a, k: (a[1], a[2]),
}


class _Poisoned(TorchDispatchMode):
    """Every floating tensor allocated uninitialised (empty, empty_like, new_empty, ...) in
    the block is the middle of a guarded buffer filled with `fill`."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill, self.bands = fill, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in _EMPTY or not out.is_floating_point() or out.numel() == 0:
            return out  # the interpreter's own new_empty(0), then set_ to an argument's storage
        shape, stride = _EMPTY[func](args, kwargs)
        stride = tuple(stride) if stride is not None else out.stride()
        what = f"a buffer of shape {tuple(int(n) for n in shape)} it allocated"
        band = _band(what, out.shape, stride, out.dtype, out.device, self.fill)
        self.bands.append(band)
        return band.view


def _tensors(args: tuple, kwargs: dict[str, Any]) -> Iterator[tuple[str, Any, Callable]]:
    """(name, tensor, put) for every floating tensor argument, put(t) replacing it."""
    for i, value in enumerate(args):
        yield NAMES[i] if i < len(NAMES) else f"argument {i}", value, ("arg", i)
    for key, value in kwargs.items():
        if isinstance(value, tuple | list):
            for j, item in enumerate(value):
                yield f"{key}[{j}]", item, ("kw", key, j)
        else:
            yield key, value, ("kw", key, None)


def _call(fn: Callable, args: tuple, kwargs: dict, fills: dict[str, float], poison: float):
    """fn on the arguments copied into guarded buffers (fills: each input's fill, by name),
    with allocations poisoned; (result, input bands, allocation bands)."""
    args, kwargs = (
        list(args),
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()},
    )
    bands = []
    for name, value, where in list(_tensors(tuple(args), kwargs)):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        band = _band(name, value.shape, value.stride(), value.dtype, value.device, fills[name])
        bands.append(band)
        placed = _Into.apply(value, band.view)
        if where[0] == "arg":
            args[where[1]] = placed
        elif where[2] is None:
            kwargs[where[1]] = placed
        else:
            kwargs[where[1]][where[2]] = placed
    kwargs = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()}
    with _Poisoned(poison) as mode:
        result = fn(*args, **kwargs)
    return result, bands, mode.bands


def _nans(result: Any) -> list[torch.Tensor]:
    """Where each floating tensor of fn's result (the output, a final state's parts) is NaN."""
    if isinstance(result, torch.Tensor):
        return [torch.isnan(result.detach())] if result.is_floating_point() else []
    if isinstance(result, tuple | list):
        return [m for item in result for m in _nans(item)]
    return []


def _more(first: list[torch.Tensor], again: list[torch.Tensor]) -> tuple[int, ...] | None:
    """The index (in fn's output's first tensor that has one) of a NaN of `first` that is
    not one of `again`, or None: a NaN the guard bands or poisoned buffers put there."""
    for ours, theirs in zip(first, again, strict=False):
        found = (ours & ~theirs).nonzero()
        if found.numel():
            return tuple(int(i) for i in found[0])
    return None


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn called on guarded inputs with poisoned allocations; OutOfBounds when it writes past
    an input's or a buffer's end, or when a NaN of its result (the output, a final state)
    comes from a guard band or a poisoned buffer: found by calling it again with finite bands
    (0), all of them (the NaN that stay are the kernel's own, for the checks to judge), then
    all but the allocations, then all but one input's."""

    def call(*args, **kwargs):
        names = [
            n for n, v, _ in _tensors(args, kwargs)
            if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]  # fmt: skip
        nan, zero = dict.fromkeys(names, math.nan), dict.fromkeys(names, 0.0)
        result, inputs, allocated = _call(fn, args, kwargs, nan, math.nan)
        for band in inputs + allocated:
            if not band.intact(math.nan):
                raise OutOfBounds(f"writes past the end of {band.name}")
        first = _nans(result)
        if not any(bool(m.any()) for m in first):
            return result

        def again(fills: dict[str, float], poison: float) -> list[torch.Tensor]:
            with torch.no_grad():
                return _nans(_call(fn, args, kwargs, fills, poison)[0])

        own = again(zero, 0.0)  # the kernel's own NaN stay with finite bands
        where = _more(first, own)
        if where is None:
            return result
        if _more(again(zero, math.nan), own) is not None:
            raise OutOfBounds(
                f"NaN in the output at {where} from memory it allocated and never wrote "
                "(finite when its allocations start at 0)"
            )
        read = next(
            (n for n in names if _more(again({**zero, n: math.nan}, 0.0), own) is not None),
            "its inputs",
        )
        raise OutOfBounds(f"reads past the end of {read}: NaN in the output at {where}")

    call.__wrapped__ = fn
    return call
