"""Findings: vet's failing rows grouped by the cause they share, each with a severity and the
regime it shows in, ranked so that the one that matters comes first (docs/regimes.md,
"Findings").

Rows share a cause when their cases do: the same regime, dtype, kind of input and magnitude
(several checks failing on one input, or on inputs of one kind and size, fail for one
reason). A row without a case (the cost growth, a sampler's statistics) is a finding of
its own, and so is a crash or a hang ("stopped"), whose case is only where it happened.
Rows without a regime are about the implementation whatever its values: typical. Ranking:
regime (typical first), then severity (wrong first), then the relative error, largest
first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..accuracy.verdict import percent
from ..regimes import REGIMES
from ..results import SEVERITIES

Row = dict[str, Any]


@dataclass(frozen=True)
class Finding:
    """One cause: its severity and regime, the checks it breaks, its smallest case, the
    command that reproduces it, its largest error as a share of the output's scale, and the
    worst element of its case when that case was judged against the exact reference."""

    severity: str
    regime: str
    checks: tuple[str, ...]
    detail: str
    relative_error: float | None = None
    case: str | None = None
    reproduce: str | None = None
    worst: str | None = None

    def headline(self) -> str:
        share = self.relative_error
        size = "" if share is None else f", error {percent(share)} of the output's scale"
        return f"{self.severity} on {self.regime} inputs{size}: {', '.join(self.checks)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "regime": self.regime,
            "checks": list(self.checks),
            "detail": self.detail,
            "relative_error": self.relative_error,
            "case": self.case,
            "reproduce": self.reproduce,
            "worst": self.worst,
        }


def _cause(row: Row) -> tuple:
    case = row.get("case")
    if not case or row.get("stopped"):
        return ("row", row["name"])
    c = json.loads(case)
    return (row.get("regime") or "typical", c["dtype"], c["kind"], c["magnitude"])


def _size(row: Row) -> int:
    if not row.get("case"):
        return 0
    c = json.loads(row["case"])
    return c["b"] * c["h"] * c["n"] * (c["d"] + c["dv"])


def _relative(row: Row) -> float | None:
    """The row's largest error as a share of the output's scale, where it has one."""
    figures = row.get("figures") or {}
    if "relative_error" in figures:
        return figures["relative_error"]
    return None


def findings(rows: list[Row]) -> list[Finding]:
    """The failing rows as findings, ranked (module docstring)."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row["status"] == "fail":
            groups.setdefault(_cause(row), []).append(row)
    out = []
    for group in groups.values():
        # the smallest case judged against the exact reference (its worst element shown),
        # else the smallest case
        shown = min(group, key=lambda r: (not r.get("worst"), _size(r)))
        severities = [r.get("severity") or "wrong" for r in group]
        shares = [s for s in map(_relative, group) if s is not None]
        out.append(
            Finding(
                severity=min(severities, key=SEVERITIES.index),
                regime=shown.get("regime") or "typical",
                checks=tuple(dict.fromkeys(r["name"] for r in group)),
                detail=shown.get("detail", ""),
                relative_error=max(shares) if shares else None,
                case=shown.get("case"),
                reproduce=shown.get("reproduce"),
                worst=shown.get("worst"),
            )
        )
    out.sort(
        key=lambda f: (
            REGIMES.index(f.regime),
            SEVERITIES.index(f.severity),
            -(f.relative_error if f.relative_error is not None else 0.0),
        )
    )
    return out
