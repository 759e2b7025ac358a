"""Vet a kernel from another project's test suite:

    from linattn_verify.testing import assert_linear_attention

    def test_my_kernel():
        assert_linear_attention(my_attention, feature_map="elu", causal=True)

It runs vet's plan in this process (the callable needs not be importable by name) and raises
AssertionError with vet's summary when a check fails. The pytest plugin
(linattn_verify.pytest_plugin) adds the `--impl` options to any pytest run.
"""

from __future__ import annotations

from collections.abc import Callable

from .checks.long_context import LONGEST
from .strategies import DTYPES
from .under_test import resolve
from .vet import VetOptions, VetReport, vet_in_process


def assert_linear_attention(
    fn: Callable,
    feature_map: str,
    causal: bool = False,
    eps: float = 0.0,
    layout: str = "bhnd",
    dtypes: tuple[str, ...] = DTYPES,
    device: str = "cpu",
    cost: str | None = None,
    thorough: bool = False,
    fail_on: str = "typical",
    strict: bool = False,
    longest: int = LONGEST,
    state: str | None = None,
    varlen: bool = False,
) -> VetReport:
    """Every applicable check of vet on fn (docs/contract.md) claiming the spec; the report
    when the verdict passes, AssertionError with the summary when it fails. cost: "linear"
    or "quadratic" (default: quadratic for softmax, else linear). fail_on: the regime up
    to which findings fail (default typical: the others are warnings in the report);
    strict: every regime, elu features held to relative accuracy (vet --strict). longest:
    the long-context check to N = longest and longest + 1 (0 skips it; vet --long). state:
    the layout of the state fn carries, "Sz" (vet --state Sz; docs/contract.md). varlen: fn
    also takes packed batches (vet --varlen)."""
    impl = resolve(fn, feature_map=feature_map, causal=causal, eps=eps, layout=layout,
                   cost=cost, state=state, varlen=varlen)  # fmt: skip
    options = VetOptions(dtypes=tuple(dtypes), device=device, thorough=thorough,
                         fail_on=fail_on, strict=strict, envelope=False,
                         longest=longest)  # fmt: skip
    report = vet_in_process(impl, options)
    if report.failed:
        raise AssertionError(report.summary())
    return report
