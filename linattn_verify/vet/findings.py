"""Findings: vet's failing rows grouped by the cause they share, each with a severity, the
regime it shows in and the word that says what it is, ranked so that the one that matters
comes first (docs/regimes.md, "Findings").

Rows share a cause when it is named (causes.py: the same feature-level cause, in any check
and any dtype, e.g. elu(x) + 1 cancelling in float32), else when their cases do: the same
regime, dtype, kind of input and magnitude (several checks failing on one input, or on
inputs of one kind and size, fail for one reason). The rows of a check that runs no case
through the kernel's values (positivity, associativity, ...) join the cause named on their
inputs when it is the only one named there. A kernel wrong in float64 (outside the
a-priori bound, or off by the output's own scale), beyond what float64's rounding explains,
has a defect of every precision (wrong in exact arithmetic, or rounding to a precision of
its own): it shows in every dtype and every check that compares values, so the failing
rows of that regime with no cause named and of no kind of their own are one finding with
it ("in float64 too"), which lists the dtypes and checks they fail in; nothing separates
them from the defect. Rows of a kind of their own:
- cost: the counted growth of FLOPs or bytes is not the claimed one (rows of cause "cost":
  the scaling task's, and the long-context check's when memory grows faster than claimed);
- sampler: a projection sampler's statistics, with the W it drew; the rate check, when it
  drew W from that sampler, is part of it;
- rate: the rate check on its own (the project's sampler, or a sampler that passes);
- crashed, hung: a task that stopped ("stopped"), whose case is only where it happened;
- any other row without a case is a finding of its own.
Each finding fails the verdict in its regime whatever its kind; rows without a regime are
about the implementation whatever its values: typical. The regime of a finding is the
mildest among its rows. Ranking: regime (typical first), then severity (wrong first), then
the relative error, largest first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..accuracy.verdict import percent
from ..checks import GRAD_CHECKS
from ..checks.gradient_length import NAME as GRADIENT_LENGTH
from ..inputs import UNIT_ROUNDOFF
from ..regimes import REGIMES
from ..results import SEVERITIES
from ..scaling.growth import EXPECTED_SLOPE, SLOPE_TOLERANCE
from ..specs import Spec
from .causes import TF32, Cause, name_cause
from .tasks import AUTOTUNE_CONFIGS, DEPENDS, INT32_OFFSETS

Row = dict[str, Any]

# the word a finding leads with: its severity, or what else it is (module docstring)
KINDS = (*SEVERITIES, "cost", "sampler", "rate", "crashed", "hung")


@dataclass(frozen=True)
class Effect:
    """What a named cause does in one precision (Cause.effect, Cause.compute), shown on the
    first of its rows, with the dtypes of the inputs and the checks it shows in."""

    cause: Cause
    dtypes: tuple[str, ...]
    checks: tuple[str, ...]
    case: str | None
    reproduce: str | None
    severity: str = "wrong"  # the worst of its rows
    regime: str = "typical"  # the mildest of its rows

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.cause.to_dict(),
            "severity": self.severity,
            "regime": self.regime,
            "dtypes": list(self.dtypes),
            "checks": list(self.checks),
            "case": self.case,
            "reproduce": self.reproduce,
        }


@dataclass(frozen=True)
class Finding:
    """One cause: its severity and regime, the checks it breaks, the case it shows (its
    smallest), the command that reproduces it, the error there as a share of the output's
    scale, and the worst element of that case when it was judged against the exact reference.
    kind: the word it leads with (KINDS); effects: what its named cause does, per precision
    (none when the cause is not named); text: the finding in one line, where it has one
    better than its detail (a cost, a sampler, the rate)."""

    severity: str
    regime: str
    checks: tuple[str, ...]
    detail: str
    relative_error: float | None = None
    case: str | None = None
    reproduce: str | None = None
    worst: str | None = None
    kind: str = ""
    effects: tuple[Effect, ...] = ()
    text: str | None = None
    details: tuple[str, ...] = ()  # the detail of each further row (a sampler's checks, the rate)
    reproduces: tuple[str, ...] = ()  # every command that reproduces a part of it
    # each row's check and regime: a named cause spans regimes, and a check fails a verdict
    # where its own row's regime does (the finding's regime is the mildest of them)
    check_regimes: tuple[tuple[str, str], ...] = ()
    dtypes: tuple[str, ...] = ()  # the dtypes of its rows' cases
    exact: bool = False  # wrong in float64 too: a defect of every precision (module docstring)
    # wrong in float64 and right on the same inputs without decay (checks/agreement.py's
    # figure "right_without_decay"): the defect is in how the decay is applied
    in_decay: bool = False
    limit: bool = False  # calls past an undeclared limit of the head dimensions (a contract's)
    lengths: tuple[tuple[str, int], ...] = ()  # (check, the first N it fails at) at length
    largest_error: float | None = None  # the largest share among its rows: its rank

    def failing(self, regimes: tuple[str, ...]) -> set[str]:
        """The checks this finding fails in a verdict that fails on `regimes`."""
        pairs = self.check_regimes or tuple((c, self.regime) for c in self.checks)
        return {check for check, regime in pairs if regime in regimes}

    @property
    def advice(self) -> tuple[tuple[str, ...], ...]:
        """The claim's options its named causes suggest (Cause.advice), each once."""
        return tuple(dict.fromkeys(e.cause.advice for e in self.effects if e.cause.advice))

    @property
    def cause(self) -> str | None:
        """The named cause (causes.Cause.key), or None."""
        return self.effects[0].cause.key if self.effects else None

    @property
    def is_contract(self) -> bool:
        """The contract check's finding, or calls of other checks that broke the contract
        past an undeclared limit (vet/runner.py: the rows' "limit")."""
        return self.checks[:1] == ("contract",) or self.limit

    @property
    def detail_in_headline(self) -> bool:
        """A contract finding says what was returned or raised in its first line."""
        return self.is_contract and bool(self.detail) and not self.effects

    def headline(self) -> str:
        """The finding in one line: what it is, where, and its size or its cause."""
        kind = self.kind or self.severity
        if self.effects:
            first = self.effects[0]
            return f"{first.severity} on {first.regime} inputs: {first.cause.short}"
        if kind in SEVERITIES:
            where = f"{self.severity} on {self.regime} inputs"
            if self.exact:
                where += " in float64 too"
            elif len(self.dtypes) > 1:
                where += f" in {', '.join(self.dtypes)}"
            if self.in_decay:
                where += ", in how the decay is applied (right on the same inputs without it)"
            if self.detail_in_headline:  # what was returned or raised, and what was expected
                checks = check_names(self.checks)
                checks = checks if self.checks[0] == "contract" else f"contract, in {checks}"
                return f"{where}: {checks}: {' '.join(self.detail.split())}"
            share = self.relative_error
            if share is None:
                size = ""
            elif math.isfinite(share):
                size = f", error {percent(share)} of the output's scale"
            else:
                size = ", a non-finite output"
            return f"{where}{size}: {check_names(self.checks)}"
        where = "" if self.regime == "typical" else f" (on {self.regime} inputs)"
        return f"{kind}{where}: {self.text or self.detail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "regime": self.regime,
            "kind": self.kind or self.severity,
            "headline": self.headline(),
            "cause": self.cause,
            "advice": [list(words) for words in self.advice],
            "effects": [e.to_dict() for e in self.effects],
            "checks": list(self.checks),
            "check_regimes": [list(pair) for pair in self.check_regimes],
            "detail": self.detail,
            "details": list(self.details),
            "relative_error": self.relative_error,
            "case": self.case,
            "reproduce": self.reproduce,
            "reproduces": list(self.reproduces),
            "worst": self.worst,
            "dtypes": list(self.dtypes),
            "exact": self.exact,
            "in_decay": self.in_decay,
            "limit": self.limit,
            "lengths": [list(pair) for pair in self.lengths],
            "largest_error": self.largest_error,
        }


