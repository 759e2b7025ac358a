"""The standard model's shared terms, for every family's a-priori bound: gamma_n, relative
errors composed, the accuracy of elementary functions, how far a chunked kernel's gate
prefix sums reach, and the feature model in force (which evaluations of the features the
bounds admit)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from .inputs import AttentionInputs
from .specs import Spec

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


def widest_gate_sum(spec: Spec, x: AttentionInputs) -> float:
    """|G|: the largest sum of |ln w_t| over DECAY_CHUNK consecutive tokens (of a key
    channel, for channel gates), what a chunked kernel's prefix sums reach; 0 without a
    decay."""
    if spec.decay is None:
        return 0.0
    logs = np.abs(np.log(x.decay)) if spec.decay == "constant" else np.abs(x.decay)
    if spec.decay == "constant":
        return float(logs.max()) * min(DECAY_CHUNK, x.k.shape[2])
    sums = np.cumsum(logs, axis=2)  # the token axis: (B, H, N) or (B, H, N, d)
    pad = [(0, 0)] * sums.ndim
    pad[2] = (DECAY_CHUNK, 0)
    ahead = np.pad(sums, pad)[:, :, :-DECAY_CHUNK]
    return float((sums - ahead).max())
