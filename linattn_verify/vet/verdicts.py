"""An adapter's verdict as adapters/expected.txt records it, measured: vet's default plan with
the known-answer vectors (the envelope in float32 only), on the device the adapter needs,
without the long-context check (minutes per adapter: adapters/expected.py's long variants
record it)."""

from __future__ import annotations

from ..adapters import ADAPTERS
from ..adapters.expected import Expected
from ..under_test import Implementation, resolve
from .envelope import envelope
from .outcome import VetReport
from .runner import VetOptions, vet_in_process

ENVELOPE_DTYPE = "float32"


def measured_verdict(name: str, smallest: bool = False) -> tuple[Expected, VetReport]:
    """What expected.txt would say of adapter `name`, and the report it comes from (with
    smallest: of vet's smallest plan, VetOptions.smallest, and no envelope); AdapterUnavailable
    when its library is missing (TritonUnavailable: triton)."""
    impl = resolve(name)
    device = "cuda" if ADAPTERS[name].triton and impl.triton is None else "cpu"
    options = VetOptions(kat=True, device=device, envelope=False, longest=0, smallest=smallest)
    measured, report = judged(impl, options)
    if not smallest:
        measured.envelope = _envelope(impl, device)
    return measured, report


def judged(impl: Implementation, options: VetOptions) -> tuple[Expected, VetReport]:
    """expected.txt's facts of vet's report on `impl` under `options` (no envelope), and the
    report."""
    report = vet_in_process(impl, options)
    found = report.findings
    top = None if not found else (found[0].severity, found[0].regime, found[0].relative_error)
    return Expected(failing={r["name"] for r in report.failed}, top=top), report


def _envelope(impl, device: str) -> tuple[float, float] | None:
    """The float32 envelope's ends, or None where it does not hold at sigma = 1."""
    (row,) = envelope(impl, device, (ENVELOPE_DTYPE,))
    figures = row["figures"]
    return None if figures["low"] is None else (figures["low"], figures["high"])
