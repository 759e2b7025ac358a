"""The operating envelope: per dtype, the range of input magnitudes over which the
implementation holds its bound and budget, found by bisection over the magnitude sigma of
the typical draw from sigma = 1 outward, up to SPAN decades or the dtype's limits
(regimes.dtype_limits), whichever is nearer. It is a description, not a check: it never
fails vet. What sigma multiplies is the family's draw's (families case_arguments: q and k
for most, q alone for the delta rule's unit keys, never v, W, a decay, beta, a or b), and
each row says which (what_sigma_scales)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..cases import Case
from ..checks import CHECKS
from ..families import case_arguments, family_of
from ..regimes import dtype_limits
from ..results import CheckResult
from ..specs import Spec
from ..under_test import Implementation

SHAPE = (1, 2, 17, 8, 4)  # B, H, N, d, dv: d = 8, so elu rows keep a coordinate near 0
SEEDS = (1, 2)
SPAN = 4.0  # decades searched each way from sigma = 1: beyond, no model's inputs lie
STEPS = 8  # bisection steps at each end: to within SPAN / 256 decades


def what_sigma_scales(spec: Spec) -> str:
    """What sigma is for `spec`, in words ("the standard deviation of q's and k's
    coordinates; v not scaled"), read off the family's draws (case_arguments) of the
    envelope's case at sigma = 1 and 2: a tensor twice as large is scaled, one unchanged is
    not, and one otherwise changed depends on sigma another way."""
    b, h, n, d, dv = SHAPE
    m = d if spec.info.needs_projection else None
    one, two = (
        case_arguments(Case(b, h, n, d, dv, "float64", "normal", sigma, SEEDS[0], m), spec)
        for sigma in (1.0, 2.0)
    )
    names = [["q"], ["k"], ["v"], ["W"], list(family_of(spec).argument_names(spec))]
    scaled: list[str] = []
    fixed: list[str] = []
    other: list[str] = []
    for packed, at_one, at_two in zip(names, one, two, strict=True):
        if at_one is None:
            continue
        if torch.equal(at_two, at_one):
            fixed += packed
        elif torch.equal(at_two, 2 * at_one):
            scaled += packed
        else:
            other += packed
    coordinates = " and ".join(f"{name}'s" for name in scaled)
    parts = [f"the standard deviation of {coordinates} coordinates" if scaled else "no input"]
    if other:
        parts.append(f"{_listed(other)} drawn from it otherwise")
    if fixed:
        parts.append(f"{_listed(fixed)} not scaled")
    return "; ".join(parts)


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _first_failure(impl: Implementation, dtype: str, magnitude: float, device: str):
    """The reference check's first failure on the envelope's draws at `magnitude`, or None."""
    b, h, n, d, dv = SHAPE
    m = d if impl.spec.info.needs_projection else None
    for seed in SEEDS:
        case = Case(b, h, n, d, dv, dtype, "normal", magnitude, seed, m, device)
        result = CHECKS["reference"](impl, case)
        if not result.passed and not result.by_nature:
            return result
    return None


def _edge(impl, dtype: str, device: str, outer: float) -> tuple[float, Any]:
    """log10 of the magnitude, between 0 (where it holds) and `outer`, up to which it holds,
    and the failure just beyond (None if it holds at `outer`)."""
    failure = _first_failure(impl, dtype, 10.0**outer, device)
    if failure is None:
        return outer, None
    inside = 0.0
    for _ in range(STEPS):
        middle = (inside + outer) / 2
        found = _first_failure(impl, dtype, 10.0**middle, device)
        if found is None:
            inside = middle
        else:
            outer, failure = middle, found
    return inside, failure


def envelope(impl: Implementation, device: str, dtypes: tuple[str, ...]) -> list[dict]:
    """One row per dtype: the magnitudes over which impl holds (status "envelope")."""
    rows = []
    sigma = what_sigma_scales(impl.spec)
    for dtype in dtypes:
        low, high = (math.log10(t) for t in dtype_limits(dtype))
        low, high = max(low, -SPAN), min(high, SPAN)
        at_one = _first_failure(impl, dtype, 1.0, device)
        figures: dict[str, Any] = {"low": None, "high": None}
        if at_one is not None:
            detail = f"does not hold at sigma = 1 (sigma: {sigma}): {at_one.message}"
        else:
            top, above = _edge(impl, dtype, device, high)
            bottom, below = _edge(impl, dtype, device, low)
            figures = {"low": 10.0**bottom, "high": 10.0**top}
            detail = f"holds for {10.0**bottom:.2g} <= sigma <= {10.0**top:.2g} (sigma: {sigma})"
            for side, failure in (("above", above), ("below", below)):
                if failure is not None:  # its first clause: the error and where
                    detail += f"; {side}: {failure.message.split('; ')[0]}"
        row = CheckResult(f"envelope {dtype}", True, detail, figures=figures).to_dict()
        rows.append({**row, "status": "envelope", "sigma": sigma})
    return rows
