"""Judging one output against the exact reference: error units, bound, budget, verdict.

Error of element (i, c) in roundoff units (docs/accuracy.md):
    e_ic = |out_ic - ref_ic| / (u s_ic),
u the unit roundoff of the implementation's dtype, s_ic the scale of bound.scale_and_bound.
Two thresholds:
- bound: the a-priori bound of bound.scale_and_bound, element by element; exceeding it is
  a bug whatever the cause;
- budget: K_BUDGET times what a careful implementation attains on the same inputs: the
  largest error of the golden implementation's forms, and at least what any correct one
  typically makes whatever its luck (`attainable_floor`); exceeding it means "less
  accurate than attainable".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..families import family_of
from ..inputs import (
    SMALLEST_SUBNORMAL,
    UNIT_ROUNDOFF,
    AttentionInputs,
    dtype_name,
    unit_roundoff,
)
from ..specs import Spec, SpecError
from .bound import scale_and_bound

# Two correct summation orders in the same precision differ in their rounding errors by a
# small factor (the worst-case bounds differ by the ratio of their gamma_n, a few for the
# orders in use: sequential, pairwise, blocked); 4 admits any of them and still rejects a
# kernel that keeps its state one precision lower (16x or more in these units).
K_BUDGET = 4.0
# an infinite bound, in words (bound.py: gamma_n is infinite once n u >= 1, and so is a
# bound whose denominator's possible error reaches the denominator)
VACUOUS = "vacuous (n u >= 1, or the denominator within its error of 0)"
# An output rounded to its dtype is already 0.5 units off; a budget below 1 unit would judge
# the final rounding, not the algorithm.
BUDGET_FLOOR = 1.0


def typical_roundings(n: int, u: float) -> float:
    """How many roundings of the result's own size a correct evaluation of n roundings
    typically makes, at least one (the result's own): sum_roundings(n, u)."""
    return max(1.0, sum_roundings(n, u))


def sum_roundings(n: int, u: float) -> float:
    """sqrt(n) u_c / u: the typical error of n roundings in units of u, u_c the precision
    the golden forms compute in (float32 for half precision, whose output is then rounded
    once). Higham & Mary 2019 ("A new approach to probabilistic rounding error analysis",
    SISC 41(5), Thm. 3.1): with independent mean-zero rounding errors the error of n
    roundings is within lambda sqrt(n) u_c with probability >= 1 - 2 exp(-lambda^2 / 2);
    lambda = 1 is its typical scale, below which a single lucky evaluation can fall far
    (identical keys summed 31 times: 1.2 units for one rounding of their feature, 8.3 for
    the next)."""
    u_compute = UNIT_ROUNDOFF["float64" if u <= UNIT_ROUNDOFF["float64"] else "float32"]
    return math.sqrt(n) * u_compute / u


def attainable_floor(spec: Spec, x: AttentionInputs, u: float) -> float:
    """The least error (units of u s) the budget takes as attainable, however the golden
    forms' roundings fell: BUDGET_FLOOR times max(1, sums_floor), one rounding of the
    output or its sums' typical error."""
    return BUDGET_FLOOR * max(1.0, sums_floor(spec, x, u))


def sums_floor(spec: Spec, x: AttentionInputs, u: float) -> float:
    """The typical error (units of u s) of a correct evaluation's sums, before the output's
    rounding: sum_roundings of the longest sum, n = m + Nk + 1 terms (m features,
    Family.sums_bound.features, Nk keys, eps; a family's own count where it has one:
    Family.sum_length); with a decay at least the error of its chunked evaluation
    (decay_floor)."""
    nk, d = x.k.shape[2:]
    rows = None if x.projection is None else x.projection.shape[0]
    family = family_of(spec)
    n = family.sum_length(nk, d, family.sums_bound.features(spec, d, rows))
    return max(sum_roundings(n, u), decay_floor(spec, x, u))


def amplification(
    x: AttentionInputs, spec: Spec, ref: np.ndarray, scale: np.ndarray
) -> np.ndarray | float:
    """max(1, kappa_i |ref_ic| / s_ic): how many times a correct evaluation's typical error
    at element (i, c) exceeds the numerator's share of it. out = N / D errs by (dN - out
    dD) / D; sums of n terms typically err by sqrt(n) u_c times their |terms| (Higham &
    Mary 2019), dN by s |D| and dD by kappa |D| (Family.sums_bound.condition), so out errs
    by sqrt(n) u_c (s + kappa |out|): kappa |out| / s times more where the denominator's
    terms cancel (signed features: identity, performer-trig, taylor). 1 (a float) where
    they cannot (kappa None: non-negative features, softmax) or there is no denominator."""
    kappa = family_of(spec).sums_bound.condition(x, spec)
    if kappa is None:
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        times = kappa * np.abs(ref) / scale
    return np.maximum(1.0, np.nan_to_num(times, nan=1.0, posinf=np.inf))


def element_budgets(
    x: AttentionInputs, spec: Spec, ref: np.ndarray, scale: np.ndarray, u: float, budget: float
) -> np.ndarray:
    """Each element's budget (units of u s, ref's shape): `budget`, or where the
    denominator's terms cancel K_BUDGET times its sums' typical error amplified there
    (sums_floor times amplification: the output's own rounding is not amplified)."""
    times = amplification(x, spec, ref, scale) * sums_floor(spec, x, u)
    return np.broadcast_to(np.maximum(budget, K_BUDGET * times), ref.shape)


def decay_floor(spec: Spec, x: AttentionInputs, u: float) -> float:
    """A chunked kernel (Yang et al. 2024, sec. 3.2) forms ln w_ij from prefix sums of the
    log-gates within a chunk of DECAY_CHUNK tokens, in its compute precision u_c: an error
    of u_c times the sums' size, |G| <= the largest sum of |ln w_t| over DECAY_CHUNK
    consecutive tokens (the largest channel's for channel gates), relative to each weight
    (units of u: |G| u_c / u); 0 without a decay (Family.widest_gate_sum)."""
    widest = family_of(spec).widest_gate_sum(spec, x)
    u_compute = UNIT_ROUNDOFF["float64" if u <= UNIT_ROUNDOFF["float64"] else "float32"]
    return widest * u_compute / u


def beyond_range(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Where the exact value is beyond the dtype's largest finite value."""
    return np.abs(ref) > float(torch.finfo(getattr(torch, dtype)).max)


def rounded_to_inf(out: np.ndarray, ref: np.ndarray, dtype: str) -> np.ndarray:
    """Where an exact value beyond the dtype's range was rounded to the infinity of its
    sign, as correct rounding may: no error there."""
    return beyond_range(ref, dtype) & np.isinf(out) & (np.sign(out) == np.sign(ref))


def error_units(out: np.ndarray, ref: np.ndarray, scale: np.ndarray, u: float) -> np.ndarray:
    """e = |out - ref| / (u s); 0 where both are equal (s = 0 included), inf where out is NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = np.abs(out - ref)
        e = np.where(diff == 0, 0.0, diff / (u * scale))
    return np.where(np.isnan(out) & ~np.isnan(ref), np.inf, e)


# an error of at least this share of the output's scale is wrong whatever the bound says
WRONG_SHARE = 1.0


@dataclass(frozen=True)
class AccuracyVerdict:
    """The figures of one accuracy judgement and their reading."""

    spec: str
    dtype: str
    unit_roundoff: float
    max_error: float  # units of u s
    p99_error: float
    worst_index: tuple[int, ...]
    bound_at_worst: float
    bound_violations: int  # elements above their bound
    undefined: int  # elements whose exact value is 0/0 (the output must be NaN there)
    golden_max_error: float | None
    budget: float | None
    within_bound: bool
    within_budget: bool | None
    # the element that fails worst: a number where the exact value is 0/0 first, then the
    # largest error among those above their bound or non-finite (None when none is)
    failing_index: tuple[int, ...] | None = None
    not_nan: int = 0  # of bound_violations: a number where the exact value is 0/0
    non_finite: int = 0  # of bound_violations: not finite where the exact value fits the dtype
    failing_output: float | None = None  # the output and exact value at failing_index
    failing_exact: float | None = None
    # the budget at worst_index (None where the budget does not compare it): `budget`, or
    # more where the denominator's terms cancel (amplification); (index, error, budget
    # there) of the element furthest over its own
    budget_at_worst: float | None = None
    over_budget: tuple[tuple[int, ...], float, float] | None = None
    # attainable_floor (units of u s): the budget is K_BUDGET times the larger of it and
    # golden_max_error, so where it is the larger the floor, not the golden, sets the budget
    budget_floor: float | None = None

    @property
    def passed(self) -> bool:
        return self.within_bound and self.within_budget is not False

    @property
    def severity(self) -> str:
        """How much a failure matters (results.SEVERITIES): wrong outside the bound, or
        with an error of at least the output's own scale (a loose bound does not make an
        output that far off merely inaccurate), else inaccurate: within the bound and over
        the budget."""
        wrong = not self.within_bound or self.relative_error >= WRONG_SHARE
        return "wrong" if wrong else "inaccurate"

    @property
    def relative_error(self) -> float:
        """The largest error as a share of the output's scale s (max_error u)."""
        return self.max_error * self.unit_roundoff

    @property
    def message(self) -> str:
        """The verdict in words: what is not finite or not NaN first (its figures are not
        errors in units), then the largest error, the bound there and the budget."""
        parts = []
        at = self.failing_index
        if self.not_nan:
            parts.append(
                f"{self.not_nan} element(s) not NaN where the exact value is 0/0, e.g. "
                f"{self.failing_output:.6g} at {at}"
            )
        if self.non_finite:
            example = f", e.g. {self.failing_output:.6g} at {at} (exact {self.failing_exact:.6g})"
            parts.append(
                f"{self.non_finite} element(s) not finite where the exact value is finite"
                + ("" if self.not_nan else example)
            )
            if not math.isfinite(self.max_error) and self.bound_at_worst == float("inf"):
                parts.append(f"the bound is {VACUOUS} there, and wrong all the same")
        if math.isfinite(self.max_error):
            rel = percent(self.relative_error)
            p99 = f" (p99 {self.p99_error:.3g} u s)" if math.isfinite(self.p99_error) else ""
            bound = f"{self.bound_at_worst:.3g}"
            if self.bound_at_worst == float("inf"):
                bound = VACUOUS
            where = "elsewhere " if parts else ""
            parts.append(
                f"{where}max error {self.max_error:.3g} u s = {rel} of the output's scale{p99} "
                f"at {self.worst_index}, bound there {bound}"
            )
        elif not self.non_finite:  # an infinite error on an element whose exact value overflows
            parts.append(f"an infinite error at {self.worst_index}")
        above = self.bound_violations - self.not_nan - self.non_finite
        if above:
            parts.append(f"{above} element(s) above the a-priori bound")
        if self.budget is not None:
            parts.append(
                f"budget {self.budget:.3g} = {self._budget_terms}"
                + self._raised
                + ("" if self.over_budget is None else self._exceeded)
            )
        if self.undefined and not self.not_nan:
            parts.append(f"{self.undefined} element(s) of exact value 0/0, NaN as they must be")
        head = f"{self.spec} {self.dtype}: "
        return head + "; ".join(parts) + (" -> pass" if self.passed else " -> FAIL")

    @property
    def _budget_terms(self) -> str:
        """K_BUDGET times what sets the budget: the golden's largest error, or the floor
        where that is larger (then the golden's product, which does not add up to the
        budget, beside it)."""
        golden = f"{K_BUDGET:g} x golden {self.golden_max_error:.3g}"
        if self.budget_floor is None or self.budget_floor <= self.golden_max_error:
            return golden
        return (
            f"{K_BUDGET:g} x the floor {self.budget_floor:.3g} (the floor sets it: "
            f"{golden} = {K_BUDGET * self.golden_max_error:.3g})"
        )

    @property
    def _raised(self) -> str:
        """The budget at the worst element where it is raised (its denominator cancels)."""
        if self.budget_at_worst is None or self.budget_at_worst <= self.budget:
            return ""
        return f", {self.budget_at_worst:.3g} at the worst element (its denominator cancels)"

    @property
    def _exceeded(self) -> str:
        at, error, allowed = self.over_budget
        if at == self.worst_index:
            return " EXCEEDED"
        return f" EXCEEDED at {at}: error {error:.3g} u s against {allowed:.3g} there"

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "relative_error": self.relative_error,
            "passed": self.passed,
            "message": self.message,
        }


