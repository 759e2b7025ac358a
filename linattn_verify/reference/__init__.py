"""Exact references: attention from its definition, faithfully rounded to float64.

Two independent engines compute the same thing: `mp` (the literal quadratic definition in
mpmath, the ground truth for small cases) and `arb` (ball arithmetic in linear form, fast for
large N). `exact_attention` picks mpmath below MP_MAX_WORK and arb above it; tests
cross-check them. A third, `certified` (float64 at matmul speed with a rigorous bound per
element, arb for the rows it cannot certify), is within 2^-34 of each element's scale rather
than correctly rounded: for judging float32 and lower precisions at long N. These are the
engines shared by the families that sum their similarities (kernelised, decayed,
channel-gated, softmax): each passes in its similarities (similarity.Similarity, from
families/<name>/reference.py). A family of its own state update has its own engines, and
`families.exact` and `families.reference` take every family's spec. None imports an
implementation.
"""

from __future__ import annotations

import numpy as np

from ..inputs import AttentionInputs
from ..specs import Spec, SpecError, summing
from .arb import arb_attention
from .certified import CERTIFIED_SHARE, Certified
from .certified_engine import certified_attention
from .common import MAX_PREC, ReferenceAccuracyError
from .mp import mp_attention
from .similarity import Similarity

ENGINES = ("auto", "mp", "arb", "certified")
# Largest B*H*Nq*Nk*(d + dv) for which "auto" uses mpmath, the literal definition: the
# smallest cases; arb is 15 to 30 times faster from a few tokens on (README, "Exact
# references"; tests/test_reference.py cross-checks the engines on such sizes).
MP_MAX_WORK = 2**10


def exact_attention(
    x: AttentionInputs, spec: Spec, similarity: Similarity, engine: str = "auto"
) -> np.ndarray:
    """Exact attention for validated inputs of a spec whose engines are these (module
    docstring), by `engine` (ENGINES), the similarities by its family's `similarity`."""
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    summing(spec, "exact references")
    b, h, nq, nk, d, dv = x.shape
    if engine == "auto":
        engine = "mp" if b * h * nq * nk * (d + dv) <= MP_MAX_WORK else "arb"
    if engine == "certified":
        return certified_attention(x, spec, similarity).values
    if engine == "mp":
        return mp_attention(x, spec, similarity)
    return arb_attention(x, spec, similarity)


__all__ = [
    "CERTIFIED_SHARE",
    "ENGINES",
    "MAX_PREC",
    "Certified",
    "ReferenceAccuracyError",
    "Similarity",
    "certified_attention",
    "exact_attention",
]
