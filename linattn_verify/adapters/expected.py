"""What vet finds on each adapter, as the project expects it (expected.txt beside this file),
array-api-tests style, one fact a line:

    ADAPTER::CHECK                          a check that fails the default verdict
    ADAPTER::CHECK (on some CPUs)           one that fails it on some machines only (a float32
                                            kernel's roundings differ between CPUs' BLAS)
    ADAPTER top: SEVERITY, REGIME, SHARE    the top-ranked finding; SHARE its largest error
                                            as a share of the output's scale (or "-")
    ADAPTER envelope: LOW .. HIGH           float32 holds for LOW <= sigma <= HIGH
    # ADAPTER: text                         why, for the README's table
    # ADAPTER fix: text                     what the library's maintainer would change (or
                                            "nothing: ..."), the table's first column

An adapter with no line but its reason and fix passes with no finding; every adapter and
every recorded variant has a fix line (a row of the table each). ADAPTER is an adapter's
name or, for a verdict with vet options besides the default plan (variants()), the name and
the options: "fla.simple-gla-chunk --tf32 --dtypes float32::reference"; a variant has a
reason line once recorded. tests/test_adapter_verdicts.py vets every installed adapter (`vet ADAPTER
--kat`) and its variants and compares; `python -m linattn_verify adapters --record` writes
the facts from such a run (keeping the reasons and fixes, which people write), `--readme
docs/adapters.md` the table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..accuracy.verdict import percent
from ..families import family_of
from .base import Adapter

EXPECTED_FILE = Path(__file__).with_name("expected.txt")
HEADER = """\
# Expected vet verdicts of the adapters: linattn_verify/adapters/expected.py reads this file,
# tests/test_adapter_verdicts.py checks it on every installed adapter, and
# `python -m linattn_verify adapters --record` writes it (the reasons and fixes are kept).
"""
_KEY = r"(?P<adapter>[\w.-]+(?: --[\w-]+(?: [\w.]+)?)*)"  # a name, then vet options
MAYBE = " (on some CPUs)"  # a failing check's line, where it fails on some machines only
_FAILING = re.compile(rf"^{_KEY}::(?P<check>\S.*?)(?P<maybe>{re.escape(MAYBE)})?\s*$")
_TOP = re.compile(rf"^{_KEY} top: (?P<severity>\w+), (?P<regime>\w+), (?P<share>\S+)$")
_ENVELOPE = re.compile(rf"^{_KEY} envelope: (?P<low>\S+) \.\. (?P<high>\S+)$")
_REASON = re.compile(rf"^#\s*{_KEY}:\s+(?P<text>.*)$")
# matched before _REASON: "# NAME --smallest fix: ..." would read as the reason of a key
# "NAME --smallest fix" (an option's value) otherwise
_FIX = re.compile(rf"^#\s*{_KEY} fix:\s+(?P<text>.*)$")


# The long-context variant of an adapter of linear cost (vet's smallest plan with the check
# at length): a CPU kernel in float32 to vet's default longest N (checks/long_context.py's
# LONGEST); a Triton kernel in the interpreter, every dtype, to INTERPRETED_LONGEST, a
# stepwise family's (Family.stepwise: the delta rule's) to SMALLEST_LONGEST: some two
# minutes of the interpreter each, what the interpreter's plan affords (docs/performance.md);
# tests/test_adapter_verdicts.py holds these N to them.
LONG_CPU = "--smallest --dtypes float32 --long 65536"
LONG_TRITON = "--smallest --long 16384"
LONG_TRITON_DELTA = "--smallest --long 4096"


def variants(adapter: Adapter) -> tuple[str, ...]:
    """The vet options besides the default plan whose verdicts the file records: for a Triton
    kernel, --tf32 on float32 (TF32 rounds float32 products alone) at the default plan where
    its library takes float32, and at the smallest plan its backward (--grad, with --state
    where it carries one) and, where it takes them, packed batches (--varlen); for every
    adapter of linear cost, the long-context check (long_variant)."""
    long = () if adapter.cost == "quadratic" else (long_variant(adapter),)
    if not adapter.triton:
        return long
    backward = "--state --grad --smallest" if adapter.state else "--grad --smallest"
    tf32 = ("--tf32 --dtypes float32",) if "float32" in (adapter.dtypes or ("float32",)) else ()
    return (*tf32, backward, *(["--varlen --smallest"] * adapter.varlen), *long)


def long_variant(adapter: Adapter) -> str:
    """The options of the adapter's long-context verdict (LONG_CPU, LONG_TRITON...)."""
    if not adapter.triton:
        return LONG_CPU
    return LONG_TRITON_DELTA if family_of(adapter.spec).stepwise else LONG_TRITON


def keys(adapters: dict[str, Adapter]) -> list[str]:
    """Every verdict the file may hold, in the registry's order: each adapter's default
    plan, then its variants ("NAME OPTIONS")."""
    return [k for a in adapters.values() for k in (a.name, *(f"{a.name} {v}" for v in variants(a)))]


