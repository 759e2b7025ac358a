"""What every family's built-in forms share: the form names, the default chunk size, and the
checks of the tensors they take (docs/architecture.md, "Vocabulary"). The forms themselves are
their families' (families/<f>/forms.py).

float16/bfloat16/float32 inputs are computed in float32 and float64 in float64; the output
has the inputs' dtype and device.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ..inputs import UNIT_ROUNDOFF, check_cu_seqlens, check_shapes, dtype_name
from ..specs import Spec, SpecError

FORMS = ("quadratic", "linear", "recurrent", "chunked")
DEFAULT_CHUNK = 64


def check_tensors(q, k, v, spec: Spec, projection) -> None:
    """Raise SpecError unless q, k, v (and W) are floating tensors that fit the spec (their
    values: check_finite)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise SpecError(f"{name} must be a torch tensor, got {type(t).__name__}")
        if dtype_name(t) not in UNIT_ROUNDOFF:
            raise SpecError(f"{name} has dtype {t.dtype}; expected a floating dtype")
    if not (q.dtype == k.dtype == v.dtype):
        raise SpecError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise SpecError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    w_shape = None if projection is None else tuple(projection.shape)
    check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), spec, w_shape)


def check_finite(q, k, v, projection) -> None:
    """Raise SpecError if q, k, v or W hold a NaN or an infinity."""
    for name, t in (("q", q), ("k", k), ("v", v), ("projection", projection)):
        if t is None:
            continue
        t = torch.as_tensor(t).detach()
        # a NaN or inf anywhere makes the sum non-finite; a finite sum clears the tensor in
        # one cheap pass, an overflowing one sends it to the full check
        if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
            raise SpecError(f"{name} has a non-finite value")


def check_chunk_size(chunk_size: object) -> None:
    """Raise SpecError unless chunk_size is a positive integer."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype a form computes `t`'s dtype in: float64 for float64, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def defined(spec: Spec, causal: bool) -> Spec:
    """The spec the forms evaluate (a spec that sums its similarities): its defining fields
    (not how a kernel rounds: no dot_precision), causal as given."""
    return replace(spec.defining, causal=causal)


def varlen(
    attention: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    cu_seqlens: torch.Tensor | None,
    form: str | None,
    projection: torch.Tensor | None,
    chunk_size: int,
    arguments: dict[str, Any] | None,
    gate_dims: int = 3,
) -> torch.Tensor:
    """attention(q, k, v, spec, form, projection, chunk_size, arguments) (a family's,
    families.protocol.Family.attention) of a packed batch: q, k, v (1, H, T, d) holding the
    sequences of cu_seqlens one after another (inputs.check_cu_seqlens), each attending to
    itself only (empty ones allowed), the log-gates g among the arguments, (1, H, T) or per
    key channel (1, H, T, d) (gate_dims 4), sliced with them; without cu_seqlens,
    attention() itself."""
    arguments = arguments or {}
    if cu_seqlens is None:
        return attention(q, k, v, spec, form, projection, chunk_size, arguments)
    check_tensors(q, k, v, defined(spec, spec.causal), projection)
    if q.shape[0] != 1 or k.shape[-2] != q.shape[-2]:
        raise SpecError(f"a packed batch is one row (1, H, T, d) of q and k alike, got {q.shape}")
    offsets = check_cu_seqlens(cu_seqlens, q.shape[-2])
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    gates = arguments.get("g")
    want = (1, q.shape[1], q.shape[-2], q.shape[-1])[:gate_dims]
    if gates is not None and tuple(gates.shape) != want:
        raise SpecError(f"g of a packed batch must be {want}, got {tuple(gates.shape)}")
    for a, b in itertools.pairwise(offsets):
        if b > a:
            piece = arguments if gates is None else arguments | {"g": gates[:, :, a:b]}
            out[..., a:b, :] = attention(
                *(t[..., a:b, :] for t in (q, k, v)), spec, form, projection, chunk_size, piece
            )
    return out
