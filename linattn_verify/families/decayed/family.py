"""The scalar decays behind families.protocol.Family (RetNet's constant gamma, Sun et al.
2023; log-gates per token): kernelised attention's forms, engines and gradients with its
decay's pieces (families/kernelised/ is what it builds on), and its decay's arguments."""

from __future__ import annotations

from ..kernelised.bound import feature_count
from ..kernelised.certified_gradients import certified_gradients
from ..protocol import Family, SumsBound
from ..similarity_sums import sums_family
from . import bound, fields, golden
from .arguments import decay_arguments
from .forms import FORMS
from .notes import DECAY_NOTES
from .quadratic import weights
from .reference import DECAYED as SIMILARITY
from .vectors import KNOWN_ANSWER_SPECS, formulas

DECAYED: Family = sums_family(
    name="scalar decay and gates",
    folder="decayed",
    source="; ".join(fields.SOURCES.values()),
    claims=lambda spec: spec.decay in fields.SOURCES,
    check=fields.check,
    arguments=decay_arguments(("gamma", "g")),
    similarity=SIMILARITY,
    gradients=certified_gradients,
    forms=FORMS,  # forms_of: kernelised attention's
    golden=golden,
    weights=weights,
    sums_bound=SumsBound(
        bound.ball_sums, bound.fast_sums, bound.denominator_condition, feature_count
    ),
    state_bound=bound.state_bound,
    state_gradient_bound=bound.state_gradient_bound,
    notes=(DECAY_NOTES,),
    known_answer_specs=KNOWN_ANSWER_SPECS,
    formulas=formulas,
)
