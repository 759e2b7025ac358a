"""Which specs have known-answer vectors and the vectors' names in their fixed order, as
each family's folder declares them (Family.known_answer_specs): all_vectors lists (name,
spec, case) of each, and not_applicable says why a spec has none."""

from __future__ import annotations

from collections.abc import Iterator

from ..cases import Case
from ..families import FAMILIES, spec_words
from ..specs import Spec
from .cases import spec_cases
from .files import DEFAULT_DIR

# (part, spec, family) of every spec with vectors: part by part, FAMILIES' order within one
_PARTS = sorted(
    ((part, spec, family) for family in FAMILIES for part, spec in family.known_answer_specs),
    key=lambda entry: entry[0],
)
KAT_SPECS = tuple(spec for _, spec, _ in _PARTS)  # the specs with vectors, in their order


def spec_label(spec: Spec) -> str:
    """The part of a vector's name that names its spec: map, causality, and where they are
    not the plain spec's (families.spec_words) eps, unnormalised, scaled, delta, its decay,
    l2norm."""
    words = spec_words(spec) | ({"scale": "scaled"} if spec.scale != 1.0 else {})
    order = ("eps", "normalize", "scale", "label", "decay", "qk_l2norm")
    causal = "causal" if spec.causal else "full"
    return "-".join([spec.feature_map, causal] + [words[f] for f in order if f in words])


def all_vectors() -> Iterator[tuple[str, Spec, Case]]:
    """(name, spec, case) of every vector, in a fixed order: KAT_SPECS', each one's cases in
    theirs (cases.spec_cases)."""
    for _, spec, family in _PARTS:
        for label, case in spec_cases(family, spec):
            yield f"{spec_label(spec)}-{label}", spec, case


def not_applicable(spec: Spec) -> str | None:
    """Why the known-answer vectors do not judge a kernel of `spec`, or None."""
    if spec.defining in KAT_SPECS:
        return None
    return f"no known-answer vectors for {spec}; {DEFAULT_DIR / 'README.md'} lists the specs"
