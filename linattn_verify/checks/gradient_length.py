"""The gradient check at length: with --grad, the backward at N = 256, 1024, 4096 (`lengths`;
vet --long-grad N: the powers of 4 from 256 up to N, and N) against exact gradients
certified at any N (reference/certified_grad.py, certified_delta_grad.py), so that a
backward whose intermediates overflow, lose precision or lose a state as N grows (a state
gradient not handed across a split of the sequence) fails at the smallest N where it does;
the gradient checks' own cases stop at N = 65.

Per dtype one draw of the long-context check's typical inputs at the longest N (its long
panel: B = 1, d = dv = 16, H = 1, a decayed spec's two memories H = 2: long_context.inputs)
and its prefixes, the loss L = sum(out * G) with G ~ N(0, 1) (rounded to the dtype), judged
as the gradient check judges (accuracy/gradient.py): the a-priori bound, and K_BUDGET times
the larger of the golden long form's backward error (its linear form: golden.long_form, and
its cotangent splits: gradients.golden_samples) and the rounding floor. An element whose
certificate exceeds CERTIFIED_SHARE of its magnitude M is left out (counted in the detail).
float64 is judged at N <= 65 by the gradient check, not here.

Specs: every one: the delta rule's (DeltaNet, Gated DeltaNet, KDA: certified_delta_grad),
the kernelised ones (families/kernelised/certified_gradients.py: every feature map,
normalised or not, causal or not, any eps, scale and decay) and softmax
(families/softmax/certified_gradients.py, dense). For the normalised kernelised specs the
magnitudes of dq, dk and dg (and of dv for signed features) are an upper bound M' on
grad.py's M (families/kernelised/certified_gradients.py's docstring: 1 to 2.3 times it as
measured, dv up to 2.1 for taylor and 3.9 for performer-trig), so their errors in units of
u M' read up to that much smaller: the bound and the budget scale alike.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ..accuracy.gradient import gradient_names, judge_gradients
from ..families import family_of, long_form, validate
from ..inputs import unit_roundoff
from ..reference.certified import CERTIFIED_SHARE
from ..results import CheckResult
from ..specs import Spec
from ..under_test import Implementation, ImplementationFailure
from .core import as_array
from .gradients import autograd_gradients, golden_samples
from .long_context import DIMS, MEMORIES, Draw
from .step import NO_BACKWARD

NAME = "gradient-length"
SHORTEST = 256
LONGEST_DEFAULT = 4096
# in Triton's interpreter (its backward takes seconds a call), for the delta rule (a token
# loop's backward, the golden's and most kernels' reference forms: 37 s to 4096) and for
# softmax (quadratic: its golden's backward holds N^2 weights a copy, 2.0 GiB at 4096)
SHORTER_LONGEST = 1024


def default_longest(interpreted: bool, spec: Spec) -> int:
    """vet's longest N: SHORTER_LONGEST in Triton's interpreter, for a stepwise family (the
    delta rule's) or softmax, else LONGEST_DEFAULT."""
    family = family_of(spec)
    shorter = interpreted or family.stepwise or family.quadratic
    return SHORTER_LONGEST if shorter else LONGEST_DEFAULT


def lengths(longest: int = LONGEST_DEFAULT) -> tuple[int, ...]:
    """256, 1024, 4096, ... up to `longest` (powers of 4), and `longest` if it is not one."""
    ns = [SHORTEST]
    while ns[-1] * 4 <= longest:
        ns.append(ns[-1] * 4)
    return (*ns, longest) if longest != ns[-1] else tuple(ns)


def not_applicable(impl: Implementation, dtypes: tuple[str, ...]) -> str | None:
    """Why the check does not apply to `impl` in `dtypes`, or None."""
    if lacking := family_of(impl.spec).lacks.get(NAME):
        return lacking
    if impl.step is not None:
        return NO_BACKWARD
    if all(t == "float64" for t in dtypes):
        return "float64 only: its backward is judged at N <= 65 by the gradient check"
    return None


def gradient_length(
    impl: Implementation,
    dtypes: tuple[str, ...],
    device: str = "cpu",
    longest: int = LONGEST_DEFAULT,
    seed: int = 0,
    say: Callable[[str], None] = lambda text: None,
) -> CheckResult:
    """The check (module docstring) over `dtypes`; fails at the smallest N where some
    dtype's gradients leave the bound or the budget."""
    spec, ns = impl.spec, lengths(longest)
    judged = [t for t in dtypes if t != "float64"]
    figures: dict[str, float] = {}
    failures, left_out, rounded_to_inf = [], 0, 0
    for dtype in judged:
        heads = len(MEMORIES) if family_of(spec).forgets(spec) else 1
        d = impl.head_dims.d(DIMS[0], dtype, backward=True)  # dv = d (long_context.inputs)
        draw = Draw(spec, dtype, 1, heads, d, ns[-1], seed, device)
        g_all = _loss_weights(draw)
        for n in ns:
            say(f"{NAME}: {dtype} N = {n}")
            q, k, v, w, decay = draw.tensors(n)
            g = g_all[:, :, :n]
            try:
                grads = autograd_gradients(impl, q, k, v, w, g, decay, spec)
            except ImplementationFailure as err:
                failures.append((n, dtype, "wrong", f"the implementation {err}"))
                break
            x = validate(q, k, v, spec, w, decay)
            exact, bounds, magnitude, rounds = family_of(spec).certified_gradients(
                x, spec, as_array(g)
            )
            for name in exact:  # an element not certified is not judged
                loose = ~(bounds[name] <= CERTIFIED_SHARE * magnitude[name])
                left_out += int(loose.sum())
                exact[name] = np.where(loose, np.nan, exact[name])
            golden = golden_samples(q, k, v, w, g, spec, decay, forms=(long_form(spec),))
            u = unit_roundoff(dtype, spec)
            cancelled = family_of(spec).cancelled_terms(x, spec, as_array(g))
            verdict = judge_gradients(grads, exact, magnitude, dtype, u, rounds, golden, cancelled)
            rounded_to_inf += verdict.rounded_to_inf
            for name, e in verdict.max_error.items():
                figures[f"max_error_d{name} {dtype} N={n}"] = e
            if not verdict.passed:
                severity = "wrong" if verdict.violations else "inaccurate"
                failures.append((n, dtype, severity, verdict.message))
                break
    counts = (left_out, rounded_to_inf)
    return _result(spec, ns, judged, dtypes, failures, figures, counts, impl.head_dims.d(DIMS[0]))


def _loss_weights(draw: Draw) -> torch.Tensor:
    """G ~ N(0, 1) of the draw's output at its longest N, from its seed, in its dtype."""
    gen = torch.Generator().manual_seed(draw.seed * 7919 + 3)
    g = torch.randn(draw.b, draw.h, draw.longest, draw.d, generator=gen, dtype=torch.float64)
    return g.to(device=draw.device, dtype=getattr(torch, draw.dtype))


def _result(spec, ns, judged, dtypes, failures, figures, counts, d: int) -> CheckResult:
    left_out, rounded_to_inf = counts
    uncertified = f"; {left_out} element(s) not certified, not judged" if left_out else ""
    if rounded_to_inf:
        uncertified += (
            f"; {rounded_to_inf} element(s) infinite where the exact value is beyond the "
            "dtype's range or within the budget of it (its rounding)"
        )
    if failures:
        n, dtype, severity, what = min(failures, key=lambda f: (f[0], f[2] != "wrong"))
        also = f" ({len(failures)} of {len(judged)} dtypes fail)" if len(failures) > 1 else ""
        detail = f"{spec} {dtype}: fails from N = {n}: {what}{also}{uncertified}"
        figures["first_failing_n"] = n
        return CheckResult(NAME, False, detail, figures=figures, severity=severity,
                           regime="typical")  # fmt: skip
    worst = max(figures, key=figures.get, default=None)
    top = f"; largest error {figures[worst]:.3g} u M ({worst})" if worst else ""
    detail = (
        f"N = {', '.join(map(str, ns))} in {', '.join(judged)} (B = 1, d = {d}): "
        f"{', '.join('d' + name for name in gradient_names(spec))} within bound and budget"
        f"{top}{uncertified}"
        f"{'' if len(judged) == len(dtypes) else '; float64 not judged here'}"
    )
    return CheckResult(NAME, True, detail, figures=figures)
