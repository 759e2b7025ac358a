"""Testing the tester (docs/architecture.md): vet rejects every broken zoo entry for the
right reason (its bug's checks, `caught_by`, fail with a severity, in the regime the entry
names and no milder one) and passes every correct one by default, the textbook ones
included (their robustness findings are warnings). A bug on typical inputs fails the
default verdict and ranks first; one that shows only in stress or extreme inputs is a
warning that fails the verdict at its own regime (--fail-on). Each entry goes through vet's
whole plan in process (every applicable check over the corner cases, vet's cases and a
derandomised search of VET_EXAMPLES cases per regime; accuracy per dtype; cost scaling
against the entry's claimed growth), so the kill table printed at the end of the run names
everything that fails or warns about each one.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from linattn_verify.checks import ALL_CHECKS, GRAD_CHECKS
from linattn_verify.checks.gradient_length import NAME as GRADIENT_LENGTH
from linattn_verify.checks.long_context import LONGEST
from linattn_verify.checks.long_context import NAME as LONG_CONTEXT
from linattn_verify.regimes import REGIMES
from linattn_verify.results import SEVERITIES
from linattn_verify.under_test import Implementation, resolve
from linattn_verify.vet import VetOptions, vet_in_process
from linattn_verify.vet.tasks import AUTOTUNE_CONFIGS, INT32_OFFSETS
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
        state=entry.state,
        step=entry.step,
        varlen=entry.varlen,
        decay=entry.decay,
        normalize=entry.normalize,
        scale=entry.scale,
        delta_rule=entry.delta_rule,
        value_heads=entry.value_heads,
        family=entry.family,
        **dict(entry.claim),
        triton="interpret" if entry.triton else None,
        tf32=entry.tf32,
    )


def _advised(impl: Implementation, words: tuple[str, ...]) -> Implementation:
    """The implementation claiming what a finding advises (Cause.advice)."""
    option, value = words
    name, parse = {"--eps": ("eps", float), "--dot-precision": ("dot_precision", str),
                   "--stored": ("stored", str)}[option]  # fmt: skip
    return replace(impl, spec=replace(impl.spec, **{name: parse(value)}))


# a figure or threshold printed as infinite ("inf", "-inf"), not as what is not finite
INFINITE = re.compile(r"(?<![\w.])[-+]?inf(?!\w)")


def assert_readable(summary: str) -> None:
    """No None in vet's summary, and no failing line that gives an infinite figure against
    an infinite threshold where it should say what is not finite."""
    assert not re.search(r"\bNone\b", summary), summary
    unreadable = [
        line for line in summary.splitlines() if "FAIL" in line and len(INFINITE.findall(line)) >= 2
    ]
    assert not unreadable, "\n".join(unreadable)


def _spec_order(entry: Entry) -> tuple:
    """Entries of one spec side by side: a worker judging them in turn reuses the exact
    references and bounds of the cases they share (accuracy/, checks/long_context.py)."""
    spec = (entry.feature_map, entry.causal, entry.normalize, str(entry.decay), str(entry.state))
    spec += (entry.delta_rule, str(entry.family), str(entry.claim))
    return (*spec, entry.long, entry.grad, entry.name)


@pytest.mark.parametrize("entry", sorted(ZOO, key=_spec_order), ids=lambda e: e.name)
def test_vet_judges_the_zoo_entry_right(entry: Entry, record_property):
    options = VetOptions(
        grad=entry.grad,
        envelope=False,
        longest=(None if entry.triton else LONGEST) if entry.long else 0,  # None: the plan's
        long_grad=None if entry.long else 0,
        smallest=entry.triton or entry.smallest,  # Triton: seconds a call in the interpreter
    )
    report = vet_in_process(implementation(entry), options)
    found = report.findings
    killers = [row["name"] for row in report.failed]
    warned = [f"{c} ({f.regime})" for f in found if f.regime != "typical" for c in f.checks]
    record_property(
        "zoo", {"name": entry.name, "broken": entry.broken, "killed_by": killers, "warned": warned}
    )
    summary = report.summary()
    assert_readable(summary)
    assert_readable(report.summary(verbose=True))
    if not entry.broken:
        assert not killers, f"the correct {entry.name} was flagged:\n{summary}"
        # one screen: at most 20 lines with the envelope's (one line, not run here)
        assert len(summary.splitlines()) <= 20 - 1, summary
        return
    # the entry's checks fail in its regime, and in no milder one (a check's own rows: one
    # finding may span regimes, its cause named in several)
    shown = {c: f for f in reversed(found) for c in f.checks}  # the mildest finding per check
    mildest: dict[str, str] = {}
    for check, regime in (pair for f in found for pair in f.check_regimes):
        mildest[check] = min(regime, mildest.get(check, regime), key=REGIMES.index)
    wrong_place = {c: mildest.get(c, "nowhere") for c in entry.caught_by}
    wrong_place = {c: r for c, r in wrong_place.items() if r != entry.regime}
    assert not wrong_place, f"{entry.name} ({entry.bug}): {wrong_place}:\n{report.summary()}"
    assert all(shown[c].severity in SEVERITIES for c in entry.caught_by)
    at_its_regime = replace(report, failing_regimes=REGIMES[: REGIMES.index(entry.regime) + 1])
    assert at_its_regime.verdict == "fail", at_its_regime.summary()
    if entry.regime == "typical":  # a bug on typical inputs outranks every robustness warning
        assert report.verdict == "fail" and found[0].regime == "typical", report.summary()
    else:  # a robustness bug: warned, not rejected, by default
        assert report.verdict == "pass", report.summary()
    if entry.grad:  # a backward bug under a right forward: only the gradient checks see it
        assert set(killers) <= {*GRAD_CHECKS, GRADIENT_LENGTH}, report.summary()
    for words in {words for f in found for words in f.advice}:  # issue 51, item 1
        again = vet_in_process(_advised(implementation(entry), words), options)
        again = replace(again, failing_regimes=at_its_regime.failing_regimes)
        still = set(entry.caught_by) & {row["name"] for row in again.failed}
        assert still, f"vet's advice {words} rescues {entry.name}:\n{summary}"


def test_the_zoo_is_big_enough():
    broken = [e for e in ZOO if e.broken]
    assert len(broken) >= 15 and len(ZOO) - len(broken) >= 5
    assert len({e.name for e in ZOO}) == len(ZOO)
    for entry in broken:  # each bug names the checks it must fail, and they exist
        known = {*ALL_CHECKS, "scaling", *([LONG_CONTEXT, GRADIENT_LENGTH] if entry.long else [])}
        known |= {AUTOTUNE_CONFIGS, INT32_OFFSETS} if entry.triton else set()
        assert entry.caught_by and set(entry.caught_by) <= known, entry.name
    assert (
        sum(e.grad and e.broken for e in ZOO) >= 3
        and sum(e.grad and not e.broken for e in ZOO) >= 2
    )
    assert all(e.regime in REGIMES for e in ZOO)
    long = [e for e in ZOO if e.long]  # long-context bugs and correct long kernels
    assert sum(e.broken for e in long) >= 6 and sum(not e.broken for e in long) >= 4
    state = [e for e in ZOO if e.state]  # carried-state bugs and correct stateful kernels
    assert sum(e.broken for e in state) >= 5 and sum(not e.broken for e in state) >= 3
    packed = [e for e in ZOO if e.varlen]  # packed-batch bugs and correct varlen kernels
    assert sum(e.broken for e in packed) >= 4 and sum(not e.broken for e in packed) >= 2
    decayed = [e for e in ZOO if e.decay]  # decay bugs and correct decayed kernels
    assert sum(e.broken for e in decayed) >= 5 and sum(not e.broken for e in decayed) >= 3
