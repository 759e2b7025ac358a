"""Kernelised attention behind families.protocol.Family (Katharopoulos et al. 2020): the
hooks of its folder, reference/'s engines with its similarities (similarity_sums.py)."""

from __future__ import annotations

from ..protocol import Family, SumsBound
from ..similarity_sums import sums_family
from . import bound, forms, golden
from .certified_gradients import certified_gradients
from .gradient_bound import state_gradient_bound
from .quadratic import weights
from .reference import KERNELISED as SIMILARITY
from .vectors import KNOWN_ANSWER_SPECS

KERNELISED: Family = sums_family(
    name="kernelised",
    folder="kernelised",
    source="Katharopoulos et al. 2020, eq. 2-6: sim(q, k) = phi(q) . phi(k)",
    claims=lambda spec: True,  # every spec the families before it leave (registry.py)
    similarity=SIMILARITY,
    gradients=certified_gradients,
    forms=forms,
    golden=golden,
    weights=weights,
    sums_bound=SumsBound(
        bound.ball_sums, bound.fast_sums, bound.denominator_condition, bound.feature_count
    ),
    state_bound=bound.state_bound,
    state_gradient_bound=state_gradient_bound,
    known_answer_specs=KNOWN_ANSWER_SPECS,
)
