"""Channel gates behind families.protocol.Family (GLA, Yang et al. 2024): kernelised
attention's forms, engines and gradients with a gate per key channel, the scalar decays'
arguments, fast sums, state bounds and notes (families/decayed/: what it shares with them)."""

from __future__ import annotations

from ..decayed import bound as decayed_bound
from ..decayed.arguments import decay_arguments
from ..decayed.notes import DECAY_NOTES
from ..kernelised.bound import feature_count
from ..kernelised.certified_gradients import certified_gradients
from ..protocol import Family, SumsBound
from ..similarity_sums import sums_family
from . import fields, golden
from .bound import ball_sums
from .forms import FORMS
from .quadratic import weights
from .reference import CHANNEL_GATES as SIMILARITY
from .vectors import KNOWN_ANSWER_SPECS, formulas

CHANNEL_GATED: Family = sums_family(
    name="channel gates",
    folder="channel_gates",
    source=fields.SOURCE,
    claims=lambda spec: spec.decay == "channel-gates",
    check=fields.check,
    arguments=decay_arguments(("g",)),
    similarity=SIMILARITY,
    gradients=certified_gradients,
    forms=FORMS,  # forms_of: kernelised attention's
    golden=golden,
    weights=weights,
    sums_bound=SumsBound(
        ball_sums, decayed_bound.fast_sums, decayed_bound.denominator_condition, feature_count
    ),
    state_bound=decayed_bound.state_bound,
    state_gradient_bound=decayed_bound.state_gradient_bound,
    notes=(DECAY_NOTES,),
    known_answer_specs=KNOWN_ANSWER_SPECS,
    formulas=formulas,
)
