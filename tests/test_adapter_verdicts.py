"""The third-party verdicts, checked on every run (array-api-tests style): vet every installed
adapter (`vet ADAPTER --kat`, in process) and compare its failing checks with
linattn_verify/adapters/expected.txt, line by line. The README's table is written from the
same file (`make readme-verdicts`), and a test below keeps the two equal."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from linattn_verify.adapters import ADAPTERS, AdapterUnavailable
from linattn_verify.adapters.expected import EXPECTED_FILE, Expected, load_expected, verdict_table
from linattn_verify.under_test import resolve
from linattn_verify.vet import VetOptions, vet_in_process

EXPECTED = load_expected()
README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_line_names_an_adapter():
    """Lines that match no adapter are reported (a renamed adapter leaves them behind)."""
    unknown = sorted(set(EXPECTED) - set(ADAPTERS))
    for name in unknown:
        warnings.warn(f"{EXPECTED_FILE.name}: {name} matches no adapter", stacklevel=1)
    assert EXPECTED and len(unknown) < len(EXPECTED)


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_vet_fails_exactly_the_expected_checks(name: str):
    adapter = ADAPTERS[name]
    if adapter.device == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"{name} needs CUDA (make device-check vets it)")
    try:
        impl = resolve(name)
    except AdapterUnavailable as err:
        pytest.skip(f"{name}: {err}")
    device = "cuda" if adapter.device == "cuda" else "cpu"
    report = vet_in_process(impl, VetOptions(kat=True, device=device))
    failing = {row["name"] for row in report.failed}
    expected = EXPECTED.get(name, Expected())
    planned = {row["name"] for row in report.rows}
    for check in sorted(expected.failing - planned):
        warnings.warn(
            f"{EXPECTED_FILE.name}:{expected.lines[check]}: {name}::{check} matches no row "
            "of vet's plan",
            stacklevel=1,
        )
    passes = [
        f"{EXPECTED_FILE.name}:{expected.lines[c]}: {name}::{c} is expected to fail, but passes"
        for c in sorted((expected.failing & planned) - failing)
    ]
    fails = [
        f"{name}::{c} fails, and {EXPECTED_FILE.name} has no such line"
        for c in sorted(failing)
        if c not in expected.failing
    ]
    assert not passes + fails, "\n".join(passes + fails) + "\n" + report.summary()


def test_the_readme_table_is_the_expected_file():
    table = verdict_table(ADAPTERS, EXPECTED)
    assert table in README.read_text(), "README's adapter table is stale: make readme-verdicts"
