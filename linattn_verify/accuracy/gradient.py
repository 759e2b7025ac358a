"""Judging gradients against the exact reference gradients: errors in units of u s, an
a-priori bound, a budget (docs/accuracy.md, applied to the backward pass).

For the loss L = sum(out * g), each exact gradient element comes with its magnitude M
(reference/grad.py): the sum of the absolute values of everything it is computed from,
propagated through the chain rule to first order, so it grows with every cancellation
(in dL/da_ij = g_i . (v_j - out_i) / D_i above all). M is the scale s of a gradient
element, as s_ic is for an output element.

- bound: any evaluation in precision u whose every operation obeys the standard model
  (Higham, "Accuracy and Stability of Numerical Algorithms", sec. 2.2; no underflow or
  overflow, elementary functions within C_LIB units) errs by at most n u M to first order
  (the first-order form of Lemma 3.1 for a chain of n roundings applied to M), n the
  roundings on the longest path (reference/grad.py `roundings`): gamma_n / u units of u M,
  infinite where n u >= 1 (then only the budget judges). M is floored at the dtype's
  smallest subnormal over u (`effective_scale`): a result that small is rounded on the
  subnormal grid, whatever its own magnitude (M may even underflow float64).
- budget, per tensor (dq, dk, dv, and dg of a gates spec's log-gates: gradient_names):
  K_BUDGET times the largest error of the golden forms' backward (autograd through
  implementations/golden.py, wide accumulation) on the same inputs and loss (the gradient
  checks add its evaluations on exact splits of the cotangent, checks/gradients.py
  golden_samples: the same careful evaluation with other rounding luck), and at least
  K_BUDGET times the error of rounding that exact tensor once (max |g| / M, the
  `rounding_floor`) the typical number of times a correct evaluation of its n roundings
  does (verdict.typical_roundings, sqrt(n) by Higham & Mary 2019): the rule for outputs,
  whose floor BUDGET_FLOOR is that rounding with |out| <= s. Here M can exceed |g| by
  orders of magnitude, and by different orders for dq, dk and dv (the Performer maps:
  exponents with large arguments, trig's cancelling features): one budget for all three,
  or a floor of 1 unit of u M, would admit errors in dq and dk thousands of times the
  golden ones. Where a family's backward ends in a difference of terms that agree to
  rounding (Family.cancelled_terms: the delta rule's qk_l2norm projection, dx = (dxh - xh
  (xh . dxh)) / r, families/delta/gradient_bound.py), one rounding of the exact result is
  no floor: every evaluation errs by the rounding of the terms, and the golden form's error
  there is luck. The floor is then at least the typical error of the c roundings of those
  terms in the golden's compute precision, sum_roundings(c, u) A / M (A their size per
  element; `cancellation_floor`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..families import family_of
from ..inputs import SMALLEST_SUBNORMAL
from ..reference.grad import NAMES as NAMES  # re-exported: q, k, v; per spec, gradient_names
from ..rounding import gamma
from ..specs import Spec
from .verdict import BUDGET_FLOOR, K_BUDGET, error_units, sum_roundings, typical_roundings


def gradient_names(spec: Spec) -> tuple[str, ...]:
    """The inputs the loss is differentiated in: q, k, v and the per-token arguments of the
    spec's family (Family.argument_names: a gates spec's log-gates g, the delta rule's beta
    and g); gamma, W and the cotangent are held fixed."""
    family = family_of(spec)
    return NAMES + family.argument_names(spec) * family.per_token(spec)


@dataclass(frozen=True)
class GradientVerdict:
    """The figures of one gradient judgement, per tensor (q, k, v, and g for a gates spec:
    reference.grad.gradient_names): the largest error in units of u M, the golden forms'
    largest error, the rounding floor and the budget."""

    dtype: str
    bound: float  # units of u M (inf: vacuous)
    max_error: dict[str, float]
    golden_max_error: dict[str, float] | None
    # the exact gradient rounded typical_roundings times, u M (or the cancelled terms')
    rounding_floor: dict[str, float]
    budget: dict[str, float] | None
    violations: int  # elements above the bound, or non-finite where the exact one is finite
    worst: tuple[str, tuple[int, ...]]
    rounded_to_inf: int = (
        0  # infinite where the exact value is beyond (or within the budget of) the range
    )
    cancelled: tuple[str, ...] = ()  # the tensors whose floor holds cancelled terms

    @property
    def over_budget(self) -> list[str]:
        """The tensors whose largest error exceeds their budget."""
        if self.budget is None:
            return []
        return [n for n in self.max_error if not self.max_error[n] <= self.budget[n]]

    @property
    def passed(self) -> bool:
        return self.violations == 0 and not self.over_budget

    @property
    def message(self) -> str:
        """The verdict in words: the tensors with a non-finite element (where the exact
        gradient fits the dtype) by name, the others' largest errors, the bound, the budget."""
        name, at = self.worst
        broken = [f"d{n}" for n, e in self.max_error.items() if not math.isfinite(e)]
        errors = ", ".join(f"d{n} {e:.3g}" for n, e in self.max_error.items() if math.isfinite(e))
        parts = [f"{', '.join(broken)} not finite where the exact gradient is"] if broken else []
        if errors:
            parts.append(f"gradient errors (units of u M) {errors}")
        parts[-1] += f"; worst at d{name}{list(at)}"
        parts.append(
            "the bound is vacuous (n u >= 1): only the budget judges"
            if self.bound == float("inf")
            else f"bound {self.bound:.3g}"
        )
        if self.violations:
            parts.append(f"{self.violations} element(s) above the bound or non-finite")
        if self.rounded_to_inf:
            parts.append(
                f"{self.rounded_to_inf} element(s) infinite where the exact value is beyond the "
                "dtype's range or within the budget of it (taken as its rounding)"
            )
        if self.budget is not None:
            budgets = ", ".join(f"d{n} {b:.3g}" for n, b in self.budget.items())
            over = ", ".join(f"d{n}" for n in self.over_budget)
            cancelled = ", ".join(f"d{n}" for n in self.cancelled)
            terms = f"; {cancelled}: or of the terms they cancel" * bool(cancelled)
            parts.append(
                f"budget {budgets} ({K_BUDGET:g} x the golden error or one rounding{terms})"
                + (f" EXCEEDED by {over}" if over else "")
            )
        return "; ".join(parts) + (" -> pass" if self.passed else " -> FAIL")


