"""Agreement with exact and with re-associated evaluations of the same attention.

- reference: the output against `lv.reference`, judged by the accuracy model (bound and
  budget; accuracy/verdict.py), the error reported in units of u s;
- associativity: (phi(Q) phi(K)^T) V == phi(Q) (phi(K)^T V): the output against both
  golden forms in the same dtype, and against any other given forms, within the sum of
  their a-priori bounds (core.py); kernelised specs only (softmax has one association).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..accuracy.judgement import Judgement
from ..cases import Case
from ..families import case_arguments, golden_attention, golden_forms
from ..under_test import Implementation, ImplementationFailure
from .compare import Tolerance, agreement, mismatch
from .core import Outcome, as_array, beyond_plan, check, inputs_of
from .worst import worst_element


@check("reference")
def reference_agreement(impl: Implementation, case: Case) -> Outcome:
    """Judge the output against the exact reference: within the a-priori bound, and within
    K_BUDGET times the error of the golden forms in the same dtype."""
    q, k, v, w, decay = case_arguments(case, impl.spec)
    out = impl(q, k, v, w, decay)
    if tuple(out.shape) != (*q.shape[:3], v.shape[-1]):
        return Outcome(False, f"output shape {tuple(out.shape)} is not (B, H, N, dv)")
    judgement = Judgement.of_case(case, impl.spec)
    verdict = judgement(out)
    figures = {
        "max_error": verdict.max_error,
        "relative_error": verdict.relative_error,
        "p99_error": verdict.p99_error,
        "bound_at_worst": verdict.bound_at_worst,
    }
    if verdict.budget is not None:
        figures["budget"] = verdict.budget
    worst = None
    if not verdict.passed:
        at = verdict.failing_index
        if at is None and verdict.over_budget is not None:  # the budget alone: its element
            at, figures["worst_error"], figures["budget"] = verdict.over_budget
        at = at or verdict.worst_index
        result = as_array(out)
        worst = worst_element(q, k, v, result, judgement.ref, at, impl.spec.causal)
        # the element the worst lines describe, for naming its cause (vet/causes.py)
        figures["worst_index"] = list(at)
        figures["worst_output"] = float(result[at])
        figures["worst_exact"] = float(judgement.ref[at])
        if case.dtype == "float64" and verdict.severity == "wrong" and impl.spec.decay:
            figures["right_without_decay"] = _right_without_decay(impl, case)
    return Outcome(verdict.passed, verdict.message, figures, severity=verdict.severity, worst=worst)


# a decay rate whose gates and gamma are 1 in float64 (|ln w| far below 2^-53): no decay
NO_DECAY = 1e-30


def _right_without_decay(impl: Implementation, case: Case) -> bool:
    """Whether a kernel wrong in float64 on `case` is right on the same q, k, v with every
    gate (or gamma) 1: the experiment that puts a defect of exact arithmetic in how the
    decay is applied (vet/findings.py), beyond the plan's cases."""
    case = dataclasses.replace(case, decay_rate=NO_DECAY)
    with beyond_plan():
        try:
            q, k, v, w, decay = case_arguments(case, impl.spec)
            return bool(Judgement.of_case(case, impl.spec)(impl(q, k, v, w, decay)).passed)
        except ImplementationFailure:
            return False


ORDER = {
    "quadratic": "(phi(Q) phi(K)^T) V",
    "linear": "phi(Q) (phi(K)^T V)",
    "recurrent": "token by token",  # the delta rule's
}


@check("associativity")
def associativity(
    impl: Implementation, case: Case, others: Sequence[Implementation] = ()
) -> Outcome:
    """The output against both golden forms in the same dtype, (phi(Q) phi(K)^T) V and
    phi(Q) (phi(K)^T V) (whichever the implementation uses, the other is the other
    association), and against each of `others` (e.g. every chunk size of a chunked form)."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    tol = Tolerance.of(x, spec)
    out = as_array(impl(q, k, v, w, decay))
    if out.shape != tol.scale.shape:
        return Outcome(False, f"output shape {out.shape} is not (B, H, N, dv)")
    pairs = [
        (
            f"golden {form} form {ORDER[form]}",
            as_array(golden_attention(q, k, v, spec, w, form, decay)),
        )
        for form in golden_forms(spec)
    ]
    pairs += [(other.name, as_array(other(q, k, v, w, decay))) for other in others]
    for name, b in pairs:
        if b.shape != out.shape:
            return Outcome(False, f"{name} returned shape {b.shape}, expected {out.shape}")
        found = mismatch(out, b, tol, tol.allowance())
        if found is not None:
            outcome = agreement(f"{impl.name} against {name}", found)
            # the output's element shown, for naming its cause (vet/causes.py)
            at = {"worst_index": list(found.index), "worst_output": found.a}
            return dataclasses.replace(outcome, figures={**outcome.figures, **at})
    return Outcome(True, f"{impl.name} agrees with {len(pairs)} other evaluation(s)")
