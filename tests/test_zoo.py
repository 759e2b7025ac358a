"""Testing the tester (DESIGN): vet rejects every broken implementation of the zoo for the
right reason (among its failures are the checks the entry's bug must fail, `caught_by`), and
passes every correct one. Each entry goes through vet's whole plan in process (every
applicable check over the regime's corners, vet's cases and a derandomised search of
VET_EXAMPLES cases; accuracy per dtype; cost scaling against the entry's claimed growth),
so the kill table printed at the end of the run names everything that fails each mutant.
"""

from __future__ import annotations

import pytest

from linattn_verify.checks import ALL_CHECKS, GRAD_CHECKS
from linattn_verify.under_test import Implementation, resolve
from linattn_verify.vet import VetOptions, vet_in_process
from tests.zoo import ZOO, Entry


def implementation(entry: Entry) -> Implementation:
    """The entry as an in-process callable claiming its spec, cost and stream."""
    stream = None if entry.stream is None else (lambda max_len, w: entry.stream())
    return resolve(
        entry.fn,
        feature_map=entry.feature_map,
        causal=entry.causal,
        eps=entry.eps,
        cost=entry.cost,
        stream=stream,
    )


@pytest.mark.parametrize("entry", ZOO, ids=[e.name for e in ZOO])
def test_vet_judges_the_zoo_entry_right(entry: Entry, record_property):
    report = vet_in_process(implementation(entry), VetOptions(grad=entry.grad))
    killers = [row["name"] for row in report.failed]
    record_property("zoo", {"name": entry.name, "broken": entry.broken, "killed_by": killers})
    if entry.broken:
        missing = sorted(set(entry.caught_by) - set(killers))
        assert not missing, f"{entry.name} ({entry.bug}) passed {missing}:\n{report.summary()}"
        if entry.grad:  # a backward bug under a right forward: only the gradient checks see it
            assert set(killers) <= set(GRAD_CHECKS), report.summary()
    else:
        assert not killers, f"the correct {entry.name} was flagged:\n{report.summary()}"


def test_the_zoo_is_big_enough():
    broken = [e for e in ZOO if e.broken]
    assert len(broken) >= 15 and len(ZOO) - len(broken) >= 5
    assert len({e.name for e in ZOO}) == len(ZOO)
    for entry in broken:  # each bug names the checks it must fail, and they exist
        assert entry.caught_by and set(entry.caught_by) <= set(ALL_CHECKS), entry.name
    assert (
        sum(e.grad and e.broken for e in ZOO) >= 3
        and sum(e.grad and not e.broken for e in ZOO) >= 2
    )
