"""The thin layer between Hypothesis and the checks: draw a case, run a check, explain a
failure (the check's message, the case, and the command that reproduces it)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, event, settings, target
from hypothesis import strategies as st

from linattn_verify.accuracy.bound import feature_model
from linattn_verify.checks import ALL_CHECKS
from linattn_verify.checks.search import property_examples
from linattn_verify.regimes import REGIMES
from linattn_verify.results import CheckResult
from linattn_verify.strategies import cases
from linattn_verify.under_test import Implementation

# what the cases are drawn from and the bound's feature model (conftest.py sets them from
# --fail-on and --strict-accuracy)
DRAWN: dict[str, Any] = {"regimes": REGIMES, "features": "standard"}
PROPERTY = settings(
    max_examples=property_examples(),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run_check(
    name: str, impl: Implementation, device: str, data: st.DataObject, **options: Any
) -> CheckResult:
    """Draw a case for impl's spec and run check `name` on it; steer toward large errors.
    An option given as a callable is called with (impl, case) for its value."""
    case = data.draw(cases(impl.spec, device=device, regimes=DRAWN["regimes"]), label="case")
    options = {k: o(impl, case) if callable(o) else o for k, o in options.items()}
    with feature_model(DRAWN["features"]):
        result = ALL_CHECKS[name](impl, case, **options)
    event(f"kind={case.kind} dtype={case.dtype}")
    for key in ("max_error", "units"):
        value = result.figures.get(key)
        if value is not None and math.isfinite(value):
            target(value, label=f"{name} {key}")
    return result


def assert_passes(result: CheckResult) -> None:
    assert result.passed, result.report()