def gradient_bound(roundings: int, u: float) -> float:
    """The a-priori bound in units of u M: gamma_n / u (inf where n u >= 1)."""
    return gamma(roundings, u) / u


def effective_scale(magnitude: np.ndarray, dtype: str, u: float) -> np.ndarray:
    """M, at least the dtype's smallest subnormal over u (NaN stays NaN)."""
    floored = np.fmax(magnitude, SMALLEST_SUBNORMAL[dtype] / u)
    return np.where(np.isnan(magnitude), np.nan, floored)


def allowance(magnitude: np.ndarray, dtype: str, u: float, roundings: int) -> np.ndarray:
    """|error| allowed by the bound per element: gamma_n M (inf where n u >= 1)."""
    bound = gradient_bound(roundings, u)
    return bound * u * effective_scale(magnitude, dtype, u)


def rounding_floor(exact: np.ndarray, scale: np.ndarray, dtype: str, u: float) -> float:
    """The error of one correct rounding of an exact gradient tensor, in units of u M: its
    largest |g| / M (BUDGET_FLOOR where it is 0 everywhere: no scale to go by)."""
    ratio = np.nanmax(np.abs(exact) / effective_scale(scale, dtype, u), initial=0.0)
    return float(ratio) or BUDGET_FLOOR


def cancellation_floor(
    cancelled: tuple[int, np.ndarray], scale: np.ndarray, dtype: str, u: float
) -> float:
    """The typical error, in units of u M, of c roundings in the golden's compute precision
    of terms of size A per element that a correct evaluation cancels (cancelled = (c, A)):
    the largest sum_roundings(c, u) A / M (Higham & Mary 2019, as verdict.sum_roundings)."""
    c, sizes = cancelled
    ratio = np.nanmax(sizes / effective_scale(scale, dtype, u), initial=0.0)
    return float(sum_roundings(c, u) * ratio)


