"""Options of the property suite."""

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full-grid",
        action="store_true",
        help="scaling: time every built-in form over N = 2^8 ... 2^16 (use with "
        "--benchmark-enable --benchmark-json=PATH); default: a small grid",
    )