def percent(share: float) -> str:
    """A share as a percentage of two significant digits ("4.7 %", "3e-05 %"), or
    "non-finite"."""
    return f"{100 * share:.2g} %" if math.isfinite(share) else "non-finite"


def bound_of(
    x: AttentionInputs,
    spec: Spec,
    ref: np.ndarray,
    dtype: str,
    bounds: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound) for outputs of `dtype` (bound.scale_and_bound at its unit roundoff and
    smallest subnormal), taken from and kept in `bounds` when given (judge's cache)."""
    if bounds is not None and dtype in bounds:
        return bounds[dtype]
    found = scale_and_bound(x, spec, ref, unit_roundoff(dtype, spec), SMALLEST_SUBNORMAL[dtype])
    if bounds is not None:
        bounds[dtype] = found
    return found


def judge(
    out: Any,
    x: AttentionInputs,
    spec: Spec,
    ref: np.ndarray,
    golden: Any = None,
    bounds: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    resolvable: np.ndarray | None = None,
) -> AccuracyVerdict:
    """Judge `out` (same shape as ref, any float dtype) against the exact `ref`.

    The unit roundoff is that of out's dtype (TF32's for float32 under a spec with TF32
    products, inputs.unit_roundoff). golden, if given, is the golden
    implementation's output in the same dtype, or a list of them (its forms): the budget
    is K_BUDGET times the largest of their errors, so any form as accurate as one of the
    careful ones is within budget (the feature expansion of taylor is inherently less
    accurate than 1 + s + s^2/2, and both are legitimate). bounds, if given, caches the
    scale and bound per dtype for outputs judged on the same (x, spec, ref): the bound is
    the costly part, and every form of a spec shares it. resolvable, if given, marks the
    elements the budget compares (broadcast to out's shape): rows so ill-conditioned that
    correct evaluations differ by chance beyond K_BUDGET are left to the bound.
    """
    dtype = dtype_name(out)
    if dtype not in UNIT_ROUNDOFF:
        raise SpecError(f"output dtype {dtype} has no unit roundoff; expected a float dtype")
    u = unit_roundoff(dtype, spec)
    out64 = _output(out, ref.shape, "output")
    scale, bound = bound_of(x, spec, ref, dtype, bounds)
    defined = ~np.isnan(ref)
    overflow = beyond_range(ref, dtype)
    counted = defined & ~rounded_to_inf(out64, ref, dtype)
    e = np.where(counted, error_units(out64, ref, scale, u), 0.0)
    worst = np.unravel_index(int(np.argmax(e)), e.shape)
    golden_max = budget = within_budget = over_budget = budget_at_worst = floor = None
    if golden is not None:
        budgeted = defined if resolvable is None else defined & resolvable
        goldens = golden if isinstance(golden, list | tuple) else [golden]
        golden_max = max(_largest_finite_error(g, ref, scale, u, budgeted) for g in goldens)
        floor = attainable_floor(spec, x, u)
        budget = K_BUDGET * max(golden_max, floor)
        allowed = element_budgets(x, spec, ref, scale, u, budget)
        excess = np.where(budgeted & (e > allowed), e / allowed, 0.0)
        within_budget = not excess.any()
        budget_at_worst = float(allowed[worst]) if budgeted[worst] else None
        if not within_budget:
            at = np.unravel_index(int(np.argmax(excess)), e.shape)
            over_budget = (tuple(int(t) for t in at), float(e[at]), float(allowed[at]))
    # A non-finite output where the exact value fits the dtype is wrong even where the
    # bound is vacuous; where the exact value is 0/0 the output must be NaN (docs/accuracy.md).
    non_finite = defined & ~np.isfinite(out64) & ~overflow
    not_nan = ~defined & ~np.isnan(out64)
    bad = (defined & (e > bound)) | non_finite | not_nan
    violations = int(np.sum(bad))
    failing = failing_output = failing_exact = None
    if violations:
        rank = np.where(bad, np.where(defined, e, np.inf), -1.0)
        failing = tuple(int(t) for t in np.unravel_index(int(np.argmax(rank)), e.shape))
        failing_output, failing_exact = float(out64[failing]), float(ref[failing])
    return AccuracyVerdict(
        spec=str(spec),
        dtype=dtype,
        unit_roundoff=u,
        max_error=float(e.max()),
        p99_error=float(np.quantile(e[defined], 0.99, method="higher")) if defined.any() else 0.0,
        worst_index=tuple(int(t) for t in worst),
        bound_at_worst=float(bound[worst]),
        bound_violations=violations,
        undefined=int(np.sum(~defined)),
        golden_max_error=golden_max,
        budget=budget,
        within_bound=violations == 0,
        within_budget=within_budget,
        failing_index=failing,
        not_nan=int(np.sum(not_nan)),
        non_finite=int(np.sum(non_finite)),
        failing_output=failing_output,
        failing_exact=failing_exact,
        budget_at_worst=budget_at_worst,
        over_budget=over_budget,
        budget_floor=floor,
    )


def _largest_finite_error(golden: Any, ref, scale, u: float, defined) -> float:
    """The golden output's largest error over its finite elements: a golden form that fails
    on some input must not make the budget infinite."""
    g = _output(golden, ref.shape, "golden")
    errors = error_units(g, ref, scale, u)[defined & np.isfinite(g)]
    return float(errors.max()) if errors.size else 0.0


def _output(out: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
    """out as float64, NaN/Inf kept (they are errors to judge, not input errors)."""
    if type(out).__module__.startswith("torch"):
        arr = out.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        arr = np.asarray(out, dtype=np.float64)
    if arr.shape != tuple(shape):
        raise SpecError(f"{what} has shape {arr.shape}, expected {tuple(shape)}")
    return arr
