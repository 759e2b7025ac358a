"""Validation of attention inputs, shared by the references and the implementations.

Every problem with an input becomes a SpecError that names the argument and the problem,
so that no caller sees a traceback from deep inside numpy, torch or mpmath.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from .specs import Spec, SpecError

# Unit roundoff u = 2^-p of each floating dtype we judge (p = significand bits incl. hidden).
UNIT_ROUNDOFF: dict[str, float] = {
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
}
# Smallest positive subnormal of each dtype: rounding a result that small or smaller to the
# dtype may err by half of it, whatever u says (Higham, sec. 2.1, gradual underflow).
SMALLEST_SUBNORMAL: dict[str, float] = {
    "float16": 2.0**-24,
    "bfloat16": 2.0**-133,
    "float32": 2.0**-149,
    "float64": 2.0**-1074,
}

# TF32 (NVIDIA's tensor-core format for float32 products, Ampere and newer): float32's
# exponent and a 10-bit mantissa, u = 2^-11 per input rounded to nearest even, as Triton's
# interpreter rounds TMA loads (a GPU that truncates raw float32 registers instead would err
# by up to 2^-10: make device-check's native TF32 run shows which)
TF32_UNIT_ROUNDOFF = 2.0**-11


def unit_roundoff(dtype: str, spec: Spec) -> float:
    """The unit roundoff errors of `dtype` outputs are measured and bounded in: TF32's for
    float32 under a spec whose products are TF32 (every rounding charged at 2^-11, which
    bounds the float32 sums as well), else the dtype's."""
    if dtype == "float32" and spec.dot_precision == "tf32":
        return TF32_UNIT_ROUNDOFF
    return UNIT_ROUNDOFF[dtype]


def round_to_tf32(t):
    """A float32 tensor's values rounded to TF32 (10 mantissa bits, to nearest even;
    infinities and NaN kept), as tensor cores take the inputs of a float32 product."""
    bits = t.contiguous().view(torch.int32)
    special = (bits & 0x7F800000) == 0x7F800000
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return torch.where(special, bits, rounded).view(torch.float32).reshape(t.shape)


@dataclass(frozen=True)
class AttentionInputs:
    """q, k, v (and W, and the decay) as exact float64 arrays, with the dtype they came in.

    decay: None, or for a decayed spec (specs.DECAYS) gamma (H,) ("constant") or the
    log-gates g (B, H, N) ("gates") or (B, H, N, d) ("channel-gates"). beta: the delta
    rule's (B, H, N), None for other specs."""

    q: np.ndarray  # (B, H, Nq, d)
    k: np.ndarray  # (B, H, Nk, d)
    v: np.ndarray  # (B, H, Nk, dv)
    projection: np.ndarray | None  # (m, d)
    dtype: str  # the dtype of q (all inputs share it when they come from torch)
    decay: np.ndarray | None = None
    beta: np.ndarray | None = None

    def first(self, n: int) -> AttentionInputs:
        """The inputs of the first n tokens (their gates, per token (B, H, N[, d]), and beta;
        gamma (H,) whole)."""
        per_token = self.decay is not None and self.decay.ndim >= 3
        part = (t[:, :, :n] for t in (self.q, self.k, self.v))
        decay = self.decay[:, :, :n] if per_token else self.decay
        beta = None if self.beta is None else self.beta[:, :, :n]
        return AttentionInputs(*part, self.projection, self.dtype, decay, beta)

    @property
    def shape(self) -> tuple[int, int, int, int, int, int]:
        """(B, H, Nq, Nk, d, dv)."""
        b, h, nq, d = self.q.shape
        return b, h, nq, self.k.shape[2], d, self.v.shape[3]


def dtype_name(x: Any) -> str:
    """'float16', 'bfloat16', 'float32' or 'float64' for a torch tensor or numpy array."""
    name = str(x.dtype).removeprefix("torch.")
    return "float64" if name == "double" else name


def as_float64(x: Any, what: str) -> tuple[np.ndarray, str]:
    """Exact float64 copy of a torch tensor or numpy array of a floating dtype we judge."""
    if x is None:
        raise SpecError(f"{what} is missing")
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise SpecError(f"{what} must be a torch tensor or numpy array, got {type(x).__name__}")
    name = dtype_name(x)
    if name not in UNIT_ROUNDOFF:
        raise SpecError(
            f"{what} has dtype {name}; expected one of {', '.join(UNIT_ROUNDOFF)} "
            "(integer inputs are not attention inputs: convert them explicitly)"
        )
    if type(x).__module__.startswith("torch"):
        arr = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        arr = np.asarray(x, dtype=np.float64)  # float16/32/64 widen exactly
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise SpecError(f"{what} has a non-finite value {arr[tuple(bad)]} at index {tuple(bad)}")
    return np.array(arr, dtype=np.float64, copy=True), name


