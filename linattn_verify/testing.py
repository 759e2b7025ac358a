"""Vet a kernel from another project's test suite:

    from linattn_verify.testing import assert_linear_attention

    def test_my_kernel():
        assert_linear_attention(my_attention, feature_map="elu", causal=True)

It runs vet's plan in this process (the callable needs not be importable by name) and raises
AssertionError with vet's summary when a check fails. The pytest plugin
(linattn_verify.pytest_plugin) adds the `--impl` options to any pytest run.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable

from .grammar import checked
from .run_options import OPTIONS, RUN
from .strategies import DTYPES
from .under_test import resolve
from .under_test.claim import CLAIM
from .vet import VetOptions, VetReport, vet_in_process


def assert_linear_attention(
    fn: Callable,
    feature_map: str,
    *,
    causal: bool = False,
    eps: float = 0.0,
    normalize: bool = True,
    scale: float | str = 1.0,
    decay: str | None = None,
    dot_precision: str | None = None,
    delta_rule: bool = False,
    qk_l2norm: bool = False,
    value_heads: int = 1,
    stored: str | None = None,
    z_gate: bool = False,
    dt_softplus: bool = False,
    dt_min: float = 0.0,
    dt_max: float = math.inf,
    family: str | None = None,
    layout: str = "bhnd",
    cost: str | None = None,
    state: str | None = None,
    step: str | None = None,
    varlen: bool = False,
    triton: str | None = None,
    tf32: bool = False,
    max_head_dim: int | None = None,
    even_dims_backward: bool = False,
    grad: bool = False,
    longest: int | None = None,
    long_grad: int | None = None,
    dtypes: tuple[str, ...] = DTYPES,
    device: str = "cpu",
    thorough: bool = False,
    smallest: bool = False,
    fail_on: str = "typical",
    strict: bool = False,
) -> VetReport:
    """Every applicable check of vet on fn (docs/contract.md) claiming the spec; the report
    when the verdict passes, AssertionError with the summary when it fails, SpecError (a
    ValueError) naming an option whose value does not fit. Besides the options below, as
    vet's: dtypes, device, thorough (more cases a check), smallest (every check on one
    typical case per dtype, no search: for Triton's interpreter), fail_on (the regime up to which
    findings fail; default typical, the others are warnings in the report) and strict
    (every regime, elu features held to relative accuracy)."""
    given = locals()  # the parameters by name
    __tracebackhide__ = True  # pytest shows the summary, not this function's source
    impl = resolve(fn, **{o.name: given[o.name] for o in CLAIM})
    run = checked(RUN, given)
    options = VetOptions(dtypes=tuple(dtypes), device=device, thorough=thorough,
                         smallest=smallest, fail_on=fail_on, strict=strict, envelope=False,
                         grad=run["grad"], longest=run["longest"],
                         long_grad=run["long_grad"])  # fmt: skip
    report = vet_in_process(impl, options)
    if report.failed:
        raise AssertionError(report.summary())
    return report


_OPTION_LINES = (
    textwrap.fill(
        f"{o.name}{f'={not o.default}' if o.type is bool else ''} ({o.flag}): {o.help}",
        width=92, initial_indent="    ", subsequent_indent="        ", break_on_hyphens=False,
    )
    for o in OPTIONS
)  # fmt: skip
assert_linear_attention.__doc__ += (
    "\n\n    The options vet takes too (linattn_verify.run_options):\n\n" + "\n".join(_OPTION_LINES)
)