@dataclass
class Expected:
    """An adapter's expected verdict: failing checks (vet row names, with the line of each),
    those that fail on some machines only (maybe), the top finding (severity, regime,
    share), the float32 envelope, the reason, and what the library's maintainer would fix."""

    failing: set[str] = field(default_factory=set)
    maybe: set[str] = field(default_factory=set)
    lines: dict[str, int] = field(default_factory=dict)
    top: tuple[str, str, float | None] | None = None
    envelope: tuple[float, float] | None = None
    reason: str = ""
    fix: str = ""


def load_expected(path: Path = EXPECTED_FILE) -> dict[str, Expected]:
    """The file's expectations by adapter name (adapters with no line are absent)."""
    expected: dict[str, Expected] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if match := _FIX.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            entry.fix = f"{entry.fix} {match['text']}".strip()
        elif match := _REASON.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            entry.reason = f"{entry.reason} {match['text']}".strip()
        elif match := _TOP.match(line):
            share = None if match["share"] == "-" else float(match["share"])
            entry = expected.setdefault(match["adapter"], Expected())
            entry.top = (match["severity"], match["regime"], share)
        elif match := _ENVELOPE.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            entry.envelope = (float(match["low"]), float(match["high"]))
        elif match := _FAILING.match(line):
            entry = expected.setdefault(match["adapter"], Expected())
            (entry.maybe if match["maybe"] else entry.failing).add(match["check"])
            entry.lines[match["check"]] = number
    return expected


def record(measured: dict[str, Expected], old: dict[str, Expected]) -> str:
    """expected.txt for `measured` (by key, in the order given), the reasons, the fixes and
    the checks that fail on some machines only kept from `old`."""
    out = [HEADER]
    for name, entry in measured.items():
        kept = old.get(name, Expected())
        reason, fix, maybe = kept.reason, kept.fix, kept.maybe
        out.append("")
        if reason:
            out.append(f"# {name}: {reason}")
        if fix:
            out.append(f"# {name} fix: {fix}")
        out += [f"{name}::{check}" for check in sorted(entry.failing - maybe)]
        out += [f"{name}::{check}{MAYBE}" for check in sorted(maybe)]
        if entry.top is not None:
            severity, regime, share = entry.top
            out.append(
                f"{name} top: {severity}, {regime}, {'-' if share is None else f'{share:.3g}'}"
            )
        if entry.envelope is not None:
            out.append(f"{name} envelope: {entry.envelope[0]:.3g} .. {entry.envelope[1]:.3g}")
    return "\n".join(out) + "\n"


def verdict_table(adapters: dict[str, Adapter], expected: dict[str, Expected]) -> str:
    """The README's table: per adapter what its library's maintainer would fix (first), its
    claim, the default verdict, the checks that fail it, the top finding, the float32
    envelope, and why; then a row for each of its variants the file records (the verdict of
    `vet NAME OPTIONS`)."""
    rows = [
        "| what a maintainer would fix | adapter (library function) | claimed spec | verdict "
        "| failing checks | top finding | float32 envelope (sigma) | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, adapter in adapters.items():
        entry = expected.get(name, Expected())
        verdict = "fail" if entry.failing else "fail on some CPUs" if entry.maybe else "pass"
        envelope = "-" if entry.envelope is None else "{:.2g} to {:.2g}".format(*entry.envelope)
        failing = _checks(entry.failing) + "".join(f", {c}{MAYBE}" for c in sorted(entry.maybe))
        rows.append(
            f"| {_cell(entry.fix) or '-'} | `{name}` (`{adapter.function}`) | {adapter.spec} | "
            f"{verdict} | {failing.lstrip(', ') or '-'} | {_top(entry.top)} | {envelope} | "
            f"{_cell(entry.reason or adapter.note)} |"
        )
        for key in (f"{name} {v}" for v in variants(adapter)):
            if key in expected:
                entry = expected[key]
                rows.append(
                    f"| {_cell(entry.fix) or '-'} | `{key}` | as above | "
                    f"{'fail' if entry.failing else 'pass'} | "
                    f"{_checks(entry.failing) or '-'} | {_top(entry.top)} | - | "
                    f"{_cell(entry.reason)} |"
                )
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a cell holds no bare |


def _top(top: tuple[str, str, float | None] | None) -> str:
    if top is None:
        return "-"
    severity, regime, share = top
    if share is None:
        return f"{severity}, {regime}"
    return f"{severity}, {regime}, {percent(share)}"


def _checks(failing: set[str]) -> str:
    """The failing rows, the per-dtype accuracy rows as one: "accuracy (float16, bfloat16)"."""
    dtypes = ("float16", "bfloat16", "float32", "float64")
    accuracy = [t for t in dtypes if f"accuracy {t}" in failing]
    names = sorted(c for c in failing if not c.startswith("accuracy "))
    if accuracy:
        names.append(f"accuracy ({'all dtypes' if len(accuracy) == 4 else ', '.join(accuracy)})")
    return ", ".join(names)
