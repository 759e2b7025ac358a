"""Hypothesis as a counterexample search outside pytest: what the `check` command and the
mutant zoo use.

find_failure runs one check over every corner case of the regime, then over cases drawn by
strategies.cases, derandomised (the same cases every run), and returns the first failing
result, shrunk to a small case when asked.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from ..cases import Case
from ..regimes import REGIMES, regime_of
from ..results import CheckResult
from ..strategies import DTYPES, cases, corner_cases
from ..under_test import Implementation
from . import ALL_CHECKS
from .core import beyond_plan

PACKAGE = Path(__file__).resolve().parents[1]  # linattn_verify/, every module of which loads

# Cases searched per check after the regime's corners, one budget per use. Each is a
# runtime budget, not a tuned figure (README, "vet" and "The property suite" give the
# times); the corners carry the adversarial extremes, which random draws reach rarely.
# vet and check search each regime in turn, the mildest first (search_regimes)
VET_EXAMPLES = {"typical": 20, "stress": 10, "extreme": 5}  # vet's default plan (the zoo, CI)
# vet --grad's gradient checks: each case costs an exact gradient in mpmath (as
# GRADIENT_SHARE below for the property suite), a second to tens of seconds a check
VET_GRADIENT_EXAMPLES = {"typical": 10, "stress": 5, "extreme": 3}
THOROUGH_EXAMPLES = {"typical": 120, "stress": 60, "extreme": 20}  # vet --thorough
CHECK_EXAMPLES = {"typical": 30, "stress": 15, "extreme": 5}  # the check command
# pytest properties/, per test: a share of the loaded Hypothesis profile's examples (the
# suite runs every check over ~40 built-in implementations), at least a few
PROPERTY_SHARE, PROPERTY_LEAST = 5, 10  # forward checks (ci profile: 20)
GRADIENT_SHARE, GRADIENT_LEAST = 25, 4  # gradient checks: each example is an exact gradient


def property_examples(share: int = PROPERTY_SHARE, least: int = PROPERTY_LEAST) -> int:
    """Examples per property test: 1/share of the loaded Hypothesis profile's, >= least."""
    return max(least, settings.default.max_examples // share)


@functools.cache
def import_whole_package() -> None:
    """Import every module of linattn_verify, once. Hypothesis biases its draws with the
    literal constants of the local modules loaded (hypothesis.internal.constants_ast), so a
    search would depend on which of ours happened to be imported before it (a rate check
    run earlier loads the stats modules): with all of them loaded, the same search draws
    the same cases whatever ran before, in a test worker, a vet worker or the command line."""
    for module in pkgutil.walk_packages([str(PACKAGE)], "linattn_verify."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)


def find_failure(
    name: str,
    impl: Implementation,
    device: str = "cpu",
    max_examples: int = sum(VET_EXAMPLES.values()),
    nature: bool = False,
    shrink: bool = False,
    dtypes: tuple[str, ...] = DTYPES,
    extra_cases: Sequence[Case] = (),
    corners: bool = True,
    regimes: Collection[str] = REGIMES,
    pass_over: Callable[[CheckResult], bool] | None = None,
    **options: Any,
) -> CheckResult | None:
    """The first case of `regimes` on which check `name` fails for impl, or None: the
    corner cases (unless corners=False) and `extra_cases` first, then the search, all in
    `dtypes`. nature=False looks for real failures (the spec's own by-nature violations
    count as passes); nature=True for a by-nature counterexample. pass_over(result): a
    failure that another finding already stands for (vet/tasks.py, past a failed contract):
    the search goes on for a failure of the check's own."""
    import_whole_package()
    check = ALL_CHECKS[name]

    found = False  # the cases after the first failure (shrinking it) are beyond the plan

    def fails(case) -> bool:
        nonlocal found
        with beyond_plan() if found else contextlib.nullcontext():
            result = check(impl, case, **options)
        if pass_over is not None and not result.passed and pass_over(result):
            return False
        failed = not result.passed and bool(result.by_nature) == nature
        found = found or failed
        return failed

    def again(case) -> CheckResult:
        with beyond_plan():
            return check(impl, case, **options)

    fixed = corner_cases(impl.spec, dtypes, device, regimes) if corners else []
    extra = [c for c in extra_cases if regime_of(c, impl.spec) in regimes]
    for case in [*fixed, *extra]:  # every one
        if fails(case):
            return again(case)

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
        strategy = cases(impl.spec, dtypes, device=device, regimes=regimes)
        case = find(strategy, fails, settings=search)
    except NoSuchExample:
        return None
    return again(case)


def search_regimes(
    name: str,
    impl: Implementation,
    budgets: Mapping[str, int],
    device: str = "cpu",
    **search: Any,
) -> tuple[CheckResult | None, dict[str, int]]:
    """Check `name`'s first failure in the mildest regime that has one, searching each of
    `budgets` (regime -> cases searched) in turn from typical; with the cases searched per
    regime up to there (corner and extra cases not counted)."""
    searched: dict[str, int] = {}
    for regime in REGIMES:
        if regime not in budgets:
            continue
        searched[regime] = budgets[regime]
        found = find_failure(name, impl, device, budgets[regime], regimes=(regime,), **search)
        if found is not None:
            return found, searched
    return None, searched
