"""The report's gradient section: each form's backward for L = sum(out * G) against the exact
reference gradients, per dtype, judged in units of u M (accuracy/gradient.py): dq, dk, dv,
and as the gradient check judges them a gates spec's dg and the delta rule's dbeta and dg
(the decay a leaf: accuracy.gradient.gradient_names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..accuracy.gradient import judge_gradients
from ..checks.core import as_array
from ..checks.gradients import autograd_gradients, exact_judgement_inputs, golden_samples
from ..families import family_of, validate
from ..inputs import UNIT_ROUNDOFF
from ..specs import Spec
from ..under_test import Implementation, ImplementationFailure
from .accuracy import Sweep, sweep_inputs

Row = dict[str, Any]
GRADIENT_N = 16  # exact gradients cost O(N^2 (d + dv) m) mpf operations each


def gradient_rows(
    spec: Spec, impls: dict[str, Implementation], sweep: Sweep, step: Callable[[str], None]
) -> list[Row]:
    """Judge each implementation's gradients at N = GRADIENT_N in every dtype of the sweep
    (its inputs, and G from numpy PCG64([seed, N, 1]) rounded to the dtype)."""
    rows = []
    for dtype in sweep.dtypes:
        q, k, v, w, decay = sweep_inputs(spec, sweep, GRADIENT_N, dtype)
        x = validate(q, k, v, spec, w, decay)
        rng = np.random.default_rng([sweep.seed, GRADIENT_N, 1])
        g = torch.tensor(rng.standard_normal((*q.shape[:3], v.shape[-1]))).to(q.dtype)
        g = g.to(q.device)
        g64 = as_array(g)
        where = {"device": sweep.device, "spec": str(spec), "n": GRADIENT_N, "dtype": dtype}
        judgement = exact_judgement_inputs(x, spec, g64)
        if isinstance(judgement, str):  # the loss is 0/0: nothing to judge
            reason = f"not judged: {judgement}"
            rows += [{**where, "form": form, "passed": True, "skipped": reason} for form in impls]
            step(f"gradients {spec} {dtype}")
            continue
        exact, magnitude, n = judgement
        golden = golden_samples(q, k, v, w, g, spec, decay)
        cancelled = family_of(spec).cancelled_terms(x, spec, g64)
        for form, impl in impls.items():
            try:
                grads = autograd_gradients(impl, q, k, v, w, g, decay, spec)
            except ImplementationFailure as err:
                rows.append({**where, "form": form, "passed": False, "error": str(err)})
                continue
            verdict = judge_gradients(
                grads, exact, magnitude, dtype, UNIT_ROUNDOFF[dtype], n, golden, cancelled
            )
            rows.append(
                {
                    **where,
                    "form": form,
                    "max_error": verdict.max_error,  # JSON: null where infinite
                    "bound": verdict.bound,
                    "golden_max_error": verdict.golden_max_error,
                    "rounding_floor": verdict.rounding_floor,
                    "budget": verdict.budget,
                    "violations": verdict.violations,
                    "passed": verdict.passed,
                    "message": verdict.message,
                }
            )
        step(f"gradients {spec} {dtype}")
    return rows
