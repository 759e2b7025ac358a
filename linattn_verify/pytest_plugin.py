"""pytest plugin (entry point pytest11): the options that name an implementation under test
and what it claims, vet's (linattn_verify.run_options), for this project's property suite and
for anyone's tests.

    pytest --impl mykernels.py:attn --feature-map elu --causal [--eps E] [--layout bnhd]
    pytest --impl fla.based-naive          # an adapter: its spec is its claim
    pytest --form chunked --chunk-size 16 --feature-map elu --causal   # one built-in form

`implementation_under_test(config)` is the Implementation they name (None without --impl)
and `run_values(config)` the values of --grad and --long, both resolved once at configure
time, so that a bad option is a one-line usage error before any test runs; the
`attention_under_test` fixture skips when no --impl is given.
"""

from __future__ import annotations

from typing import Any

import pytest

from .grammar import checked
from .regimes import REGIMES
from .run_options import OPTIONS, RUN
from .specs import SpecError
from .under_test import Implementation, from_options
from .under_test.claim import SOURCE


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("linattn-verify")
    group.addoption(
        "--impl",
        help="the implementation under test: MODULE:FN, path.py:FN or an adapter's name "
        "(python -m linattn_verify vet --list); or a built-in --form",
    )
    for option in (*SOURCE, *OPTIONS):
        group.addoption(option.flag, **option.arguments())
    group.addoption(
        "--fail-on",
        choices=REGIMES,
        help="the regimes whose cases the properties draw, up to this one (default: typical "
        "for --impl, every regime for the built-in forms)",
    )
    group.addoption(
        "--strict-accuracy",
        action="store_true",
        help="every regime, elu features held to relative accuracy (as vet --strict)",
    )


def drawn_regimes(config: pytest.Config) -> tuple[str, ...]:
    """The regimes the property suite draws from: --fail-on's and the milder ones; every
    regime with --strict-accuracy or without an implementation under test."""
    fail_on = config.getoption("--fail-on")
    if config.getoption("--strict-accuracy") or (fail_on is None and not _named(config)):
        return REGIMES
    return REGIMES[: REGIMES.index(fail_on or "typical") + 1]


def _named(config: pytest.Config) -> bool:
    return config.getoption("--impl") is not None or config.getoption("--form") is not None


_UNDER_TEST = pytest.StashKey[Implementation | None]()
_VALUES = pytest.StashKey[dict[str, Any]]()


@pytest.hookimpl(tryfirst=True)  # before the conftest hooks that ask for it
def pytest_configure(config: pytest.Config) -> None:
    """Resolve the options and the implementation now: pytest.UsageError (one line, exit 4)
    names a bad option before any test runs."""
    given = {o.name: config.getoption(o.name) for o in (*SOURCE, *OPTIONS)}
    try:
        config.stash[_VALUES] = checked(RUN, given, from_text=True)
        named = from_options(config.getoption("--impl"), given) if _named(config) else None
    except SpecError as err:
        raise pytest.UsageError(str(err)) from None
    config.stash[_UNDER_TEST] = named


def implementation_under_test(config: pytest.Config) -> Implementation | None:
    """The implementation named by --impl or --form (with its claimed spec), or None."""
    return config.stash.get(_UNDER_TEST, None)


def run_values(config: pytest.Config) -> dict[str, Any]:
    """The values of vet's run options (run_options.RUN: grad, longest), parsed; longest None
    when --long is not given (checks.long_context.default_longest gives the plan's)."""
    return config.stash[_VALUES]


@pytest.fixture
def attention_under_test(request: pytest.FixtureRequest) -> Implementation:
    """The --impl implementation; the test is skipped without --impl."""
    impl = implementation_under_test(request.config)
    if impl is None:
        pytest.skip("no --impl given")
    return impl
