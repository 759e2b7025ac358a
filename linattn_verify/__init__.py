"""linattn-verify: exact references, an accuracy model and property tests for linear attention."""

from . import accuracy, implementations
from .families import attention, reference
from .families.kernelised.forms import CausalStream
from .implementations import sample_projection_torch
from .inputs import UNIT_ROUNDOFF
from .reference import ReferenceAccuracyError
from .sampling import SAMPLERS, sample_projection
from .specs import FEATURE_MAPS, Spec, SpecError

__all__ = [
    "FEATURE_MAPS",
    "SAMPLERS",
    "UNIT_ROUNDOFF",
    "CausalStream",
    "ReferenceAccuracyError",
    "Spec",
    "SpecError",
    "accuracy",
    "attention",
    "implementations",
    "reference",
    "sample_projection",
    "sample_projection_torch",
]
