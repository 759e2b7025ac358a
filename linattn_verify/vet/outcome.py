"""What a vet run found: VetReport (its rows, the findings they make, the verdict, its JSON)
and the report in words, on one screen (summary): the verdict, the findings by rank (each in
a few lines: what it is and where it starts, the checks it breaks, the command that
reproduces it), then one line each for the checks that passed, do not apply, were skipped
(and by which option) or not run, the operating envelope and the time per step. `verbose`
adds every row's detail, the worst elements and every command; the JSON (VetReport.to_dict)
keeps every figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..cases import Case
from ..checks import GRAD_CHECKS
from ..checks.gradient_length import NAME as GRADIENT_LENGTH
from ..results import SEVERITIES
from ..specs import Spec
from .findings import Effect, Finding, Row, check_names, findings
from .tasks import OUTSIDE

# a row's status: judged (pass, fail), or why not (the envelope's rows are "envelope";
# "skipped": an option left it out, the row's detail names it)
STATUSES = ("pass", "fail", "depends", "not run", "not applicable", "skipped", "envelope",
            OUTSIDE)  # fmt: skip


@dataclass
class VetReport:
    target: str
    implementation: str
    spec: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    failing_regimes: tuple[str, ...] = ("typical",)
    seconds: dict[str, float] = field(default_factory=dict)  # wall seconds per plan step
    max_rss: dict[str, int] = field(default_factory=dict)  # peak resident bytes per process
    claimed: Spec | None = field(default=None, repr=False)  # the spec, to name causes
    runs_in: str = ""  # where its code ran, when not as itself: Triton's interpreter
    printed: tuple[str, int] | None = None  # the file of its prints, and their lines
    # what it claims to take, where it claims a limit: its dtypes, its head dimensions
    takes: tuple[str, ...] = ()

    @property
    def findings(self) -> list[Finding]:
        return findings(self.rows, self.claimed)

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The rows that fail the verdict: those of the findings in failing_regimes (a row of
        a cause that spans regimes where its own regime is one), and what was not run."""
        blocking = {c for f in self.findings for c in f.failing(self.failing_regimes)}
        return [r for r in self.rows if r["name"] in blocking or r["status"] == "not run"]

    @property
    def verdict(self) -> str:
        return "fail" if self.failed else "pass"

    def summary(self, verbose: bool = False) -> str:
        """The report in words, on one screen (module docstring); verbose: every row and
        detail."""
        return summary(self, verbose)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "target": self.target,
            "implementation": self.implementation,
            "spec": self.spec,
            "runs_in": self.runs_in or None,
            "failing_regimes": list(self.failing_regimes),
            "findings": [f.to_dict() for f in self.findings],
            "counts": {s: sum(r["status"] == s for r in self.rows) for s in STATUSES},
            "checks": self.rows,
            "seconds": self.seconds,
            "max_rss": self.max_rss,
            "printed": None if self.printed is None else dict(zip(("file", "lines"), self.printed)),
        }


INDENT = "     "
SHOWN_STEPS = 5  # the slowest steps named on the time line (verbose: all)


def summary(report: VetReport, verbose: bool = False) -> str:
    """The report in words (module docstring)."""
    found = report.findings
    lines = [_title(report), _verdict(report, found)]
    for number, finding in enumerate(found, 1):
        warning = finding.regime not in report.failing_regimes
        lines += _finding(number, finding, warning, verbose)
    lines += _checks(report, found, verbose)
    lines += _envelope(report.rows, verbose)
    if report.printed:
        path, printed = report.printed
        lines.append(f"the kernel printed {printed:,} line{'s' * (printed != 1)}: {path}")
    lines += _time(report, verbose)
    return "\n".join(lines)


