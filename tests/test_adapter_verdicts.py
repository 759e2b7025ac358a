"""The third-party verdicts, checked on every run (array-api-tests style): vet every installed
adapter (`vet ADAPTER --kat`, in process) and compare what it finds (the checks that fail
the default verdict, the top finding, the float32 envelope) with
linattn_verify/adapters/expected.txt. The verdict table of docs/adapters.md is written from the
same file (`make readme-verdicts`), and a test below keeps the two equal."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from linattn_verify.adapters import ADAPTERS, AdapterUnavailable
from linattn_verify.adapters.expected import (
    EXPECTED_FILE,
    HEADER,
    LONG_CPU,
    LONG_TRITON,
    LONG_TRITON_DELTA,
    Expected,
    keys,
    load_expected,
    long_variant,
    record,
    verdict_table,
)
from linattn_verify.checks.long_context import LONGEST, default_longest
from linattn_verify.cli.adapters import verdict_of
from linattn_verify.families import family_of
from linattn_verify.vet.envelope import SPAN, STEPS
from linattn_verify.vet.verdicts import measured_verdict

EXPECTED = load_expected()
PAGE = Path(__file__).resolve().parents[1] / "docs" / "adapters.md"  # the verdict table


def test_every_line_names_an_adapter():
    """Lines that match no adapter or variant are reported (a renamed adapter leaves them
    behind)."""
    unknown = sorted(set(EXPECTED) - set(keys(ADAPTERS)))
    for name in unknown:
        warnings.warn(f"{EXPECTED_FILE.name}: {name} matches no adapter", stacklevel=1)
    assert EXPECTED and len(unknown) < len(EXPECTED)


# The searches are derandomised and see the same modules wherever they run
# (checks.search.import_whole_package), so the figures repeat on a machine of this kind up
# to how expected.txt records them: a share to 3 significant digits, an envelope end to one
# bisection step of the envelope (vet/envelope.py) or 3 significant digits
SHARE_FACTOR = 1 + 5e-3
ENVELOPE_FACTOR = max(10 ** (SPAN / 2**STEPS), SHARE_FACTOR)


@pytest.mark.parametrize("name", [n for n, a in ADAPTERS.items() if not a.triton])
def test_vet_finds_what_the_file_expects(name: str):
    try:
        measured, report = measured_verdict(name)
    except AdapterUnavailable as err:
        pytest.skip(f"{name}: {err}")
    expected = EXPECTED.get(name, Expected())
    passes = [
        f"{EXPECTED_FILE.name}:{expected.lines[c]}: {name}::{c} is expected to fail, but passes"
        for c in sorted(expected.failing - measured.failing)
    ]
    fails = [
        f"{name}::{c} fails, and {EXPECTED_FILE.name} has no such line"
        for c in sorted(measured.failing - expected.failing - expected.maybe)
    ]
    assert not passes + fails, "\n".join(passes + fails) + "\n" + report.summary()
    assert _same_top(measured.top, expected.top), (measured.top, expected.top, report.summary())
    assert _same_envelope(measured.envelope, expected.envelope), (measured, expected)


# Triton adapters whose kernels are another's, called through a thin wrapper: CI vets the
# other (the wrapper's verdict stays recorded, `pytest -m all_variants` checks it)
SAME_KERNEL_AS = {
    # fla/ops/common/fused_recurrent.py, through simple_gla/fused_recurrent.py
    "fla.simple-gla-fused-recurrent-gamma": "fla.simple-gla-fused-recurrent",
    "fla.retention-fused-recurrent": "fla.simple-gla-fused-recurrent",
    "fla.gla-fused-recurrent": "fla.simple-gla-fused-recurrent",
    # the same, its normaliser linear_attn/utils.py's as fla.linear-attn-chunk's
    "fla.linear-attn-fused-recurrent": "fla.simple-gla-fused-recurrent",
    # chunk_simple_gla (fla/ops/simple_gla/chunk.py)
    "fla.simple-gla-chunk-gamma": "fla.simple-gla-chunk",
    "fla.retention-chunk": "fla.simple-gla-chunk",
}


def _in_ci(name: str) -> bool:
    """Whether CI vets this Triton adapter: not one of SAME_KERNEL_AS, nor a stepwise
    family's (Family.stepwise: the delta rule's and the IPLR rule's, a minute and more each
    at the smallest plan in the interpreter, twelve minutes for the delta rule's seven: more
    than CI's whole margin); `pytest -m all_variants` runs them."""
    return name not in SAME_KERNEL_AS and not family_of(ADAPTERS[name].spec).stepwise


