"""What vet finds on each adapter, as the project expects it (expected.txt beside this file),
array-api-tests style: one line per adapter and failing check, `ADAPTER::CHECK`; an adapter
without a line passes. A comment `# ADAPTER: text` says why, in the README's table.

tests/test_adapter_verdicts.py vets every installed adapter (vet's plan with the
known-answer vectors) and asserts that its failing checks are the file's, and
`python -m linattn_verify adapters --readme README.md` writes the README's table from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .base import Adapter

EXPECTED_FILE = Path(__file__).with_name("expected.txt")
_LINE = re.compile(r"^(?P<adapter>[\w.-]+)::(?P<check>\S.*?)\s*$")
_REASON = re.compile(r"^#\s*(?P<adapter>[\w.-]+):\s+(?P<text>.*)$")


@dataclass
class Expected:
    """An adapter's expected failing checks (vet row names) and the reason for them."""

    failing: set[str] = field(default_factory=set)
    reason: str = ""
    lines: dict[str, int] = field(default_factory=dict)  # check -> line number in the file


def load_expected(path: Path = EXPECTED_FILE) -> dict[str, Expected]:
    """The file's expectations by adapter name (adapters with no line are absent)."""
    expected: dict[str, Expected] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if match := _LINE.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            entry.failing.add(match["check"])
            entry.lines[match["check"]] = number
        elif match := _REASON.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            entry.reason = f"{entry.reason} {match['text']}".strip()
    return expected


def verdict_table(adapters: dict[str, Adapter], expected: dict[str, Expected]) -> str:
    """The README's table: per adapter its claim, the expected verdict, the failing checks
    and why."""
    rows = [
        "| adapter (library function) | claimed spec | verdict | failing checks | why |",
        "|---|---|---|---|---|",
    ]
    for name, adapter in adapters.items():
        entry = expected.get(name, Expected())
        verdict = "fail" if entry.failing else "pass"
        if adapter.device == "cuda":
            verdict = "not vetted (CUDA)"
        checks = _checks(entry.failing) or "-"
        why = (entry.reason or adapter.note).replace("|", "\\|")  # a cell holds no bare |
        rows.append(
            f"| `{name}` (`{adapter.function}`) | {adapter.spec} | {verdict} | {checks} | {why} |"
        )
    return "\n".join(rows)


def _checks(failing: set[str]) -> str:
    """The failing rows, the per-dtype accuracy rows as one: "accuracy (float16, bfloat16)"."""
    dtypes = ("float16", "bfloat16", "float32", "float64")
    accuracy = [t for t in dtypes if f"accuracy {t}" in failing]
    names = sorted(c for c in failing if not c.startswith("accuracy "))
    if accuracy:
        names.append(f"accuracy ({'all dtypes' if len(accuracy) == 4 else ', '.join(accuracy)})")
    return ", ".join(names)
