"""The zoo's kill table, printed at the end of a run that includes tests/test_zoo.py."""

from __future__ import annotations

import pytest


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
