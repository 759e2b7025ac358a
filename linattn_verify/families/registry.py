"""The registry: every spec family, asked in order; the first that claims a spec is its.
Its family_of is specs.Spec's check of the fields a family owns (install_family_rules); the
families' own input kinds are cases.Case's too (install_family_kinds)."""

from __future__ import annotations

from ..cases import install_family_kinds
from ..grammar import Option
from ..specs import Spec, SpecError, install_family_rules
from .channel_gates.family import CHANNEL_GATED
from .decayed.family import DECAYED
from .delta.family import DELTA
from .iplr.family import IPLR
from .kernelised.family import KERNELISED
from .protocol import Family
from .softmax.family import SOFTMAX
from .ssd.family import SSD

FAMILIES: tuple[Family, ...] = (DELTA, IPLR, SSD, SOFTMAX, CHANNEL_GATED, DECAYED, KERNELISED)
# the families a spec chooses by name (Spec.family, --family NAME): their folders' names
NAMED = {family.folder: family for family in FAMILIES if family.named}


def family_of(spec: Spec) -> Family:
    """The family of `spec`: the one it names (Spec.family), else the first of FAMILIES that
    claims it (KERNELISED claims every spec the others leave); SpecError where the spec sets
    another family's option (Family.options; one both take, the grouped value heads, is
    either's) or its family's rules reject it (Family.check)."""
    if spec.family is None:
        family = next(family for family in FAMILIES if family.claims(spec) and not family.named)
    elif spec.family in NAMED:
        family = NAMED[spec.family]
    else:
        known = ", ".join(NAMED) or "none yet"
        raise SpecError(f"unknown family {spec.family!r}; the families chosen by name: {known}")
    for owner in FAMILIES:
        for option in () if owner is family else owner.options:
            if option not in family.options and getattr(spec, option.name) != option.default:
                owners = " or ".join(_whose(f, option) for f in FAMILIES if option in f.options)
                named = f", not for the family {spec.family!r}" * (spec.family is not None)
                raise SpecError(f"{option.name} ({option.flag}) is for {owners}{named}")
    family.check(spec)
    return family


def _whose(family: Family, option: Option) -> str:
    """The family that takes `option`, with the option that makes a spec its own (its
    first, or --family NAME for a family chosen by name) where that is another."""
    if family.named:
        return f"the {family.name} (--family {family.folder})"
    claim = family.options[0]
    return f"the {family.name}" + f" ({claim.flag})" * (option is not claim)


install_family_rules(family_of)
install_family_kinds(tuple(kind for family in FAMILIES for kind in family.kinds))
