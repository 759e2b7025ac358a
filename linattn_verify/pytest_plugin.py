"""pytest plugin (entry point pytest11): the options that name an implementation under test,
for this project's property suite and for anyone's tests.

    pytest --impl mykernels.py:attn --feature-map elu --causal [--eps E] [--layout bnhd]

`implementation_under_test(config)` is the Implementation they name (None without --impl);
the `attention_under_test` fixture skips when no --impl is given.
"""

from __future__ import annotations

import pytest

from .checks import Implementation, external
from .checks.core import LAYOUTS
from .specs import FEATURE_MAPS, Spec, SpecError


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("linattn-verify")
    group.addoption("--impl", help="the implementation under test: MODULE:FN or path.py:FN")
    group.addoption("--feature-map", help=f"the spec --impl claims: {', '.join(FEATURE_MAPS)}")
    group.addoption("--causal", action="store_true", help="--impl is causal")
    group.addoption("--eps", type=float, default=0.0, help="--impl's denominator eps")
    group.addoption("--layout", choices=LAYOUTS, default="bhnd", help="--impl's tensor layout")


def implementation_under_test(config: pytest.Config) -> Implementation | None:
    """The implementation named by --impl (with its claimed spec), or None."""
    target = config.getoption("--impl")
    if target is None:
        return None
    feature_map = config.getoption("--feature-map")
    if feature_map is None:
        raise pytest.UsageError("--impl needs --feature-map NAME (the spec it claims)")
    try:
        spec = Spec(feature_map, config.getoption("--causal"), config.getoption("--eps"))
        return external(target, spec, config.getoption("--layout"))
    except SpecError as err:
        raise pytest.UsageError(str(err)) from None


@pytest.fixture
def attention_under_test(request: pytest.FixtureRequest) -> Implementation:
    """The --impl implementation; the test is skipped without --impl."""
    impl = implementation_under_test(request.config)
    if impl is None:
        pytest.skip("no --impl given")
    return impl
