"""Testing the tester (DESIGN): every broken implementation of the zoo is rejected by some
check, and no correct one is flagged. Each entry runs through every applicable check (the
regime's corner cases, then a derandomised Hypothesis search of SEARCH_EXAMPLES cases;
checks/search.py), so the kill table printed at the end of the run names every check
that kills each mutant.
"""

from __future__ import annotations

import sys

import pytest

from linattn_verify.checks import Implementation
from linattn_verify.checks.search import run_suite
from linattn_verify.specs import Spec
from tests.zoo import ZOO, Entry


def _implementation(entry: Entry) -> Implementation:
    spec = Spec(entry.feature_map, causal=entry.causal, eps=entry.eps)
    module = sys.modules[getattr(entry.fn, "func", entry.fn).__module__]
    attr = next(name for name, value in vars(module).items() if value is entry.fn)
    command = f"--impl {module.__name__}:{attr} --feature-map {spec.feature_map}"
    command += " --causal" * spec.causal + (f" --eps {spec.eps!r}" if spec.eps else "")
    stream = None if entry.stream is None else (lambda max_len, w: entry.stream())
    return Implementation(entry.fn, spec, entry.name, command, stream=stream)


@pytest.mark.parametrize("entry", ZOO, ids=[e.name for e in ZOO])
def test_zoo_entry_is_judged_right(entry: Entry, record_property):
    results = run_suite(_implementation(entry))
    killers = [name for name, result in results.items() if result is not None]
    record_property("zoo", {"name": entry.name, "broken": entry.broken, "killed_by": killers})
    if entry.broken:
        assert killers, f"{entry.name} ({entry.bug}) passed every check: {sorted(results)}"
    else:
        reports = "\n".join(results[name].report() for name in killers)
        assert not killers, f"the correct {entry.name} was flagged:\n{reports}"


def test_the_zoo_is_big_enough():
    broken = [e for e in ZOO if e.broken]
    assert len(broken) >= 15 and len(ZOO) - len(broken) >= 5
    assert len({e.name for e in ZOO}) == len(ZOO)
