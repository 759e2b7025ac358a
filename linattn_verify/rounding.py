"""The standard model's shared terms, for every family's a-priori bound: gamma_n, relative
errors composed, the accuracy of elementary functions, the chunk of a chunked kernel's gate
prefix sums, and the feature model in force (which evaluations of the features the bounds
admit)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

# Elementary functions (exp, expm1, sin, cos, sqrt) are within 1 ulp = 2u in glibc, SLEEF
# and CUDA's libdevice for these arguments; C_LIB = 2 units of roundoff.
C_LIB = 2
DECAY_CHUNK = 64  # the chunk of fla's and GLA's chunked kernels (decay_floor)
# Feature models (families/kernelised/bound.py): "standard" admits every sane evaluation of
# each map, the textbook ones included; "relative" (vet --strict) holds elu features to
# relative accuracy in entirely negative rows too
FEATURE_MODELS = ("standard", "relative")
FEATURE_MODEL: ContextVar[str] = ContextVar("feature_model", default="standard")


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u) (Higham eq. 3.5); inf when n u >= 1."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def grow(rel, g: float):
    """(1 + rel)(1 + g) - 1: relative errors compose."""
    return (1 + rel) * (1 + g) - 1


@contextmanager
def feature_model(model: str) -> Iterator[None]:
    """Bounds computed inside the block assume `model` (FEATURE_MODELS) for the features."""
    if model not in FEATURE_MODELS:
        raise ValueError(f"feature model {model!r}; known: {', '.join(FEATURE_MODELS)}")
    token = FEATURE_MODEL.set(model)
    try:
        yield
    finally:
        FEATURE_MODEL.reset(token)
