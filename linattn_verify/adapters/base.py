"""What every adapter shares: the Adapter record, the error for a library that is not there,
an adapter's code around its library's call, written once (calling), and the feature map a
caller applies to a core that takes mapped features."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from ..head_dims import UNDECLARED, HeadDims
from ..specs import Spec, SpecError

Fn = Callable[..., torch.Tensor]


class AdapterUnavailable(SpecError):
    """The adapter's library does not import here (a target that cannot be loaded: a usage
    error)."""


@dataclass(frozen=True)
class Adapter:
    """One third-party entry point behind the contract.

    name: short and unique; library: the pip distribution; function: the object called;
    spec: what the library claims, in our vocabulary; layout: "bhnd" or "bnhd", the layout
    of the callable that load() returns; note: what the library does, where it departs
    from `spec`; load: imports the library lazily and returns fn (raises
    AdapterUnavailable); install: the `pip install --no-deps` arguments that bring it;
    triton: its kernels are Triton code (natively on CUDA, else in Triton's interpreter on
    CPU tensors, triton_interpret.py); cost: the growth it claims; state: the
    layout of the state its function carries ("Sz", under_test.claim.STATE_LAYOUTS) and
    load_state the fn(q, k, v, initial_state=...) -> (out, final_state) that carries it,
    for `--state`; None for a function without one. varlen: its function takes packed
    batches (cu_seqlens, --varlen). dtypes: the input dtypes the library claims, from its
    documentation or its own asserts (None: every one); vet judges inside them and says in
    one line what the function does outside. head_dims: the head dimensions it takes, from
    the same sources (head_dims.HeadDims; its default: any).
    """

    name: str
    library: str
    function: str
    spec: Spec
    layout: str
    note: str
    load: Callable[[], Fn]
    install: str
    triton: bool = False
    cost: str = "linear"
    state: str | None = None
    load_state: Callable[[], Fn] | None = None
    varlen: bool = False
    dtypes: tuple[str, ...] | None = None
    head_dims: HeadDims = UNDECLARED


def import_library(module: str, install: str) -> ModuleType:
    """`module`, or AdapterUnavailable saying how to install it."""
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as err:  # OSError: a compiled extension that fails to load
        raise AdapterUnavailable(
            f"cannot import {module} ({type(err).__name__}: {err}); install it with "
            f"`pip install --no-deps {install}` (--no-deps: leave the torch build alone)"
        ) from None


def calling(kernel: Fn, call: str, why: str) -> Fn:
    """fn(q, k, v) = `call`, one Python expression of q, k, v, torch and `kernel` (the
    library's function): an adapter's code around its call, written once, so that the script
    vet --repro writes shows the very code the adapter runs (vet/repro.py). `why` says what
    the code is for. fn keeps all three (fn.kernel, fn.call, fn.why)."""
    fn = eval(f"lambda q, k, v: {call}", {"torch": torch, "kernel": kernel})
    fn.kernel, fn.call, fn.why = kernel, call, why
    return fn


RELU_CALL = "kernel(torch.relu(q), torch.relu(k), v)"
RELU_WHY = "The kernel takes features already mapped: the caller maps q and k, here with relu."


def relu_features(core: Fn) -> Fn:
    """A core that takes mapped features (phi(q), phi(k), v), called with phi = relu: the
    feature map a caller applies, not a fix of the core."""
    return calling(core, RELU_CALL, RELU_WHY)


def largest_divisor_below(n: int, largest: int) -> int:
    """For a library that needs N % size == 0 (fla's naive_chunk_based, linear-attention-
    transformer's buckets): the largest divisor of n below n, so that both the path inside
    a chunk and the one across chunks run, and at most `largest`, the library's default;
    1 for n <= 1."""
    return max((c for c in range(1, min(n - 1, largest) + 1) if n % c == 0), default=1)
