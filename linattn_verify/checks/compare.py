"""Comparing two outputs within the a-priori floating-point bound.

Two evaluations of the same exact value by algorithms that each satisfy the bound of
accuracy/bound.py differ by at most the sum of their bounds. So a check that compares two
outputs allows |a - b| <= (bound_a + bound_b) u s element by element, the bound taken with
|out| <= s in place of the exact output (no reference needed): a tolerance derived from the
shapes, the dtype and the inputs, never a hand-picked rtol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..accuracy.bound import scale_and_bound
from ..inputs import SMALLEST_SUBNORMAL, AttentionInputs, unit_roundoff
from ..specs import Spec
from .core import Outcome


@dataclass(frozen=True)
class Tolerance:
    """Per element (B, H, N, dv): scale s (NaN where the exact value is 0/0) and the a-priori
    bound in units of u s of the dtype of the inputs."""

    scale: np.ndarray
    bound: np.ndarray
    u: float

    @classmethod
    def of(cls, x: AttentionInputs, spec: Spec) -> Tolerance:
        u = unit_roundoff(x.dtype, spec)
        scale, bound = scale_and_bound(x, spec, None, u, SMALLEST_SUBNORMAL[x.dtype])
        return cls(scale, bound, u)

    def allowance(self, times: float = 2.0) -> np.ndarray:
        """times x the bound in absolute terms (0 where s = 0: the exact output is 0)."""
        with np.errstate(invalid="ignore"):
            return np.where(self.scale > 0, times * self.bound * self.u * self.scale, 0.0)

    def units(self, diff: np.ndarray) -> np.ndarray:
        """|diff| in units of u s (0 where diff is 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(diff == 0, 0.0, np.abs(diff) / (self.u * self.scale))


@dataclass(frozen=True)
class Mismatch:
    """Where two outputs disagree beyond the allowance, and by how much."""

    count: int
    index: tuple[int, ...]
    units: float  # |a - b| / (u s) at index
    allowed: float  # allowance / (u s) at index
    a: float = math.nan  # the two values at index
    b: float = math.nan

    def describe(self, what: str) -> str:
        where = f"{what}: {self.count} element(s) outside the bound; at (b, h, i, c) = {self.index}"
        if all(map(math.isfinite, (self.a, self.b, self.units, self.allowed))):
            return f"{where} they differ by {self.units:.3g} u s, allowed {self.allowed:.3g} u s"
        return f"{where}: {self.a:.6g} against {self.b:.6g}"  # what is not finite shows


def mismatch(
    a: np.ndarray, b: np.ndarray, tol: Tolerance, allowance: np.ndarray, rows: Any = ...
) -> Mismatch | None:
    """None if a and b agree within `allowance` wherever the exact value is defined (among
    `rows`, an index into (B, H, N, dv)); else the worst disagreement. Equal values agree
    (the same infinity, and NaN with NaN: whether a value may be non-finite is for the
    positivity and reference checks to judge); a non-finite value against any other is a
    disagreement."""
    defined = np.zeros(a.shape, dtype=bool)
    defined[rows] = True
    defined &= ~np.isnan(tol.scale)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        # an infinite difference is bad even against an infinite (vacuous) allowance
        bad = defined & ~same & ~(np.isfinite(diff) & (diff <= allowance))
    if not bad.any():
        return None
    units = np.where(bad, tol.units(diff), 0.0)
    units = np.where(np.isnan(units), np.inf, units)
    worst = np.unravel_index(int(np.argmax(units)), units.shape)
    allowed = allowance[worst] / (tol.u * tol.scale[worst]) if tol.scale[worst] > 0 else 0.0
    index = tuple(int(t) for t in worst)
    return Mismatch(
        int(bad.sum()), index, float(units[worst]), float(allowed), float(a[worst]), float(b[worst])
    )


def agreement(what: str, mis: Mismatch | None, detail: str = "") -> Outcome:
    """The outcome of comparing two outputs: pass, or the worst disagreement."""
    if mis is None:
        return Outcome(True, f"{what}{detail}: agree within the bound")
    return Outcome(False, mis.describe(what + detail), {"units": mis.units, "allowed": mis.allowed})
