"""Which specs have known-answer vectors, and the vectors' names in their fixed order: the
maps' plain specs (KAT_MAPS), the decayed ones fla computes, the shipped kernels' eps and
the delta rule's (OTHER_KAT_SPECS); all_vectors lists (name, spec, case) of each, and
not_applicable says why a spec has none."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from ..cases import Case
from ..families import FAMILIES, family_of
from ..specs import FEATURE_MAPS, RSQRT_D, Spec
from .cases import gated_vector_cases, vector_cases
from .files import DEFAULT_DIR

# the maps with published vectors of their plain specs (identity, added after them, has none
# yet); the decayed specs with vectors: GLA's channel gates (fla's, and elu's normalised),
# and as fla calls them simple GLA / Mamba2's scalar gates and retention's constant decay
KAT_MAPS = tuple(name for name in FEATURE_MAPS if name != "identity")
_FLA = Spec("identity", causal=True, normalize=False, scale=RSQRT_D)
DECAYED_KAT_SPECS = (
    replace(_FLA, decay="channel-gates"),
    Spec("elu", causal=True, decay="channel-gates"),
    replace(_FLA, decay="gates"),
    replace(_FLA, decay="constant"),
)
# the denominator eps of shipped kernels: 1e-6 (fast-transformers' elu, performer-pytorch's
# causal relu and FAVOR+, fla's based), and fla's linear attention (1e-10, scale d^-0.5)
EPS_KAT_SPECS = (
    Spec("elu", eps=1e-6),
    Spec("elu", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-6),
    Spec("performer-positive", causal=True, eps=1e-6),
    Spec("taylor", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-10, scale=RSQRT_D),
)
# the vectors of the families with their own (Family.known_answer_cases: the delta rule's)
FAMILY_VECTORS = tuple(v for family in FAMILIES for v in family.known_answer_cases())
# the specs other than the KAT_MAPS' plain ones (eps 0) that have vectors
OTHER_KAT_SPECS = (
    DECAYED_KAT_SPECS + EPS_KAT_SPECS + tuple(dict.fromkeys(s for s, _, _ in FAMILY_VECTORS))
)


def spec_label(spec: Spec) -> str:
    """The part of a vector's name that names its spec: map, causality, and where they are
    not the plain spec's eps, unnormalised, scaled, delta, its decay, l2norm."""
    words = [spec.feature_map, "causal" if spec.causal else "full"]
    words += [f"eps{spec.eps:g}"] * (spec.eps != 0)
    words += ["unnormalised"] * (not spec.normalize) + ["scaled"] * (spec.scale != 1.0)
    words += [label] if (label := family_of(spec).label) else []
    words += [spec.decay] * (spec.decay is not None)
    return "-".join(words + ["l2norm"] * spec.qk_l2norm)


def all_vectors() -> Iterator[tuple[str, Spec, Case]]:
    """(name, spec, case) of every vector, in a fixed order."""
    for name in KAT_MAPS:
        for causal in (False, True):
            spec = Spec(name, causal=causal)
            for label, case in vector_cases(spec):
                yield f"{spec_label(spec)}-{label}", spec, case
    for spec in DECAYED_KAT_SPECS:
        for label, case in gated_vector_cases(spec):
            yield f"{spec_label(spec)}-{label}", spec, case
    for spec in EPS_KAT_SPECS:
        for label, case in vector_cases(spec):
            yield f"{spec_label(spec)}-{label}", spec, case
    for spec, label, case in FAMILY_VECTORS:
        yield f"{spec_label(spec)}-{label}", spec, case


def not_applicable(spec: Spec) -> str | None:
    """Why the known-answer vectors do not judge a kernel of `spec`, or None."""
    defining = spec.defining
    if defining in OTHER_KAT_SPECS:
        return None
    if defining.plain and defining.eps == 0 and defining.feature_map in KAT_MAPS:
        return None
    return f"no known-answer vectors for {spec}; {DEFAULT_DIR / 'README.md'} lists the specs"