def _title(report: VetReport) -> str:
    name = "" if report.implementation == report.target else f"{report.implementation} "
    runs = f"; in {report.runs_in}" if report.runs_in else ""
    return f"vet {report.target}: {name}claiming {report.spec}{runs}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _verdict(report: VetReport, found: list[Finding]) -> str:
    blocking = [f for f in found if f.regime in report.failing_regimes]
    warnings = len(found) - len(blocking)
    not_run = sum(r["status"] == "not run" for r in report.rows)
    where = " or ".join(report.failing_regimes)
    counts = [f"{_count(len(blocking), 'finding')} on {where} inputs" if blocking else
              f"no finding on {where} inputs"]  # fmt: skip
    if warnings:
        counts.append(_count(warnings, "robustness warning"))
    if not_run:
        counts.append(f"{_count(not_run, 'check')} not run")
    return f"verdict: {'FAIL' if report.verdict == 'fail' else 'pass'}: " + "; ".join(counts)


def _inputs(effect: Effect) -> str:
    return f"{', '.join(effect.dtypes)} inputs"


def _finding(number: int, finding: Finding, warning: bool, verbose: bool) -> list[str]:
    mark = "[warning] " if warning else ""
    lines = [f"  {number}. {mark}{finding.headline()}"]
    if finding.effects:
        first, *others = finding.effects
        lines.append(f"{INDENT}{_inputs(first)}: {first.cause.detail}")
        for effect in others:
            where = (effect.severity, effect.regime)
            how = "" if where == (first.severity, first.regime) else " ({}, {})".format(*where)
            lines.append(f"{INDENT}{_inputs(effect)}{how}: {effect.cause.short}")
            if verbose:
                lines.append(f"{INDENT}  {effect.cause.detail}")
        lines.append(f"{INDENT}checks: {check_names(finding.checks)}")
        if verbose:
            lines.append(f"{INDENT}{finding.detail}")
    elif finding.text is None or finding.kind == "sampler":  # a sampler's figures, each
        if finding.exact:
            others = ", ".join(d for d in finding.dtypes if d != "float64")
            lengths = "".join(f"; {check} from N = {n}" for check, n in finding.lengths)
            lines.append(
                f"{INDENT}wrong in float64, beyond what float64's rounding explains: a defect "
                f"of every precision, so in {others} too{lengths}"
            )
        if not finding.detail_in_headline:
            lines.append(f"{INDENT}{finding.detail}")
    if verbose or finding.kind == "sampler":
        lines += [f"{INDENT}{detail}" for detail in finding.details]
    if finding.worst and (verbose or not finding.effects):  # a named cause says it
        worst = finding.worst.splitlines()
        lines += [f"{INDENT}{line}" for line in (worst if verbose else worst[:1])]
    if verbose and finding.case:
        lines.append(f"{INDENT}case: {Case.from_json(finding.case)}")
    # the shown row's command; verbose, or for a sampler and the rate on its draws, every one
    commands = [finding.reproduce] if finding.reproduce else list(finding.reproduces[:1])
    if verbose or finding.kind == "sampler":
        commands += finding.reproduces
    if verbose:
        commands += [e.reproduce for e in finding.effects if e.reproduce]
    commands = list(dict.fromkeys(commands))
    lines += [f"{INDENT}reproduce: {command}" for command in commands]
    return lines


def _by_detail(rows: list[Row]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["detail"], []).append(row["name"])
    return out


def _skipped(rows: list[Row]) -> str:
    """The skipped checks, grouped by the option that skipped them."""
    parts = []
    for why, names in _by_detail(rows).items():
        label = (
            "the gradient checks"
            if len(names) > 1 and set(names) <= {*GRAD_CHECKS, GRADIENT_LENGTH}
            else ", ".join(names)
        )
        parts.append(f"{label} ({why})")
    return "skipped: " + "; ".join(parts)


def _row_line(row: Row, found: dict[str, tuple[int, Finding]], failing: set[str]) -> str:
    """One row: its status, for a failure its finding's word, regime and number, its detail."""
    status = {"fail": "FAIL", "envelope": "range"}.get(row["status"], row["status"])
    where = ""
    if row["status"] == "fail":
        number, finding = found.get(row["name"], (None, None))
        if finding is not None and finding.kind not in SEVERITIES:  # a cost, a sampler, a hang
            what = [finding.kind]
        else:
            what = [row.get("severity") or "wrong", row.get("regime") or "typical"]
        if number is not None:
            what.append(("finding " if row["name"] in failing else "warning ") + str(number))
        where = f" ({', '.join(what)})"
    return f"  {status:>14}  {row['name']}{where}: {row['detail']}"


