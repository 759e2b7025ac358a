"""The scalar decays' known-answer vectors (linattn_verify/known_answers/): simple GLA's
and Mamba2's scalar gates and retention's constant decay as fla calls them (FLA), in part 2
(Family.known_answer_specs); their cases are known_answers/cases.py's (the decay check's
rates); a decayed vector's formulas, its map's and its decay's."""

from __future__ import annotations

from dataclasses import replace

from ...specs import RSQRT_D, Spec
from .fields import SOURCES

# the spec fla's decayed kernels compute: identity features, unnormalised, scale d^-0.5
FLA = Spec("identity", causal=True, normalize=False, scale=RSQRT_D)
KNOWN_ANSWER_SPECS = ((2, replace(FLA, decay="gates")), (2, replace(FLA, decay="constant")))


def formulas(spec: Spec) -> dict[str, str]:
    """The vector's formulas: its map's and its decay's (fields.SOURCES)."""
    return {"formula": spec.info.source, "decay_formula": SOURCES[spec.decay]}
