"""Built-in torch implementations: the golden one, and every form of every spec."""

from .forms import FORMS, CausalStream, State, attention
from .golden import GOLDEN_FORMS, golden_attention, golden_forms
from .projection import sample_projection_torch

__all__ = [
    "FORMS",
    "GOLDEN_FORMS",
    "CausalStream",
    "State",
    "attention",
    "golden_attention",
    "golden_forms",
    "sample_projection_torch",
]