def check_shapes(
    q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], spec: Spec, w: tuple | None
) -> None:
    """Raise SpecError unless the shapes of q, k, v (and W) fit each other and the spec."""
    for name, shape in (("q", q), ("k", k), ("v", v)):
        if len(shape) != 4:
            raise SpecError(f"{name} must be 4-d (B, H, N, d), got shape {shape}")
        if 0 in shape:
            raise SpecError(f"{name} has an empty dimension: shape {shape} (B, H, N, d)")
    if q[:2] != k[:2] or k[:2] != v[:2]:
        raise SpecError(f"batch and head dimensions differ: q {q}, k {k}, v {v}")
    if q[3] != k[3]:
        raise SpecError(f"q and k head dimensions differ: q {q}, k {k}")
    if k[2] != v[2]:
        raise SpecError(f"k and v have different N: k {k}, v {v}")
    if spec.causal and q[2] != k[2]:
        raise SpecError(f"causal attention needs as many queries as keys: q {q}, k {k}")
    if spec.info.needs_projection:
        if w is None:
            raise SpecError(f"feature map {spec.feature_map!r} needs projection=W of shape (m, d)")
        if len(w) != 2 or w[1] != q[3] or w[0] == 0:
            raise SpecError(
                f"projection must have shape (m, d) with d = {q[3]} and m >= 1, got {w}"
            )
    elif w is not None:
        raise SpecError(f"feature map {spec.feature_map!r} takes no projection")


def exact_tensors(q: Any, k: Any, v: Any, spec: Spec, projection: Any = None) -> AttentionInputs:
    """q, k, v and W checked against the spec (shapes, dtypes, values) as exact float64
    copies, without the spec's other arguments (a family's validate adds its own)."""
    qa, qdtype = as_float64(q, "q")
    ka, _ = as_float64(k, "k")
    va, _ = as_float64(v, "v")
    proj = None if projection is None else as_float64(projection, "projection")[0]
    check_shapes(qa.shape, ka.shape, va.shape, spec, None if proj is None else proj.shape)
    return AttentionInputs(qa, ka, va, proj, qdtype)


# A family's check of its packed argument (the checks' `decay`) against q's shape (B, H, N,
# d): that argument as exact float64 arrays (None: the spec takes none), SpecError where it
# is missing, misshapen or out of range (a decay's: families/decayed/values.py)
ArgumentCheck = Callable[[Any, Spec, tuple[int, ...]], np.ndarray | None]


def no_decay(decay: Any, spec: Spec, q_shape: tuple[int, ...]) -> None:
    """The ArgumentCheck of a spec without a decay: SpecError for a decay given, and for a
    spec that has one (its family's validate checks it: linattn_verify.families)."""
    if spec.decay is not None:
        raise SpecError(f"{spec}: its decay is checked by its family (linattn_verify.families)")
    if decay is not None:
        raise SpecError(f"{spec} takes no decay (give the spec decay='constant' or 'gates')")


def validate(
    q: Any,
    k: Any,
    v: Any,
    spec: Spec,
    projection: Any = None,
    decay: Any = None,
    check: ArgumentCheck = no_decay,
) -> AttentionInputs:
    """Check shapes, dtypes and values against the spec; return exact float64 copies (the
    family's packed argument `decay` among them, as its `check` takes it: none by default)."""
    x = exact_tensors(q, k, v, spec, projection)
    return replace(x, decay=check(decay, spec, x.q.shape))


def check_cu_seqlens(cu_seqlens: Any, total: int) -> list[int]:
    """The offsets of a packed batch (the FlashAttention convention: sequence s is tokens
    cu_seqlens[s] .. cu_seqlens[s + 1] - 1 of one row of T tokens) as a list; SpecError
    unless they are a 1-d integer tensor starting at 0, never decreasing, ending at T."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
        raise SpecError(f"cu_seqlens must be a 1-d integer tensor, got {cu_seqlens!r}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or len(cu_seqlens) < 2:
        raise SpecError(f"cu_seqlens must hold at least two integer offsets, got {cu_seqlens}")
    offsets = [int(t) for t in cu_seqlens.tolist()]
    if offsets[0] != 0:
        raise SpecError(f"cu_seqlens must start at 0, got {offsets[:3]} ...")
    if any(b < a for a, b in itertools.pairwise(offsets)):
        raise SpecError(f"cu_seqlens must not decrease, got {offsets}")
    if offsets[-1] != total:
        raise SpecError(f"cu_seqlens must end at the {total} packed tokens, got {offsets[-1]}")
    return offsets
