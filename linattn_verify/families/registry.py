"""The registry: every spec family, asked in order; the first that claims a spec is its."""

from __future__ import annotations

from ..specs import Spec
from .delta.family import DELTA
from .protocol import Family
from .standard import CHANNEL_GATED, DECAYED, KERNELISED, SOFTMAX

FAMILIES: tuple[Family, ...] = (DELTA, SOFTMAX, CHANNEL_GATED, DECAYED, KERNELISED)


def family_of(spec: Spec) -> Family:
    """The family of `spec`: the first of FAMILIES that claims it (KERNELISED claims every
    spec the others leave)."""
    return next(family for family in FAMILIES if family.claims(spec))
