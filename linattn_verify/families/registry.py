"""The registry: every spec family, asked in order; the first that claims a spec is its."""

from __future__ import annotations

from ..specs import Spec, SpecError
from .channel_gates.family import CHANNEL_GATED
from .decayed.family import DECAYED
from .delta.family import DELTA
from .iplr.family import IPLR
from .kernelised.family import KERNELISED
from .protocol import Family
from .softmax.family import SOFTMAX

FAMILIES: tuple[Family, ...] = (DELTA, IPLR, SOFTMAX, CHANNEL_GATED, DECAYED, KERNELISED)
# the families a spec chooses by name (Spec.family, --family NAME): their folders' names
NAMED = {family.folder: family for family in FAMILIES if family.named}


def family_of(spec: Spec) -> Family:
    """The family of `spec`: the one it names (Spec.family, which checks the spec), else the
    first of FAMILIES that claims it (KERNELISED claims every spec the others leave)."""
    if spec.family is None:
        return next(family for family in FAMILIES if family.claims(spec) and not family.named)
    if spec.family not in NAMED:
        known = ", ".join(NAMED) or "none yet"
        raise SpecError(f"unknown family {spec.family!r}; the families chosen by name: {known}")
    family = NAMED[spec.family]
    family.check(spec)
    return family
