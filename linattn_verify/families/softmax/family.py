"""Softmax attention behind families.protocol.Family (Vaswani et al. 2017): the hooks of
its folder, reference/'s engines with its similarity (similarity_sums.py); quadratic
forms only (no finite feature map), no state."""

from __future__ import annotations

from ...specs import FEATURE_MAPS, Spec, SpecError
from ..protocol import Family, SumsBound
from ..similarity_sums import sums_family
from . import forms, golden
from .bound import ball_sums
from .certified_gradients import certified_gradients
from .quadratic import weights
from .reference import SOFTMAX as SIMILARITY
from .vectors import KNOWN_ANSWER_SPECS


def check(spec: Spec) -> None:
    """SpecError for a decay: softmax's weights are exp(q.k / sqrt(d)) alone."""
    if spec.decay is not None:
        raise SpecError("softmax takes no decay (its weights are its own)")


SOFTMAX: Family = sums_family(
    name="softmax",
    folder="softmax",
    source=FEATURE_MAPS["softmax"].source,
    claims=lambda spec: not spec.info.kernelised,
    check=check,
    similarity=SIMILARITY,
    gradients=certified_gradients,
    forms=forms,
    golden=golden,
    weights=weights,
    sums_bound=SumsBound(ball_sums),
    quadratic=True,
    known_answer_specs=KNOWN_ANSWER_SPECS,
)
