"""Exact references: attention from its definition, faithfully rounded to float64.

Two independent engines compute the same thing: `mp` (the literal quadratic definition in
mpmath, the ground truth for small cases) and `arb` (ball arithmetic in linear form, fast for
large N). `reference` picks mpmath below MP_MAX_WORK and arb above it; tests cross-check
them. A third, `certified` (float64 at matmul speed with a rigorous bound per element, arb for
the rows it cannot certify), is within 2^-34 of each element's scale rather than correctly
rounded: for judging float32 and lower precisions at long N. The delta rule's specs have
engines of their own (delta.py: its mpmath, arb and certified float64 recurrences). None
imports an implementation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..inputs import AttentionInputs, decay_values, pack_delta, validate
from ..specs import Spec, SpecError
from .arb import arb_attention
from .certified import CERTIFIED_SHARE, Certified, certified_attention
from .common import MAX_PREC, ReferenceAccuracyError
from .delta import (
    MP_MAX_STEPS,
    arb_delta,
    certified_delta,
    delta_scale,
    exact_delta_state,
    mp_delta,
)
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
    b, h, nq, nk, d, dv = x.shape
    if spec.delta_rule:
        if engine == "auto":
            engine = "mp" if b * h * nq * d * dv <= MP_MAX_STEPS else "arb"
        if engine == "certified":
            return certified_delta(x, spec).values
        return (mp_delta if engine == "mp" else arb_delta)(x, spec)[0]
    if engine == "auto":
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
    delta_rule: bool = False,
    qk_l2norm: bool = False,
    beta: Any = None,
) -> np.ndarray:
    """Exact attention output (B, H, Nq, dv) as float64, within one ulp of the true value.

    q, k: (B, H, N, d); v: (B, H, N, dv); torch tensors or numpy arrays of float16, bfloat16,
    float32 or float64, taken exactly as they are. Rows whose denominator is exactly zero
    (relu with eps = 0) are NaN: the definition is 0/0 there. normalize, scale and decay
    are the spec's (specs.Spec); a decay's values are gamma (H,) for "constant" and the
    log-gates g, (B, H, N) for "gates" and (B, H, N, d) for "channel-gates". delta_rule
    and qk_l2norm are the spec's too (specs.DELTA_SOURCE: feature_map "identity", causal,
    normalize=False), with beta (B, H, N).
    """
    spec = Spec(feature_map, causal, eps, normalize, scale, decay, None, delta_rule, qk_l2norm)
    values = decay_values(spec, gamma, g)
    if delta_rule and beta is None:
        raise SpecError("the delta rule needs beta (B, H, N)")
    if delta_rule:
        import torch

        values = pack_delta(*(None if t is None else torch.as_tensor(t) for t in (beta, values)))
    elif beta is not None:
        raise SpecError(f"beta is the delta rule's (delta_rule=True), not {spec}'s")
    return exact(validate(q, k, v, spec, projection, values), spec, engine)


__all__ = [
    "CERTIFIED_SHARE",
    "ENGINES",
    "MAX_PREC",
    "Certified",
    "ReferenceAccuracyError",
    "arb_delta",
    "certified_attention",
    "certified_delta",
    "delta_scale",
    "exact",
    "exact_delta_state",
    "mp_delta",
    "reference",
]
