"""--compare OLD.json: what got less accurate, slower or broken since an earlier report.

Thresholds (a regression is reported, and the command exits 1, beyond them):
- ERROR_FACTOR: a max error more than 2x the old one, the old one taken as at least one
  rounding of the result (below that the output's own rounding decides): 1 unit of u s
  for outputs, each gradient's `rounding_floor` in units of u M for dq, dk and dv. The
  inputs are the same seeded numbers (a report made with another seed or sweep is not
  compared figure by figure), so on one machine the error is reproduced exactly; 2x is
  one bit lost.
- TIME_FACTOR: the median over the common N of new / old median times above 1.5, only
  when both curves passed the noise gate on the same device and torch; the gate itself
  lets the repeats at one N spread by 1.25x (scaling/timing.py).
- a counted FLOP or byte slope up by more than SLOPE_TOLERANCE (counts are exact, so any
  growth of the order shows);
- any pass that became a fail (accuracy, long sequences included, cost growth, a sampler's
  statistics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..scaling import SLOPE_TOLERANCE
from ..specs import SpecError

ERROR_FACTOR = 2.0
TIME_FACTOR = 1.5


@dataclass
class Comparison:
    against: str
    regressions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    compared: int = 0  # figures compared

    def to_dict(self) -> dict[str, Any]:
        return {
            "against": self.against,
            "regressions": self.regressions,
            "notes": self.notes,
            "compared": self.compared,
            "thresholds": {"error_factor": ERROR_FACTOR, "time_factor": TIME_FACTOR,
                           "slope_tolerance": SLOPE_TOLERANCE},
        }  # fmt: skip

    def markdown(self) -> list[str]:
        head = [
            f"## Regressions against {self.against}",
            "",
            f"{len(self.regressions)} regression(s) in {self.compared} figures compared "
            f"(errors beyond {ERROR_FACTOR:g}x, times beyond {TIME_FACTOR:g}x, slopes beyond "
            f"+{SLOPE_TOLERANCE:g}, any pass turned fail).",
            "",
        ]
        return head + [f"- **{r}**" for r in self.regressions] + [f"- {n}" for n in self.notes]


def _accuracy_key(row: dict[str, Any]) -> tuple:
    return row["device"], row["spec"], row["form"], row["dtype"], row["n"]


def compare(old: dict[str, Any], new: dict[str, Any], against: str) -> Comparison:
    """Regressions of `new` against `old` (two report.json documents)."""
    if old.get("schema") != new["schema"]:
        raise SpecError(
            f"{against} is not a {new['schema']!r} document (schema {old.get('schema')!r})"
        )
    result = Comparison(against)
    inputs = ("seed", "sweep")
    if any(old["environment"].get(k) != new["environment"].get(k) for k in inputs):
        result.notes.append(
            "not compared: the old report drew other inputs (its seed or sweep differs); "
            "rerun it with the same options"
        )
        return result
    _compare_errors(old["accuracy"]["rows"], new["accuracy"]["rows"], "u s", result)
    _compare_errors(
        old.get("long_context", {}).get("rows", []), new["long_context"]["rows"], "u s", result
    )
    _compare_errors(
        old.get("gradients", {}).get("rows", []), new["gradients"]["rows"], "u M", result
    )
    _compare_scaling(old, new, result)
    old_samplers = {s["sampler"]: s for s in old["random_features"].get("samplers", [])}
    for sampler in new["random_features"].get("samplers", []):
        before = old_samplers.get(sampler["sampler"])
        if before is not None:
            result.compared += 1
            if before["passed"] and not sampler["passed"]:
                result.regressions.append(f"{sampler['sampler']}: its statistics now fail")
    return result


def _errors(row: dict[str, Any]) -> list[tuple[str, float | None, float]]:
    """(what, max error, the error of one rounding) of a row: the output's, in units of u s
    (one rounding: at most 1), or each of dq, dk, dv in units of u M (its rounding_floor).
    None: infinite; no entry for a row that was not judged."""
    error = row.get("max_error")
    if isinstance(error, dict):
        return [(f"d{n} ", error[n], row["rounding_floor"][n]) for n in error]
    return [] if "max_error" not in row else [("", error, 1.0)]


def _compare_errors(
    old_rows: list[dict], new_rows: list[dict], units: str, result: Comparison
) -> None:
    """Accuracy or gradient rows: pass turned fail, or an error beyond ERROR_FACTOR times
    the old one (taken as at least one rounding)."""
    before = {_accuracy_key(r): r for r in old_rows}
    for row in new_rows:
        prior = before.pop(_accuracy_key(row), None)
        if prior is None:
            continue
        result.compared += 1
        where = "{1} {2} {3} N={4} ({0})".format(*_accuracy_key(row))
        if prior["passed"] and not row["passed"]:
            result.regressions.append(
                f"{where}: passed, now fails: " + row.get("error", row.get("message", ""))
            )
            continue
        old_errors = {what: error for what, error, _ in _errors(prior)}
        for what, new_error, floor in _errors(row):
            old_error = old_errors.get(what)
            if None in (new_error, old_error):  # infinite: the pass/fail flip judges
                continue
            if new_error > ERROR_FACTOR * max(old_error, floor):
                result.regressions.append(
                    f"{where}: {what}max error {old_error:.3g} -> {new_error:.3g} {units}"
                )
    if before:
        result.notes.append(
            f"{len(before)} figure(s) in {units} of the old report are not in this one"
        )


def _compare_scaling(old: dict[str, Any], new: dict[str, Any], result: Comparison) -> None:
    env_old, env_new = old["environment"], new["environment"]
    same_machine = all(
        env_old.get(k) == env_new.get(k) for k in ("device_name", "packages", "platform")
    )
    before = {(r["implementation"], r["device"]): r for r in old["scaling"]["rows"]}
    timed = False
    for row in new["scaling"]["rows"]:
        prior = before.get((row["implementation"], row["device"]))
        if prior is None:
            continue
        name = row["implementation"] + ("" if row["device"] == "cpu" else f" [{row['device']}]")
        result.compared += 1
        if prior["cost_passed"] and not row["cost_passed"]:
            why = row.get("error") or row["cost_message"]
            result.regressions.append(f"{name}: cost growth now fails: {why}")
        for what in ("flops_slope", "bytes_slope"):
            new_slope, old_slope = row.get(what), prior.get(what)  # None: not measured
            if None not in (new_slope, old_slope) and new_slope > old_slope + SLOPE_TOLERANCE:
                label = what.replace("_slope", "")
                result.regressions.append(
                    f"{name}: {label} ~ N^{old_slope:.3f} -> N^{new_slope:.3f}"
                )
        ratio = _time_ratio(prior, row)
        if ratio is not None and same_machine:
            timed = True
            result.compared += 1
            if ratio > TIME_FACTOR:
                result.regressions.append(f"{name}: {ratio:.2f}x slower (median over common N)")
    if not same_machine and any("seconds" in r for r in new["scaling"]["rows"]):
        result.notes.append(
            "timings not compared: the old report was made on another machine or software"
        )
    elif not timed and any("seconds" in r for r in new["scaling"]["rows"]):
        result.notes.append(
            "timings not compared: no pair of curves passed the noise gate in both reports"
        )


def _time_ratio(old: dict[str, Any], new: dict[str, Any]) -> float | None:
    """Median over the common N of new / old time, when both curves are trustworthy."""
    if old.get("time_status") != "ok" or new.get("time_status") != "ok":
        return None
    common = sorted(set(old["seconds"]) & set(new["seconds"]), key=int)
    if not common:
        return None
    return float(np.median([new["seconds"][n] / old["seconds"][n] for n in common]))