def _checks(report: VetReport, found: list[Finding], verbose: bool) -> list[str]:
    rows = [r for r in report.rows if r["status"] != "envelope"]
    if verbose:
        by_check = {c: (i, f) for i, f in reversed(list(enumerate(found, 1))) for c in f.checks}
        failing = {c for f in found for c in f.failing(report.failing_regimes)}
        return ["checks:", *(_row_line(r, by_check, failing) for r in rows)]
    status = {s: [r for r in rows if r["status"] == s] for s in
              ("pass", "fail", "depends", "not applicable", "skipped", "not run")}  # fmt: skip
    failing = {c for f in found for c in f.failing(report.failing_regimes)}
    failed = [r for r in status["fail"] if r["name"] in failing]
    warned = len(status["fail"]) - len(failed)
    run = len(status["pass"]) + len(status["fail"]) + len(status["depends"])
    counts = [f"{len(status['pass'])} of {run} pass"]
    if failed:
        counts.append(f"{len(failed)} fail")
    if warned:
        counts.append(f"{warned} with robustness warnings")
    if status["depends"]:
        counts.append(f"{len(status['depends'])} fail only where the contract fails too")
    lines = ["checks: " + ", ".join(counts)]
    if status["not applicable"]:
        names = ", ".join(r["name"] for r in status["not applicable"])
        lines.append(f"not applicable: {names} (why: --verbose)")
    if status["skipped"]:
        lines.append(_skipped(status["skipped"]))
    for why, names in _by_detail(status["not run"]).items():
        lines.append(f"{why.removeprefix('not run: ')}: not run: {', '.join(names)}")
    outside = [r for r in report.rows if r["status"] == OUTSIDE]
    if outside:
        each = "; ".join(f"{r['name'].removeprefix('outside ')}: {r['detail']}" for r in outside)
        takes = "; ".join(report.takes)
        lines.append(f"outside the claim (it takes {takes}), one call each: {each}")
    return lines


def _sigma(x: float) -> str:
    return f"{x:.2g}"


def _envelope(rows: list[Row], verbose: bool) -> list[str]:
    """One line: what sigma is for the spec (envelope.what_sigma_scales), and per dtype the
    sigma over which it holds."""
    rows = [r for r in rows if r["status"] == "envelope"]
    if not rows:
        return []
    if verbose:
        return [f"  {'range':>14}  {r['name']}: {r['detail']}" for r in rows]
    holds, nowhere = [], []
    for row in rows:
        dtype = row["name"].removeprefix("envelope ")
        low, high = (row.get("figures") or {}).get("low"), (row.get("figures") or {}).get("high")
        if low is None or high is None:
            nowhere.append(dtype)
        else:
            holds.append(f"{dtype} {_sigma(low)} to {_sigma(high)}")
    parts = [f"holds for sigma in {', '.join(holds)}"] if holds else []
    if nowhere:
        parts.append(f"does not hold at sigma = 1 in {', '.join(nowhere)}")
    sigma = f" (sigma: {rows[0]['sigma']})" if rows[0].get("sigma") else ""
    return [f"envelope{sigma}: " + "; ".join(parts)]


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def _time(report: VetReport, verbose: bool) -> list[str]:
    seconds = report.seconds
    if not seconds:
        return []
    steps = sorted(seconds.items(), key=lambda item: -item[1])
    shown = steps if verbose else steps[:SHOWN_STEPS]
    parts = [f"{name} {_seconds(s)}" for name, s in shown]
    rest = steps[len(shown) :]
    if rest:
        parts.append(f"{len(rest)} more {_seconds(sum(s for _, s in rest))}")
    line = f"time: {_seconds(sum(seconds.values()))} ({', '.join(parts)})"
    memory = getattr(report, "max_rss", None) or {}
    if verbose and memory:
        line += "; peak memory " + ", ".join(f"{k} {v / 2**30:.2g} GiB" for k, v in memory.items())
    return [line]
