"""The report's accuracy vs N at long sequences: every form of a kernelised spec at N = 2^4,
2^6, ..., 2^16 (2^20 with --full) against the certified reference, beside the golden linear
form's error and the two a-priori bounds. Not softmax: its bound is evaluated in arb alone
(quadratic work in ball arithmetic, about a minute per case at N = 2^12, 3 s at 2^10, where
the accuracy sweep of --full reaches with correctly rounded references).

Per spec and dtype, one draw of the typical regime at the longest N (the long-context
check's inputs: q, k ~ N(0, 1) with the keys sharing a direction, values ~ N(1, 1)),
B = H = 1, d = dv = LONG_D, and its prefixes of each N. At each N:

- the reference: reference/certified.py (float64, within 2^-34 s of the exact value with a
  rigorous per-element certificate) in the rows judged by their value, the long-context
  check's (its _judged_rows; elsewhere, rows judged for finiteness alone, within the float64
  pass's own bound, so the largest errors reported there are within bound / (u s) of the
  exact ones): enough for float32 and the half precisions, not for float64, which is
  judged against correctly rounded references in the accuracy sweep;
- the bounds, in units of u s per element: Higham's deterministic gamma_n (vacuous, inf,
  once the denominator's relative error bound reaches 1: float16 from N = 2^10 here) and
  the smaller of it and Higham & Mary's probabilistic one at a false-failure probability
  of FALSE_FAILURE per case; the rows report each one's largest element (0/0 rows left out);
- each form judged by accuracy/verdict.py's judge against the probabilistic bound (the
  smaller) and the budget (K_BUDGET x the golden linear form's error, more where the
  denominator cancels: element_budgets) on the rows whose
  denominator a float32 evaluation resolves, as the long-context check does (its
  resolvable_rows: performer-trig's and taylor's denominators cancel more as N grows, and
  correct evaluations differ there by chance beyond any fixed budget; the bound alone
  judges those rows): a failure fails the report's verdict.

Every spec vet takes: a scaled, unnormalised or decayed one and the delta rule, on the
check's inputs (its decay: that of the check's first head, an effective memory of 2^12 tokens,
checks.long_context.MEMORIES[0]; the delta rule's unit keys, or raw ones where the kernel
normalises them, and beta ~ U(0, 1)). The delta rule's bound is its normwise one
(families/delta/bound.py), the only one: bound_max and probabilistic_bound_max are both its
largest element. The delta rule stops at DELTA_LONGEST (DELTA_FULL_LONGEST with --full):
its bound and its golden are recurrences token by token, some 15 s per dtype at 2^16
(vet's long-context check runs it to 2^14 by default).

Quadratic-cost forms stop at QUADRATIC_LONGEST. For causal specs whose weights do not
depend on N (all but cosFormer), row i depends on tokens <= i alone, so the reference and
the golden output are computed once at the longest N and sliced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..accuracy.bound import scale_and_bound
from ..accuracy.verdict import judge
from ..checks.long_context import LONGEST, SMALLEST_LONGEST, Draw, standard
from ..families import family_of, validate
from ..inputs import SMALLEST_SUBNORMAL, unit_roundoff
from ..specs import Spec
from ..stats.estimators import one_thread
from ..under_test import Implementation, ImplementationFailure

Row = dict[str, object]

LONG_NS = tuple(4**e for e in range(2, 9))  # 2^4, 2^6, ..., 2^16
FULL_LONG_NS = (*LONG_NS, 4**9, 4**10)  # ..., 2^20: LONG_SPECS only (FULL_LONGEST)
FULL_LONGEST = 2**18  # --full: the other specs up to here (2^20 for all: some 45 minutes)
QUADRATIC_LONGEST = 2**12  # an (N, N) weight matrix: 128 MiB in float64 at 2^12
LONG_D = 16  # d = dv
# The default report's share of the section (--full: every spec of the report): the
# first-order map both ways and one random-feature map, some 15 s in all dtypes.
LONG_SPECS = ("elu (non-causal)", "elu (causal)", "performer-positive (non-causal)")
UNJUDGED_DTYPES = ("float64",)  # the certified reference is within 2^-34 s, not 2^-53
# The delta rule's longest N (module docstring): that of vet's smallest plan (2^12, some 3 s
# in three dtypes, where vet's default for it, 2^14, would add 10 s to a 15 s report), and
# with --full vet's default for every other spec (2^16)
DELTA_LONGEST = SMALLEST_LONGEST
DELTA_FULL_LONGEST = LONGEST


@dataclass(frozen=True)
class LongSweep:
    """What the section runs on `device`: the dtypes but float64, B = H = 1 and
    d = dv = LONG_D (the N are each spec's: long_ns)."""

    dtypes: tuple[str, ...]
    device: str
    d: int = LONG_D
    seed: int = 0

    @property
    def judged(self) -> tuple[str, ...]:
        return tuple(t for t in self.dtypes if t not in UNJUDGED_DTYPES)


def long_ns(
    spec: Spec, impls: dict[str, Implementation], full: bool, chosen: bool
) -> tuple[int, ...]:
    """The N of one spec: LONG_NS, or with --full FULL_LONG_NS for a `chosen` spec (one of
    LONG_SPECS, or the implementation of --impl) and up to FULL_LONGEST for the others;
    up to QUADRATIC_LONGEST where every implementation is of quadratic cost, up to
    DELTA_LONGEST (DELTA_FULL_LONGEST with --full) for a stepwise family (Family.stepwise:
    the delta rule); none for softmax (module docstring)."""
    if family_of(spec).quadratic:
        return ()
    ns = sweep_ns(full) if chosen or not full else _upto(FULL_LONG_NS, FULL_LONGEST)
    if family_of(spec).stepwise:
        ns = _upto(ns, DELTA_FULL_LONGEST if full else DELTA_LONGEST)
    if all(impl.cost == "quadratic" for impl in impls.values()):
        ns = _upto(ns, QUADRATIC_LONGEST)
    return ns


def sweep_ns(full: bool) -> tuple[int, ...]:
    """Every N of the section: LONG_NS, or FULL_LONG_NS with --full."""
    return FULL_LONG_NS if full else LONG_NS


def _upto(ns: tuple[int, ...], longest: int) -> tuple[int, ...]:
    return tuple(n for n in ns if n <= longest)


def long_section(
    groups: list[tuple[Spec, dict[str, Implementation], tuple[int, ...]]],
    sweep: LongSweep,
    step: Callable[[str], None],
) -> list[Row]:
    """long_rows of every (spec, implementations, N) group, on one torch thread: the
    causal golden form and the recurrent one are thousands of small ops, some 10 to 1000
    times slower on two threads of a busy 2-core machine."""
    with one_thread():
        return [
            row for spec, impls, ns in groups for row in long_rows(spec, impls, ns, sweep, step)
        ]


def long_rows(
    spec: Spec,
    impls: dict[str, Implementation],
    ns: tuple[int, ...],
    sweep: LongSweep,
    step: Callable[[str], None],
) -> list[Row]:
    """One row per form, N and dtype (module docstring): the verdict's figures (its
    golden_max_error, over the rows the budget compares, as budget_golden_max_error), and,
    the same for every form at that N, the golden's max error over every row, the largest
    deterministic and probabilistic bound over the elements (inf where vacuous) and the
    number of rows left to the bound; an implementation that raises gets a failed row with
    its message."""
    rows = []
    for dtype in sweep.judged:
        draw = Draw(spec, dtype, 1, 1, sweep.d, ns[-1], sweep.seed, sweep.device)
        u, tiny = unit_roundoff(dtype, spec), SMALLEST_SUBNORMAL[dtype]
        for n in ns:
            qn, kn, vn, w, decay = draw.tensors(n)
            x = validate(qn, kn, vn, spec, w, decay)
            ref, golden, bounds, resolvable = standard(draw, n)  # the check's, shared
            if family_of(spec).scale_and_bound:  # its own model, its only one: as judged
                deterministic = bounds[dtype]
            else:
                deterministic = scale_and_bound(x, spec, ref, u, tiny)
            where = {
                "device": sweep.device,
                "spec": str(spec),
                "n": n,
                "dtype": dtype,
                "golden_max_error": judge(golden, x, spec, ref, bounds=bounds).max_error,
                "bound_max": _largest(deterministic[1]),
                "probabilistic_bound_max": _largest(bounds[dtype][1]),
                "rows_left_to_bound": int(np.sum(~resolvable)),
            }
            for form, impl in impls.items():
                if impl.cost == "quadratic" and n > QUADRATIC_LONGEST:
                    continue
                try:
                    out = impl(qn, kn, vn, w, decay)
                except ImplementationFailure as err:
                    rows.append({**where, "form": form, "passed": False, "error": str(err)})
                    continue
                verdict = judge(out, x, spec, ref, golden, bounds, resolvable)
                figures = verdict.to_dict()
                del figures["spec"], figures["dtype"]  # in `where` already
                figures["budget_golden_max_error"] = figures.pop("golden_max_error")
                severity = None if verdict.passed else verdict.severity
                rows.append({**where, "form": form, **figures, "severity": severity})
            step(f"long {spec} N={n} {dtype}")
    return rows


def _largest(bound: np.ndarray) -> float:
    """The largest element of a bound, inf where vacuous; NaN (0/0 rows) left out."""
    defined = bound[~np.isnan(bound)]
    return float(defined.max()) if defined.size else 0.0


def power_of_2(n: int) -> str:
    """n as 2^e where it is a power of two, else in digits."""
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)