def check_names(names: Iterable[str]) -> str:
    """Check names, those of one family after the first by their last word ("accuracy
    float16, bfloat16")."""
    out, family = [], None
    for name in names:
        head, _, tail = name.rpartition(" ")
        if head and head == family:
            out.append(tail)
        else:
            out.append(name)
            family = head or None
    return ", ".join(out)


def _key(row: Row) -> tuple:
    """The cause a row shares by its inputs or its kind (module docstring)."""
    if row.get("stopped"):
        return ("row", row["name"])
    if row.get("cause") == "cost":
        return ("cost",)
    if row["name"].startswith("sampler"):
        return ("sampler",)
    if row.get("limit"):  # raises past a limit of the head dimensions (vet/runner.py)
        return ("limit",)
    case = row.get("case")
    if not case:
        return ("row", row["name"])
    c = json.loads(case)
    return (_regime(row), c["dtype"], c["kind"], c["magnitude"])


def _regime(row: Row) -> str:
    return row.get("regime") or "typical"


def _size(row: Row) -> int:
    if not row.get("case"):
        return 0
    c = json.loads(row["case"])
    return c["b"] * c["h"] * c["n"] * (c["d"] + c["dv"])


def _dtype(row: Row) -> str | None:
    return json.loads(row["case"])["dtype"] if row.get("case") else None


