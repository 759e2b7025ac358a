"""Grouped value heads (Spec.value_heads = G; fla's HV = G H, `--value-heads G`): the kernel
called with q and k of H heads and v, beta, g of G H, its output of G H heads against the
exact one of the same inputs with q and k repeated so that value head hv reads query and key
head hv // G (fla: i_h = i_hv // (HV // H) in its Triton kernels, repeat_interleave in
naive_recurrent_kda), judged as the reference check judges. Every other check calls the
kernel with as many value heads as query heads."""

from __future__ import annotations

from dataclasses import replace

from ..accuracy.judgement import Judgement
from ..cases import Case
from ..families import case_arguments
from ..under_test import Implementation
from .core import Outcome, check


@check("value-heads")
def value_heads(impl: Implementation, case: Case) -> Outcome:
    """The output for G H value heads within the bound and the budget of the exact one,
    head hv from q and k of head hv // G."""
    groups = impl.spec.value_heads
    q, k, v, w, decay = case_arguments(replace(case, h=case.h * groups), impl.spec)
    q, k = q[:, ::groups].contiguous(), k[:, ::groups].contiguous()  # H heads
    out = impl(q, k, v, w, decay)
    wide = (t.repeat_interleave(groups, dim=1) for t in (q, k))
    verdict = Judgement.of(*wide, v, w, impl.spec, decay)(out)
    heads = f"{case.h} query and key heads, {case.h * groups} value heads: "
    figures = {"max_error": verdict.max_error, "bound_at_worst": verdict.bound_at_worst}
    return Outcome(verdict.passed, heads + verdict.message, figures, severity=verdict.severity)
