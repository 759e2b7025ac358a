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
from ..strategies import DTYPES, cases, corner_cases
from . import ALL_CHECKS, CHECKS, not_applicable
from .core import CheckResult, Implementation

# Cases searched per check after the regime's corners: a runtime budget (the zoo runs 33
# implementations through 11 checks in ~3 CPU-minutes), not a tuned figure; the corners
# carry the adversarial extremes, which random draws reach rarely.
SEARCH_EXAMPLES = 25


def find_failure(
    name: str,
    impl: Implementation,
    device: str = "cpu",
    max_examples: int = SEARCH_EXAMPLES,
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


def run_suite(
    impl: Implementation, device: str = "cpu", max_examples: int = SEARCH_EXAMPLES
) -> dict[str, CheckResult | None]:
    """Every applicable check: its first real failure, or None where none was found."""
    return {
        name: find_failure(name, impl, device, max_examples)
        for name in CHECKS
        if not not_applicable(name, impl)
    }
