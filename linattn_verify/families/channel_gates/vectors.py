"""Channel gates' known-answer vectors (linattn_verify/known_answers/): GLA's as fla
computes it (families/decayed/vectors.FLA) and elu's normalised, in part 2
(Family.known_answer_specs); their cases are known_answers/cases.py's (the decay check's
rates); a vector's formulas, its map's and its gates'."""

from __future__ import annotations

from dataclasses import replace

from ...specs import Spec
from ..decayed.vectors import FLA
from .fields import SOURCE

KNOWN_ANSWER_SPECS = (
    (2, replace(FLA, decay="channel-gates")),
    (2, Spec("elu", causal=True, decay="channel-gates")),
)


def formulas(spec: Spec) -> dict[str, str]:
    """The vector's formulas: its map's and its gates' (fields.SOURCE)."""
    return {"formula": spec.info.source, "decay_formula": SOURCE}
