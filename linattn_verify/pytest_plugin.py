"""pytest plugin (entry point pytest11): the options that name an implementation under test,
for this project's property suite and for anyone's tests.

    pytest --impl mykernels.py:attn --feature-map elu --causal [--eps E] [--layout bnhd]
    pytest --impl fla.based-naive          # an adapter: its spec is its claim
    pytest --form chunked --chunk-size 16 --feature-map elu --causal   # one built-in form

`implementation_under_test(config)` is the Implementation they name (None without --impl);
the `attention_under_test` fixture skips when no --impl is given.
"""

from __future__ import annotations

import pytest

from .specs import SpecError
from .under_test import OPTIONS, Implementation, from_options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("linattn-verify")
    group.addoption(
        "--impl",
        help="the implementation under test: MODULE:FN, path.py:FN or an adapter's name "
        "(python -m linattn_verify vet --list); or a built-in --form",
    )
    for flag, options in OPTIONS:
        group.addoption(flag, **options)


def implementation_under_test(config: pytest.Config) -> Implementation | None:
    """The implementation named by --impl or --form (with its claimed spec), or None."""
    target, form = config.getoption("--impl"), config.getoption("--form")
    if target is None and form is None:
        return None
    values = {flag[2:].replace("-", "_"): config.getoption(flag) for flag, _ in OPTIONS}
    try:
        return from_options(target, values)
    except SpecError as err:
        raise pytest.UsageError(str(err)) from None


@pytest.fixture
def attention_under_test(request: pytest.FixtureRequest) -> Implementation:
    """The --impl implementation; the test is skipped without --impl."""
    impl = implementation_under_test(request.config)
    if impl is None:
        pytest.skip("no --impl given")
    return impl
