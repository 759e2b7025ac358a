"""The outcome of one check on one case, shared by every kind of check (property checks,
statistical checks, vet's tasks) and by everything that reports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .cases import Case

# How much a failure matters (docs/regimes.md, "Severities"), worst first: wrong is outside
# the a-priori bound (or non-finite where the exact value is finite and fits, or a broken
# property); inaccurate is inside the bound and over the budget: less accurate than
# attainable.
SEVERITIES = ("wrong", "inaccurate")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one case: pass/fail, figures, a message naming the input.

    by_nature: set when the spec itself violates the property on this input (relu's zero
    denominator, performer-trig's negative one): an expected failure, with its reason.
    severity (SEVERITIES) of a failure; regime (regimes.REGIMES) of its case.
    worst: lines on the worst element of a failed judgement (checks/worst.py).
    cause: "contract" when the failure is the implementation breaking the calling contract
    (an exception, a non-tensor, a wrong shape) rather than a wrong value.
    """

    check: str
    passed: bool
    message: str
    case: Case | None = None
    figures: dict[str, float] = field(default_factory=dict)
    by_nature: str | None = None
    repro: str | None = None
    severity: str | None = None
    regime: str | None = None
    worst: str | None = None
    cause: str | None = None

    def report(self) -> str:
        """The message, the case and the command that reproduces it."""
        status = "pass" if self.passed else "FAIL"
        if not self.passed and self.severity:
            status += f" ({self.severity}, {self.regime or 'any'} inputs)"
        lines = [f"{self.check}: {status}: {self.message}"]
        if self.by_nature:
            lines.append("  by nature of the spec: an expected failure, not a bug")
        if self.worst:
            lines += [f"  {line}" for line in self.worst.splitlines()]
        if self.case is not None:
            lines.append(f"  case: {self.case}")
        if self.repro:
            lines.append(f"  reproduce: {self.repro}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.check,
            "status": "pass" if self.passed else "fail",
            "detail": self.message,
            "figures": self.figures,
            "by_nature": self.by_nature,
            "case": None if self.case is None else self.case.to_json(),
            "reproduce": self.repro,
            "severity": self.severity,
            "regime": self.regime,
            "worst": self.worst,
            "cause": self.cause,
        }