def _wrong_in_float64(row: Row) -> bool:
    """A value check's row wrong in float64, beyond what float64's rounding explains."""
    return row.get("severity") == "wrong" and _dtype(row) == "float64" and not row.get("stopped")


def _own_kind(key: tuple, group: list[Row]) -> bool:
    """A group that is a finding of its own whatever else fails: a named cause, a cost, a
    sampler, the rate, a task that stopped, the contract, a mechanism no float64 forward
    value shows (an autotune config, int32 offsets, a backward), a non-finite output."""
    if key[0] == "cause" or key in (("cost",), ("sampler",), ("row", "rate")):
        return True
    return any(
        r.get("stopped")
        or "contract" in (r["name"], r.get("cause"))
        or r["name"] in OWN_MECHANISMS
        or not math.isfinite(_relative(r) or 0.0)
        for r in group
    )


# checks whose failures have a mechanism of their own, whatever the forward values show
OWN_MECHANISMS = {AUTOTUNE_CONFIGS, INT32_OFFSETS, GRADIENT_LENGTH, *GRAD_CHECKS}


def _in_exact_arithmetic(groups: dict[tuple, list[Row]]) -> None:
    """Merge, in place, the groups of the regime where the kernel is wrong in float64 into
    one (module docstring)."""
    anchors = [r for key, g in groups.items() if not _own_kind(key, g) for r in g
               if _wrong_in_float64(r)]  # fmt: skip
    if not anchors:
        return
    regime = min((_regime(r) for r in anchors), key=REGIMES.index)
    merged = []
    for key, group in list(groups.items()):
        if not _own_kind(key, group) and all(_regime(r) == regime for r in group):
            merged += groups.pop(key)
    groups[("exact", regime)] = merged


def _relative(row: Row) -> float | None:
    """The row's largest error as a share of the output's scale, where it has one."""
    figures = row.get("figures") or {}
    share = figures.get("relative_error")
    return None if share is None else float(share)


def _groups(rows: list[Row], spec: Spec | None) -> tuple[list[list[Row]], dict[int, Cause]]:
    """The failing rows by cause (module docstring), and the named cause of each row that
    has one (by id)."""
    failing = [r for r in rows if r["status"] == "fail"]
    named = {id(r): c for r in failing if (c := name_cause(r, spec)) is not None}
    by_inputs: dict[tuple, list[Row]] = {}
    for row in failing:
        by_inputs.setdefault(_key(row), []).append(row)
    on_case: dict[str, set[str]] = {}  # the causes named on each case
    for row in failing:
        if id(row) in named:
            on_case.setdefault(row["case"], set()).add(named[id(row)].key)
    groups: dict[tuple, list[Row]] = {}
    for key, members in by_inputs.items():
        for row in members:
            causes = on_case.get(row.get("case") or "", set())
            if id(row) in named:
                groups.setdefault(("cause", named[id(row)].key), []).append(row)
            # a row not judged against the exact reference, on a case where one cause is
            # named, fails for it (a row judged and not named has a cause of its own)
            elif len(causes) == 1 and not row.get("worst"):
                groups.setdefault(("cause", *causes), []).append(row)
            # a check at length whose failures pass with IEEE products: TF32's, where named
            elif _ieee_passes(row) and TF32 in {c.key for c in named.values()}:
                groups.setdefault(("cause", TF32), []).append(row)
            else:
                groups.setdefault(key, []).append(row)
    _in_exact_arithmetic(groups)
    rate = groups.get(("row", "rate"), [])
    sampler = groups.get(("sampler",), [])
    if rate and sampler and _sampler(rate[0]).get("target") == _sampler(sampler[0]).get("target"):
        sampler += groups.pop(("row", "rate"))  # its W came from the failing sampler
    order = {id(r): i for i, r in enumerate(rows)}  # each group's rows in the report's order
    return [sorted(g, key=lambda r: order[id(r)]) for g in groups.values()], named