def test_ci_vets_the_kernel_each_wrapper_shares():
    """Each adapter CI leaves out for SAME_KERNEL_AS names one that CI vets."""
    assert all(_in_ci(other) and other in ADAPTERS for other in SAME_KERNEL_AS.values())


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=() if _in_ci(n) else pytest.mark.all_variants)
        for n, a in ADAPTERS.items()
        if a.triton
    ],
)
def test_a_triton_kernel_fails_no_check_the_file_does_not_expect(name: str):
    """A Triton kernel in the interpreter, at vet's smallest plan (every check on one
    typical case per dtype, seconds a call): its failing checks are among those
    expected.txt records from the default plan (`adapters --record`, minutes a kernel), and
    it fails if and only if they do; its top finding's severity and regime are theirs."""
    try:
        measured, report = measured_verdict(name, smallest=True)
    except AdapterUnavailable as err:
        pytest.skip(f"{name}: {err}")
    expected = EXPECTED.get(name, Expected())
    unexpected = sorted(measured.failing - expected.failing - expected.maybe)
    assert not unexpected, f"{name} fails {unexpected}, not expected:\n{report.summary()}"
    assert bool(measured.failing - expected.maybe) == bool(expected.failing), report.summary()
    assert (measured.top or ())[:2] == (expected.top or ())[:2], (measured.top, expected.top)


VARIANTS = [k for k in keys(ADAPTERS) if " " in k]
# CI checks the --tf32 variant (seconds each) of every kernel with a tl.dot, the only
# operation TF32 rounds (fla's fused-recurrent kernels, fla/ops/common/fused_recurrent.py
# and the files calling it, have none: their --tf32 verdict is their float32 one), and the
# --grad and --varlen ones of one kernel (30 to 70 s each in the interpreter);
# `pytest -m all_variants` the others (conftest.py skips them otherwise)
CI_SAMPLE = "fla.simple-gla-chunk"
WITHOUT_TL_DOT = "-fused-recurrent"  # the adapters whose kernels have no tl.dot
# chunk_gla's --tf32 run (30 s in the interpreter): its products are tl.dots of the shape
# and precision of chunk_simple_gla's, whose --tf32 verdict CI checks
TF32_AS_SAMPLE = ("fla.gla-chunk",)


def _variant(key: str):
    name = key.split()[0]
    tf32 = "--tf32" in key and WITHOUT_TL_DOT not in name and name not in TF32_AS_SAMPLE
    sampled = tf32 or name == CI_SAMPLE
    sampled = sampled and _in_ci(name) and "--long" not in key  # at length: minutes each
    return pytest.param(key, marks=() if sampled else pytest.mark.all_variants)


def test_the_long_variants_run_the_plans_lengths():
    """The adapters' long-context verdicts are at the lengths vet's plans take."""
    assert LONG_CPU.endswith(f"--long {LONGEST}")
    assert LONG_TRITON.endswith(f"--long {default_longest(interpreted=True)}")
    assert LONG_TRITON_DELTA.endswith(f"--long {default_longest(True, smallest=True)}")


def test_every_variant_is_recorded():
    """A variant's verdict is in the file (its reason line at least) once recorded: absent,
    it would read as a pass."""
    missing = [k for k in VARIANTS if k not in EXPECTED]
    assert not missing, (
        f"not in {EXPECTED_FILE.name}: {missing} (adapters --record 'KEY', then a line "
        "'# KEY: why' for its reason)"
    )


