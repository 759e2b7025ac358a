"""Hypothesis as a counterexample search outside pytest: what the `check` command and the
mutant zoo use.

find_failure runs one check over every corner case of the regime, then over cases drawn by
strategies.cases, derandomised (the same cases every run), and returns the first failing
result, shrunk to a small case when asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from ..cases import Case
from ..results import CheckResult
from ..strategies import DTYPES, cases, corner_cases
from ..under_test import Implementation
from . import ALL_CHECKS

# Cases searched per check after the regime's corners, one budget per use. Each is a
# runtime budget, not a tuned figure (README, "vet" and "The property suite" give the
# times); the corners carry the adversarial extremes, which random draws reach rarely.
VET_EXAMPLES = 25  # vet's default plan, for every check of every zoo entry in CI
THOROUGH_EXAMPLES = 200  # vet --thorough
CHECK_EXAMPLES = 50  # the check command's search for one check
# pytest properties/, per test: a share of the loaded Hypothesis profile's examples (the
# suite runs every check over ~40 built-in implementations), at least a few
PROPERTY_SHARE, PROPERTY_LEAST = 5, 10  # forward checks (ci profile: 20)
GRADIENT_SHARE, GRADIENT_LEAST = 25, 4  # gradient checks: each example is an exact gradient


def property_examples(share: int = PROPERTY_SHARE, least: int = PROPERTY_LEAST) -> int:
    """Examples per property test: 1/share of the loaded Hypothesis profile's, >= least."""
    return max(least, settings.default.max_examples // share)


def find_failure(
    name: str,
    impl: Implementation,
    device: str = "cpu",
    max_examples: int = VET_EXAMPLES,
    nature: bool = False,
    shrink: bool = False,
    dtypes: tuple[str, ...] = DTYPES,
    extra_cases: Sequence[Case] = (),
    corners: bool = True,
    **options: Any,
) -> CheckResult | None:
    """The first case on which check `name` fails for impl, or None: the regime's corners
    (unless corners=False) and `extra_cases` first, then the search, all in `dtypes`.
    nature=False looks for real failures (the spec's own by-nature violations count as
    passes); nature=True for a by-nature counterexample."""
    check = ALL_CHECKS[name]

    def fails(case) -> bool:
        result = check(impl, case, **options)
        return not result.passed and bool(result.by_nature) == nature

    fixed = corner_cases(impl.spec, dtypes, device) if corners else []
    for case in [*fixed, *extra_cases]:  # every one
        if fails(case):
            return check(impl, case, **options)

    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    search = settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        phases=phases,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    try:
        case = find(cases(impl.spec, dtypes, device=device), fails, settings=search)
    except NoSuchExample:
        return None
    return check(impl, case, **options)