def _ieee_passes(row: Row) -> bool:
    """A row without a case that fails with TF32 products and passes with IEEE ones."""
    return not row.get("case") and bool((row.get("figures") or {}).get("ieee_products_pass"))


def _lengths(group: list[Row]) -> tuple[tuple[str, int], ...]:
    """(check, the first N it fails at) for the rows of the checks at length."""
    firsts = [(r["name"], (r.get("figures") or {}).get("first_failing_n")) for r in group]
    return tuple((name, int(n)) for name, n in firsts if n is not None)


def _sampler(row: Row) -> dict[str, Any]:
    return row.get("sampler") or {}


def _kind(group: list[Row], severity: str) -> str:
    stopped = [r for r in group if r.get("stopped")]
    if stopped:
        return "hung" if stopped[0]["detail"].startswith("hung") else "crashed"
    if any(r.get("cause") == "cost" for r in group):
        return "cost"
    if any(r["name"].startswith("sampler") for r in group):
        return "sampler"
    if all(r["name"] == "rate" for r in group):
        return "rate"
    return severity


def _effects(group: list[Row], named: dict[int, Cause]) -> tuple[Effect, ...]:
    """The named cause's effects, one per (effect, precision), the worst first."""
    rows = [r for r in group if id(r) in named]
    parts: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        cause = named[id(row)]
        parts.setdefault((cause.effect, cause.compute), []).append(row)

    def rank(part: list[Row]) -> tuple:
        severities = [r.get("severity") or "wrong" for r in part]
        return (
            min(REGIMES.index(_regime(r)) for r in part),
            min(SEVERITIES.index(s) for s in severities),
        )

    effects = []
    for part in sorted(parts.values(), key=rank):
        shown = min(part, key=lambda r: (REGIMES.index(_regime(r)), not r.get("worst"), _size(r)))
        regime, severity = (t[i] for t, i in zip((REGIMES, SEVERITIES), rank(part), strict=True))
        effects.append(
            Effect(
                named[id(shown)],
                tuple(dict.fromkeys(d for r in part if (d := _dtype(r)))),
                tuple(dict.fromkeys(r["name"] for r in part)),
                shown.get("case"),
                shown.get("reproduce"),
                severity,
                regime,
            )
        )
    return tuple(effects)


def _sampler_text(group: list[Row]) -> str:
    """A sampler's finding in one line: the sampler, the W it drew and what fails."""
    drew = _sampler(group[0])
    failing = [r["name"].removeprefix("sampler ") for r in group if r["name"] != "rate"]
    rate = "; the rate check, which drew W from it, fails too" if len(failing) < len(group) else ""
    m, d = drew.get("shape", ("?", "?"))
    return (
        f"{drew.get('target')} (claims {drew.get('claim')} rows; {drew.get('draws')} draws of "
        f"W ({m}, {d}) from seed {drew.get('seed')}) fails {' and '.join(failing)}{rate}"
    )


def _rate_text(row: Row) -> str:
    drew = _sampler(row)
    source = drew.get("target") or "the project's iid sampler"
    ms = drew.get("m") or []
    span = f", m = {ms[0]} to {ms[-1]}" if ms else ""
    _, d = drew.get("shape", ("m", "?"))
    return (
        f"with W from {source} ({drew.get('draws')} draws of (m, {d}) per m{span}, seeds from "
        f"{drew.get('seed')}): {row['detail']}"
    )


def _cost_text(row: Row) -> str:
    """A cost finding in one line: the claim and the growth counted."""
    figures, claim = row.get("figures") or {}, row.get("claim")
    if row["name"] != "scaling" or claim not in EXPECTED_SLOPE:
        return row["detail"]
    target, grows = EXPECTED_SLOPE[claim], []
    flops, memory = figures.get("flops_slope"), figures.get("bytes_slope")
    if flops is not None and abs(flops - target) > SLOPE_TOLERANCE:
        grows.append(f"FLOPs grow as N^{flops:.2f}")
    if memory is not None and memory > target + SLOPE_TOLERANCE:
        grows.append(f"peak bytes as N^{memory:.2f}")
    span = row["detail"].split(" over ")[-1].split(";")[0]
    return f"claims {claim} cost; {' and '.join(grows) or row['detail']} (over {span})"