@pytest.mark.parametrize("key", [_variant(k) for k in VARIANTS])
def test_a_variant_fails_what_the_file_expects(key: str):
    """A variant (`vet NAME OPTIONS`): one recorded at the smallest plan
    fails exactly the checks expected.txt names; one recorded at the default plan (--tf32)
    is run at the smallest and held to it as test_a_triton_kernel_fails_no_check_... holds
    the default verdict (the smallest plan's cases are typical: a top finding in stress
    inputs is not expected there)."""
    smallest = "--smallest" in key.split()
    try:
        measured, report = verdict_of(key if smallest else f"{key} --smallest")
    except AdapterUnavailable as err:
        pytest.skip(f"{key}: {err}")
    expected = EXPECTED.get(key, Expected())
    unexpected = sorted(measured.failing - expected.failing - expected.maybe)
    missed = sorted(expected.failing - measured.failing) if smallest else []
    assert not unexpected + missed, f"{key}: {unexpected} fail, {missed} pass:\n{report.summary()}"
    assert bool(measured.failing - expected.maybe) == bool(expected.failing), report.summary()
    top = expected.top if smallest or (expected.top or ("", ""))[1] == "typical" else None
    assert (measured.top or ())[:2] == (top or ())[:2], (measured.top, expected.top)


def _same_top(measured, expected) -> bool:
    if measured is None or expected is None:
        return measured == expected
    if measured[:2] != expected[:2]:
        return False
    a, b = measured[2], expected[2]
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return a == b
    return a == b == 0 or (a > 0 and b > 0 and 1 / SHARE_FACTOR <= a / b <= SHARE_FACTOR)


def _same_envelope(measured, expected) -> bool:
    if measured is None or expected is None:
        return measured == expected
    return all(1 / ENVELOPE_FACTOR <= a / b <= ENVELOPE_FACTOR for a, b in zip(measured, expected))


def test_the_docs_table_is_the_expected_file():
    table = verdict_table(ADAPTERS, EXPECTED)
    assert table in PAGE.read_text(), "docs/adapters.md's table is stale: make readme-verdicts"


def test_every_row_of_the_table_says_what_a_maintainer_would_fix():
    """The table's first column: every adapter's row and every recorded variant's (and any
    other entry of the file) has a line '# KEY fix: ...' in expected.txt."""
    rows = [k for k in keys(ADAPTERS) if " " not in k or k in EXPECTED]
    missing = [k for k in dict.fromkeys([*rows, *EXPECTED]) if not EXPECTED.get(k, Expected()).fix]
    assert not missing, (
        f"no fix in {EXPECTED_FILE.name} for {missing}: add a line '# KEY fix: ...' (what the "
        "library's maintainer would change, or 'nothing: ...') below its reason"
    )


def test_the_table_gives_the_fix_first():
    name = next(iter(ADAPTERS))
    variant = f"{name} {long_variant(ADAPTERS[name])}"
    expected = {name: Expected(fix="drop | the eps"), variant: Expected(fix="as above")}
    header, _, default, long = verdict_table({name: ADAPTERS[name]}, expected).splitlines()
    assert header.startswith("| what a maintainer would fix | adapter")
    assert default.startswith(f"| drop \\| the eps | `{name}` (")
    assert long.startswith(f"| as above | `{variant}` | as above |")
    table = verdict_table({name: ADAPTERS[name]}, {name: Expected()})
    assert table.splitlines()[2].startswith(f"| - | `{name}` (")  # no fix line: "-"


def test_record_keeps_the_reasons_and_fixes(tmp_path: Path):
    """`adapters --record` rewrites the facts and keeps what people wrote: the reasons and
    the fixes (a variant's too, whose last option could read " fix" as its value)."""
    grad = "lib.f --state --grad --smallest"
    old = tmp_path / "old.txt"
    old.write_text(
        f"{HEADER}\n# lib.f: why it fails\n# lib.f fix: drop the eps\nlib.f::reference\n"
        f"\n# {grad}: the backward too\n# {grad} fix: as above\n{grad}::gradient\n"
    )
    kept = load_expected(old)
    assert set(kept) == {"lib.f", grad}
    assert (kept["lib.f"].fix, kept[grad].fix) == ("drop the eps", "as above")
    measured = {"lib.f": Expected(failing={"contract"}), grad: Expected()}
    new = tmp_path / "new.txt"
    new.write_text(record(measured, kept))
    again = load_expected(new)
    assert {k: (e.reason, e.fix, e.failing) for k, e in again.items()} == {
        "lib.f": ("why it fails", "drop the eps", {"contract"}),
        grad: ("the backward too", "as above", set()),
    }
    assert record(again, again) == new.read_text()


def test_recording_the_file_again_keeps_it():
    """expected.txt is as record() writes it: its reasons and fixes survive a re-recording."""
    assert record(EXPECTED, EXPECTED) == EXPECTED_FILE.read_text()
