"""What every family's built-in and golden forms share (each family's forms are its folder's,
families/<f>/forms.py and golden.py): the tensor checks, the golden machinery, projections."""

from .forms import FORMS
from .golden import GOLDEN_FORMS
from .projection import sample_projection_torch

__all__ = ["FORMS", "GOLDEN_FORMS", "sample_projection_torch"]