def _text(kind: str, group: list[Row]) -> str | None:
    if kind == "cost":  # the scaling row's words first, the others' named by their check
        texts = [_cost_text(r) if r["name"] == "scaling" else f"{r['name']}: {r['detail']}"
                 for r in sorted(group, key=lambda r: r["name"] != "scaling")]  # fmt: skip
        return "; ".join(dict.fromkeys(texts))
    if kind == "sampler":
        return _sampler_text(group)
    if kind == "rate":
        return _rate_text(group[0])
    if kind in ("hung", "crashed"):  # the detail says so first
        return group[0]["detail"].removeprefix(f"{kind}: ")
    return None


def _in_decay(group: list[Row]) -> bool:
    """Whether the group's float64 rows wrong in exact arithmetic were each right on the
    same inputs without decay, where that experiment ran (checks/agreement.py)."""
    ran = [f["right_without_decay"] for r in group if _wrong_in_float64(r)
           if "right_without_decay" in (f := r.get("figures") or {})]  # fmt: skip
    return bool(ran) and all(ran)


def _dtype_limit(rows: list[Row], shown: Row) -> str:
    """ " (...: --dtypes ...)" for a contract failure that raised on a dtype every case of
    whose accuracy panel broke the contract, while every other dtype's panel passed: an
    undeclared limit, and the option that declares it; else ""."""
    dtype = _dtype(shown)
    if shown["name"] != "contract" or shown.get("cause") != "contract" or not dtype:
        return ""
    panels = {r["name"].removeprefix("accuracy "): r for r in rows
              if r["name"].startswith("accuracy ")}  # fmt: skip
    others = [d for d in panels if d != dtype]
    mine = panels.get(dtype, {})
    figures = mine.get("figures") or {}
    every = mine.get("status") == DEPENDS and figures.get("covered") == figures.get("cases")
    if not every or not others or any(panels[d]["status"] != "pass" for d in others):
        return ""
    return (
        f" (it raises on {dtype} inputs and passes in {', '.join(others)}: if it does not "
        f"take {dtype}, declare the dtypes it takes, --dtypes {' '.join(others)})"
    )


def findings(rows: list[Row], spec: Spec | None = None) -> list[Finding]:
    """The failing rows as findings, ranked (module docstring); `spec`, the spec claimed,
    names the causes it can (causes.py)."""
    groups, named = _groups(rows, spec)
    out = []
    for group in groups:
        effects = _effects(group, named)
        # the row shown: the first effect's, else the smallest case of the mildest regime
        # judged against the exact reference (its worst element shown), else the smallest
        exact = any(_wrong_in_float64(r) for r in group) and not effects
        shown = min(
            group,
            key=lambda r: (
                not (effects and r.get("case") == effects[0].case and id(r) in named),
                REGIMES.index(_regime(r)),
                not (exact and _wrong_in_float64(r)),
                not r.get("worst"),
                _size(r),
            ),
        )
        severity = min((r.get("severity") or "wrong" for r in group), key=SEVERITIES.index)
        kind = _kind(group, severity)
        shares = [share for share in map(_relative, group) if share is not None]
        others = [r for r in group if r is not shown]
        out.append(
            Finding(
                severity=severity,
                regime=min((_regime(r) for r in group), key=REGIMES.index),
                checks=tuple(dict.fromkeys(r["name"] for r in group)),
                detail=shown.get("detail", "") + _dtype_limit(rows, shown) + shown.get("limit", ""),
                relative_error=_relative(shown),
                case=shown.get("case"),
                reproduce=shown.get("reproduce"),
                worst=shown.get("worst"),
                kind=kind,
                effects=effects,
                text=_text(kind, group),
                details=tuple(r["detail"] for r in others),
                reproduces=tuple(
                    dict.fromkeys(r["reproduce"] for r in group if r.get("reproduce"))
                ),
                check_regimes=tuple((r["name"], _regime(r)) for r in group),
                dtypes=tuple(d for d in UNIT_ROUNDOFF if d in {_dtype(r) for r in group}),
                exact=exact and any(_dtype(r) not in (None, "float64") for r in group),
                in_decay=_in_decay(group),
                limit=any(r.get("limit") for r in group),
                lengths=_lengths(group),
                largest_error=max(shares, default=None),
            )
        )
    out.sort(
        key=lambda f: (
            REGIMES.index(f.regime),
            not f.is_contract,  # the contract first: what else failed may be its doing
            SEVERITIES.index(f.severity),
            -(f.largest_error if f.largest_error is not None else 0.0),
        )
    )
    return out
