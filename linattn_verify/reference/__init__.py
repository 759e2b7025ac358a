"""Exact references: attention from its definition, faithfully rounded to float64.

Two independent engines compute the same thing: `mp` (the literal quadratic definition in
mpmath, the ground truth for small cases) and `arb` (ball arithmetic in linear form, fast for
large N). `reference` picks mpmath below MP_MAX_WORK and arb above it; tests cross-check
them. A third, `certified` (float64 at matmul speed with a rigorous bound per element, arb for
the rows it cannot certify), is within 2^-34 of each element's scale rather than correctly
rounded: for judging float32 and lower precisions at long N. None imports an implementation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inputs import AttentionInputs, decay_values, validate
from ..specs import Spec, SpecError
from .arb import arb_attention
from .certified import CERTIFIED_SHARE, Certified, certified_attention
from .common import MAX_PREC, ReferenceAccuracyError
from .mp import mp_attention

ENGINES = ("auto", "mp", "arb", "certified")
# Largest B*H*Nq*Nk*(d + dv) for which "auto" uses mpmath, the literal definition: the
# smallest cases; arb is 15 to 30 times faster from a few tokens on (README, "Exact
# references"; tests/test_reference.py cross-checks the engines on such sizes).
MP_MAX_WORK = 2**10


def exact(x: AttentionInputs, spec: Spec, engine: str = "auto") -> np.ndarray:
    """Exact attention for validated inputs; see `reference`."""
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine == "auto":
        b, h, nq, nk, d, dv = x.shape
        engine = "mp" if b * h * nq * nk * (d + dv) <= MP_MAX_WORK else "arb"
    if engine == "certified":
        return certified_attention(x, spec).values
    return mp_attention(x, spec) if engine == "mp" else arb_attention(x, spec)


def reference(
    q: Any,
    k: Any,
    v: Any,
    feature_map: str = "elu",
    causal: bool = False,
    projection: Any = None,
    eps: float = 0.0,
    engine: str = "auto",
    *,
    normalize: bool = True,
    scale: float | str = 1.0,
    decay: str | None = None,
    gamma: Any = None,
    g: Any = None,
) -> np.ndarray:
    """Exact attention output (B, H, Nq, dv) as float64, within one ulp of the true value.

    q, k: (B, H, N, d); v: (B, H, N, dv); torch tensors or numpy arrays of float16, bfloat16,
    float32 or float64, taken exactly as they are. Rows whose denominator is exactly zero
    (relu with eps = 0) are NaN: the definition is 0/0 there. normalize, scale and decay
    are the spec's (specs.Spec); a decay's values are gamma (H,) for "constant" and the
    log-gates g, (B, H, N) for "gates" and (B, H, N, d) for "channel-gates".
    """
    spec = Spec(feature_map, causal, eps, normalize, scale, decay)
    values = decay_values(spec, gamma, g)
    return exact(validate(q, k, v, spec, projection, values), spec, engine)


__all__ = [
    "CERTIFIED_SHARE",
    "ENGINES",
    "MAX_PREC",
    "Certified",
    "ReferenceAccuracyError",
    "certified_attention",
    "exact",
    "reference",
]
