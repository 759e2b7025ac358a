"""The zoo's kill table, printed at the end of a run that includes tests/test_zoo.py; the
Triton variants besides CI's sample skipped unless asked for."""

from __future__ import annotations

import pytest

from linattn_verify.reference import certified_decay


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    rows = [
        value
        for report in terminalreporter.stats.get("passed", [])
        + terminalreporter.stats.get("failed", [])
        for key, value in getattr(report, "user_properties", [])
        if key == "zoo" and report.when == "call"
    ]
    if not rows:
        return
    terminalreporter.section("mutant zoo: which checks reject which implementation")
    for row in sorted(rows, key=lambda r: (not r["broken"], r["name"])):
        verdict = "broken " if row["broken"] else "correct"
        killers = ", ".join(row["killed_by"]) or "-"
        warned = f"   warned: {', '.join(row['warned'])}" if row.get("warned") else ""
        terminalreporter.write_line(f"{verdict}  {row['name']:<38} {killers}{warned}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Triton adapters' variants besides CI's sample (marker all_variants, minutes) are
    skipped unless the -m expression names them (pytest -m all_variants)."""
    if "all_variants" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="a Triton variant besides CI's sample: pytest -m all_variants")
    for item in items:
        if item.get_closest_marker("all_variants"):
            item.add_marker(skip)


@pytest.fixture
def small_chunks(monkeypatch):
    """The certified engines' chunks of 8 tokens, sub-chunks of 4, 2 chunks per step: a
    few dozen tokens cross all three and end ragged."""
    monkeypatch.setattr(certified_decay, "CHUNK", 8)
    monkeypatch.setattr(certified_decay, "SUB", 4)
    monkeypatch.setattr(certified_decay, "GROUP", 2)
