"""The accuracy model: errors in units of roundoff, an a-priori bound, a budget, a verdict."""

from ..rounding import C_LIB, gamma
from .bound import scale_and_bound
from .judgement import Judgement
from .verdict import BUDGET_FLOOR, K_BUDGET, AccuracyVerdict, attainable_floor, error_units, judge

__all__ = [
    "BUDGET_FLOOR",
    "C_LIB",
    "K_BUDGET",
    "AccuracyVerdict",
    "Judgement",
    "attainable_floor",
    "error_units",
    "gamma",
    "judge",
    "scale_and_bound",
]
