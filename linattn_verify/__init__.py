"""linattn-verify: exact references, an accuracy model and property tests for linear attention."""

from .inputs import UNIT_ROUNDOFF
from .reference import ReferenceAccuracyError, reference
from .sampling import SAMPLERS, sample_projection
from .specs import FEATURE_MAPS, Spec, SpecError

__all__ = [
    "FEATURE_MAPS",
    "SAMPLERS",
    "UNIT_ROUNDOFF",
    "ReferenceAccuracyError",
    "Spec",
    "SpecError",
    "reference",
    "sample_projection",
]