def judge_gradients(
    grads: Mapping[str, np.ndarray],
    exact: Mapping[str, np.ndarray],
    scale: Mapping[str, np.ndarray],
    dtype: str,
    u: float,
    roundings: int,
    golden: Sequence[Mapping[str, np.ndarray]] = (),
    cancelled: Mapping[str, tuple[int, np.ndarray]] | None = None,
) -> GradientVerdict:
    """Judge float64 copies of an implementation's gradients (dtype `dtype`, unit roundoff
    u) against the exact ones and their magnitudes M: every tensor `exact` has (dq, dk,
    dv, and dg for a gates spec: gradient_names). cancelled: per tensor, (c, A) of the
    terms its last step cancels (Family.cancelled_terms), whose cancellation_floor the
    floor is at least."""
    names = tuple(exact)
    bound = gradient_bound(roundings, u)
    top = float(torch.finfo(getattr(torch, dtype)).max)

    def errors_of(g: Mapping[str, np.ndarray], allowed=None) -> tuple[dict, int]:
        """(error units per tensor, the infinities exempted): 0 where the exact value is
        undefined (NaN: a 0/0 row) and where g has the infinity of its sign and the exact
        value is beyond the dtype's range (its rounding: unnormalised gradients grow with
        the inputs' squares), or within `allowed` units of u M of it (an error the budget
        allows takes it there)."""
        reach = {n: 0.0 if allowed is None else allowed[n] * u for n in names}
        units, exempt, infinite = {}, {}, 0
        for n in names:
            m = effective_scale(scale[n], dtype, u)
            units[n] = error_units(g[n], exact[n], m, u)
            with np.errstate(invalid="ignore", over="ignore"):
                beyond = np.abs(exact[n]) + reach[n] * m > top
                rounded = beyond & (g[n] == exact[n] * np.inf)
            exempt[n] = np.isnan(exact[n]) | rounded
            infinite += int(rounded.sum())
        return {n: np.where(exempt[n], 0.0, units[n]) for n in names}, infinite

    typical = typical_roundings(roundings, u)
    floor = {n: rounding_floor(exact[n], scale[n], dtype, u) * typical for n in names}
    cancelled = {n: terms for n, terms in (cancelled or {}).items() if n in floor}
    for n, terms in cancelled.items():
        floor[n] = max(floor[n], cancellation_floor(terms, scale[n], dtype, u))
    golden_max = budget = None
    if golden:
        golden_errors = [errors_of(g)[0] for g in golden]
        golden_max = {
            n: max(
                float(np.max(np.where(np.isfinite(e[n]), e[n], 0.0), initial=0.0))
                for e in golden_errors
            )
            for n in names
        }
        budget = {n: K_BUDGET * max(golden_max[n], floor[n]) for n in names}
    errors, rounded_to_inf = errors_of(grads, budget)
    violations = 0
    for n in names:
        finite_exact = np.isfinite(exact[n]) & (np.abs(exact[n]) <= top)  # fits the dtype
        with np.errstate(invalid="ignore"):
            diff = np.abs(grads[n] - exact[n])
            above = finite_exact & ~(diff <= allowance(scale[n], dtype, u, roundings))
        violations += int(above.sum())
    worst_name = max(names, key=lambda n: errors[n].max(initial=0.0))
    worst_at = np.unravel_index(int(np.argmax(errors[worst_name])), errors[worst_name].shape)
    return GradientVerdict(
        dtype=dtype,
        bound=bound,
        max_error={n: float(errors[n].max(initial=0.0)) for n in names},
        golden_max_error=golden_max,
        rounding_floor=floor,
        budget=budget,
        violations=violations,
        worst=(worst_name, tuple(int(t) for t in worst_at)),
        rounded_to_inf=rounded_to_inf,
        cancelled=tuple(cancelled),
    )
