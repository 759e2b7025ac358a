"""What every check shares: the check wrapper, its outcome, the case's tensors and draws.
Comparing two outputs within the bound is compare.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..cases import Case
from ..families import case_arguments, validate
from ..inputs import AttentionInputs
from ..regimes import regime_of
from ..results import CheckResult
from ..specs import Spec
from ..triton_interpret import MANTISSA_BITS
from ..triton_interpret import STATE as TRITON
from ..under_test import Implementation, ImplementationFailure


def case_generator(case: Case, salt: int) -> torch.Generator:
    """A generator for a check's own draws on `case` (permutations, cut points), one per
    salt, fixed by the case's seed."""
    return torch.Generator().manual_seed(case.seed * 7919 + salt)


def as_array(out: torch.Tensor) -> np.ndarray:
    """float64 numpy copy of an output, NaN and inf kept."""
    return out.detach().to(device="cpu", dtype=torch.float64).numpy()


def first_marked(bad: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """(how many elements `bad` marks, the index of the first), or None if it marks none."""
    if not bad.any():
        return None
    return int(bad.sum()), tuple(int(t) for t in np.argwhere(bad)[0])


def inputs_of(case: Case, spec: Spec) -> tuple[tuple, AttentionInputs]:
    """((q, k, v, W, decay) tensors of families.case_arguments, their exact float64 copies)."""
    q, k, v, w, decay = case_arguments(case, spec)
    return (q, k, v, w, decay), validate(q, k, v, spec, w, decay)


def decay_part(
    decay: torch.Tensor | None,
    batch: slice = slice(None),
    head: slice = slice(None),
    tokens: slice = slice(None),
) -> torch.Tensor | None:
    """The part of a decay (families.case_arguments) that goes with q[batch, head, tokens]: gamma
    (H,) by head alone (batch elements and tokens share it), log-gates g (B, H, N), channel
    gates (B, H, N, d) or the delta rule's packed beta and gates (B, H, N, 1 + F) by all
    three; None without a decay."""
    if decay is None:
        return None
    return decay[head] if decay.dim() == 1 else decay[batch, head, tokens]


@dataclass(frozen=True)
class Outcome:
    """What a check body returns; `check` turns it into a CheckResult."""

    passed: bool
    message: str
    figures: dict[str, float] = field(default_factory=dict)
    by_nature: str | None = None
    severity: str = "wrong"  # of a failure: "inaccurate" when inside the bound, over budget
    worst: str | None = None  # the worst element of a failed judgement (worst.py)


CheckFn = Callable[..., CheckResult]
Watcher = Callable[[str, Case | None], None]
_WATCHERS: list[Watcher] = []
_BEYOND_PLAN: list[None] = []  # one entry per beyond_plan block the caller is in


@contextmanager
def beyond_plan() -> Iterator[None]:
    """The checks run in the block are beyond the cases a plan counts (vet's requests.Task.
    planned_cases): a found failure shrunk or checked again, the contract checked on a
    failure (vet/tasks.py: ContractCovered). A watcher tells them apart by in_plan()."""
    _BEYOND_PLAN.append(None)
    try:
        yield
    finally:
        _BEYOND_PLAN.pop()


def in_plan() -> bool:
    """Whether a check run now is one of the cases its plan counts (not beyond_plan)."""
    return not _BEYOND_PLAN


@contextmanager
def watching(watcher: Watcher) -> Iterator[None]:
    """Call watcher(check name, case) before every check runs on a case, and watcher(check
    name, None) when it has returned, while in the block: vet's worker tells the parent
    what it runs, so that a crash names the case it died on."""
    _WATCHERS.append(watcher)
    try:
        yield
    finally:
        _WATCHERS.remove(watcher)


def _ieee_passes(body, impl: Implementation, case: Case, options) -> bool:
    """Whether a check that failed with the tl.dots' TF32 products passes when Triton's
    interpreter gives them IEEE products: the experiment that tells TF32 from another
    cause of the same size (a float16 state), beyond the plan's cases."""
    with beyond_plan():
        try:
            return body(replace(impl, tf32=False), case, **options).passed
        except ImplementationFailure:
            return False


def _narrowed_below(dtype: str, before: dict[tuple[str, str, str], int]) -> list[list]:
    """[from, to, "file:line", count] for each float cast to a precision coarser than the
    case's `dtype` that Triton's interpreter ran since `before` (triton_interpret.STATE
    .narrowed): the evidence of vet/causes.py's "narrowed"."""
    bits = MANTISSA_BITS.get(dtype, 0)
    return [
        [given, target, line, count - before.get((given, target, line), 0)]
        for (given, target, line), count in sorted(TRITON.narrowed.items())
        if MANTISSA_BITS[target] < bits and count > before.get((given, target, line), 0)
    ]


def _stored_since(before: dict[tuple[str, str, str, str], int]) -> list[list]:
    """[from, to, "file:line", "kernel's argument", launches] for each narrowed store into a
    tensor that later launches loaded from since `before` (triton_interpret.STATE.stored:
    intermediates kept between kernels in the coarser precision): the evidence of
    vet/causes.py's "stored-intermediates"."""
    return [
        [*key, count - before.get(key, 0)]
        for key, count in sorted(TRITON.stored.items())
        if count > before.get(key, 0)
    ]


def check(name: str, backward: bool = False) -> Callable[[Callable[..., Outcome]], CheckFn]:
    """Make body(impl, case, ...) -> Outcome a check returning a CheckResult, on the case
    with the head dimensions the implementation takes (HeadDims.fit; `backward`: a check of
    its backward pass); an exception or a non-tensor from the implementation fails the check
    with its message. The tl.dots that Triton's interpreter ran with TF32 products meanwhile
    are its figure "tf32_dots", the casts below the case's precision it ran, its figure
    "narrowed" (_narrowed_below), and the narrowed stores later kernels read back, its
    figure "stored" (_stored_since)."""

    def wrap(body: Callable[..., Outcome]) -> CheckFn:
        def run(impl: Implementation, case: Case, **options: Any) -> CheckResult:
            case = impl.head_dims.fit(case, backward)
            for watcher in _WATCHERS:
                watcher(name, case)
            cause, dots, casts = None, TRITON.tf32_dots, dict(TRITON.narrowed)
            kept = dict(TRITON.stored)
            try:
                outcome = body(impl, case, **options)
            except ImplementationFailure as err:
                outcome, cause = Outcome(False, f"{impl.name} {err}"), "contract"
            failed = not outcome.passed
            dots = TRITON.tf32_dots - dots  # the evidence of vet/causes.py's tf32-products
            figures = outcome.figures | ({"tf32_dots": dots} if dots else {})
            if narrowed := _narrowed_below(case.dtype, casts):
                figures["narrowed"] = narrowed
            if stored := _stored_since(kept):
                figures["stored"] = stored
            if failed and dots and impl.tf32 and name != "contract":
                figures["ieee_products_pass"] = _ieee_passes(body, impl, case, options)
            result = CheckResult(
                name, outcome.passed, outcome.message, case, figures,
                outcome.by_nature, impl.reproduce(name, case) if failed else None,
                outcome.severity if failed else None, regime_of(case, impl.spec),
                outcome.worst if failed else None, cause,
            )  # fmt: skip
            for watcher in _WATCHERS:
                watcher(name, None)
            return result

        run.__name__ = run.__qualname__ = body.__name__
        run.__doc__ = body.__doc__
        run.check_name = name
        return run

    return wrap
