"""Gradient checks: the backward pass of an implementation (its autograd graph, or its own
torch.autograd.Function) for the loss L = sum(out * G), G seeded per case, with the case's
decay (Case.decay) given to the kernel; a gates spec's log-gates are a leaf too.

- gradient: dL/dq, dL/dk, dL/dv (and dL/dg of the log-gates) against the exact reference
  gradients (reference/grad.py), judged by accuracy/gradient.py: the a-priori bound, and
  the budget set by the golden forms' backward in the same dtype; the delta rule's, dL/dbeta
  too, against families/delta/gradients.py with the magnitudes of families/delta/gradient_bound.py;
- gradient-causality (causal specs): dL/dk_j and dL/dv_j (and the delta rule's dL/dbeta_j)
  do not depend on G_i for i < j, nor dL/dg_t (through rows i >= t alone); rows 0 .. t-1 of
  G are redrawn and rows t .. N-1 of dk, dv (dbeta, dg) must not move beyond a few
  roundings (this holds where the bound is vacuous too);
- gradient-associativity: the gradients agree with both golden forms' ((phi(Q) phi(K)^T) V
  and phi(Q) (phi(K)^T V), or softmax's one) within the budget plus the golden's error;
- gradient-finite: no NaN or inf in a gradient where the exact one is finite and fits the
  dtype (the forward's finiteness is the positivity check's).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np
import torch

from ..accuracy.gradient import (
    NAMES,
    GradientVerdict,
    allowance,
    effective_scale,
    gradient_names,
    judge_gradients,
    rounding_floor,
)
from ..accuracy.verdict import K_BUDGET
from ..cases import Case
from ..families import family_of, golden_attention, golden_forms
from ..head_dims import SIXTEEN_BIT
from ..inputs import UNIT_ROUNDOFF, AttentionInputs
from ..specs import Spec
from ..under_test import Implementation, ImplementationFailure
from .core import Outcome, as_array, case_generator, check, first_marked, inputs_of

Grads = dict[str, np.ndarray]


def stored_design(spec: Spec) -> str | None:
    """The Spec.stored value of a kernel storing its intermediates in the inputs' dtype, where
    the spec's family takes the option (its first choice); None where it does not."""
    option = next((o for o in family_of(spec).options if o.name == "stored"), None)
    return None if option is None else option.choices[0]


def stored_figures(spec: Spec, dtype: str, verdict_of: Callable[[Spec], GradientVerdict]) -> dict:
    """Of a failed `dtype` gradient row of a spec whose family takes Spec.stored and that does
    not declare it: the golden's largest error and the budget per gradient under that design
    (verdict_of(the spec declaring it), the same judgement on its golden), figures
    stored_golden_dX and stored_budget_dX: what vet/causes.py's "stored-intermediates" weighs
    the row's errors against. Else {}."""
    design = stored_design(spec)
    if spec.stored is not None or design is None or dtype not in SIXTEEN_BIT:
        return {}
    verdict = verdict_of(replace(spec, stored=design))
    golden, budget = verdict.golden_max_error or {}, verdict.budget or {}
    return {f"stored_golden_d{n}": e for n, e in golden.items()} | {
        f"stored_budget_d{n}": b for n, b in budget.items()
    }


def loss_weights(case: Case, q: torch.Tensor, v: torch.Tensor, salt: int = 11) -> torch.Tensor:
    """G of the output's shape and the inputs' dtype and device: N(0, 1) from the case's
    seed, rounded to the dtype."""
    b, h, n, dv = (*q.shape[:3], v.shape[-1])
    g = torch.randn(b, h, n, dv, generator=case_generator(case, salt), dtype=torch.float64)
    return g.to(dtype=q.dtype, device=q.device)


def autograd_gradients(
    fn, q, k, v, w, g: torch.Tensor, decay=None, spec: Spec | None = None
) -> Grads:
    """dL/dq, dL/dk, dL/dv of L = sum(fn(q, k, v, w, decay=decay) * g) through
    torch.autograd, as float64 arrays, and those of the rest of spec's gradient_names (a
    gates spec's log-gates g, the delta rule's beta and g: the decay is a leaf, and the
    delta rule's packed one is split as inputs.delta_arguments splits it); a gradient that
    does not exist (the output does not depend on it) is 0. ImplementationFailure when fn's
    output has no backward, the backward raises, or a gradient has the wrong shape or
    dtype."""
    names = NAMES if spec is None else gradient_names(spec)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    if len(names) > len(NAMES):
        decay = decay.detach().clone().requires_grad_(True)
        leaves.append(decay)
    with torch.enable_grad():
        out = fn(*leaves[:3], w, decay=decay)
        if not out.requires_grad:
            raise ImplementationFailure("returned an output with no backward (requires_grad off)")
        running = fn.running() if isinstance(fn, Implementation) else contextlib.nullcontext()
        try:
            with running:  # a Triton kernel's backward in the interpreter, as its forward
                grads = torch.autograd.grad(out, leaves, grad_outputs=g, allow_unused=True)
        except Exception as err:  # the backward's failure is a finding
            raise ImplementationFailure(
                f"backward raised {type(err).__name__}: {err}"
            ) from None  # fmt: skip
    grads = [torch.zeros_like(leaf) if d is None else d for leaf, d in zip(leaves, grads)]
    packed = len(names) > len(NAMES)  # the decay's leaf: a family's packed argument
    arguments = ", ".join(family_of(spec).argument_names(spec)) if packed else ""
    leaf_names = (*NAMES, f"({arguments})" if "," in arguments else arguments)
    for name, leaf, grad in zip(leaf_names, leaves, grads):
        if grad.shape != leaf.shape or grad.dtype != leaf.dtype:
            raise ImplementationFailure(
                f"d{name} has shape {tuple(grad.shape)} and dtype {grad.dtype}, expected "
                f"{tuple(leaf.shape)} and {leaf.dtype}"
            )
    if packed:  # the packed argument's gradient as its keywords'
        grads = grads[:3] + list(family_of(spec).keywords(spec, grads[3], "bhnd").values())
    return {name: as_array(grad) for name, grad in zip(names, grads, strict=True)}


def golden_gradients(q, k, v, w, g, spec, decay=None, forms=None) -> list[Grads]:
    """The golden forms' gradients (golden_forms(spec), or `forms`) on the same inputs,
    decay and loss."""

    def golden(form: str):
        return lambda q, k, v, w, decay: golden_attention(q, k, v, spec, w, form, decay)

    return [
        autograd_gradients(golden(form), q, k, v, w, g, decay, spec)
        for form in forms or golden_forms(spec)
    ]


# exact splits of the cotangent per golden form (golden_samples): a choice, not derived;
# two covered the false alarms measured (docs/accuracy.md) at two extra passes a form
SPLITS = 2


def golden_samples(q, k, v, w, g, spec, decay=None, forms=None) -> list[Grads]:
    """golden_gradients (of `forms`) on the cotangent G and on SPLITS exact splits of it,
    G = G1 + G2, G1 one unit in the last place of G's dtype away from G (a random direction
    per element, seeded) and G2 = G - G1, exact: by linearity in the cotangent dL/dx(G1) +
    dL/dx(G2) is dL/dx(G), but every rounding falls anew (G2's part is a unit's worth, its
    own error a unit of a unit). The same careful evaluations with other luck: in float32 and
    float64 the golden forms compute in the inputs' precision, peers of the kernel, and one
    draw of a handful of roundings can be far luckier than a correct kernel's (the budget is
    K_BUDGET times the largest). A spec whose output does not depend on the keys' order
    (Spec.ordered: non-causal, not cosFormer) has its splits take the keys (and values) in
    a seeded random order: its sums over every key are the same in any order, so the
    forward's roundings fall anew too (a denominator that cancels, with signed features, is
    one draw of them). All 1 + 2 SPLITS cotangents run as one batch of copies of the inputs
    (one pass: a token loop's cost is per step, not per row)."""
    cotangents, orders = [g], [torch.arange(k.shape[-2])]
    for split in range(SPLITS):
        seeded = torch.Generator().manual_seed(split)
        up = torch.rand(g.shape, generator=seeded) < 0.5
        away = torch.where(up.to(g.device), torch.inf, -torch.inf).to(g.dtype)
        g1 = torch.nextafter(g, away)
        cotangents += [g1, g - g1]
        order = orders[0] if spec.ordered else torch.randperm(k.shape[-2], generator=seeded)
        orders += [order, order]
    copies, b = len(cotangents), g.shape[0]

    def repeated(t):
        return t.repeat(copies, *[1] * (t.ndim - 1))

    def reordered(t):
        return torch.cat([t[..., order.to(t.device), :] for order in orders])

    per_batch = decay is not None and decay.ndim >= 3  # gates, channel gates, beta
    batched = golden_gradients(
        repeated(q), reordered(k), reordered(v), w, torch.cat(cotangents), spec,
        repeated(decay) if per_batch else decay, forms,
    )  # fmt: skip
    samples = []
    for grads in batched:

        def copy(i: int, grads=grads) -> Grads:
            back = np.argsort(orders[i].numpy())  # the keys' own order
            part = {name: t[i * b : (i + 1) * b] for name, t in grads.items()}
            return {name: t[..., back, :] if name in ("k", "v") else t for name, t in part.items()}

        samples.append(copy(0))
        for split in range(SPLITS):
            one, rest = copy(1 + 2 * split), copy(2 + 2 * split)
            with np.errstate(invalid="ignore"):  # inf + -inf where a half overflows: NaN
                samples.append({name: one[name] + rest[name] for name in one})
    return samples


class UndefinedLoss(Exception):
    """A row's exact denominator is 0 (relu, cosformer): out is 0/0 there, so the loss and
    every gradient an implementation computes from it are undefined (torch's 0 * inf = NaN
    reaches every key): no gradient check judges such a case."""


def judged(body):
    """Run a gradient check body, passing (unjudged) where the loss is undefined."""

    def run(impl: Implementation, case: Case) -> Outcome:
        try:
            return body(impl, case)
        except UndefinedLoss as err:
            return Outcome(True, f"not judged: {err}")

    run.__name__, run.__doc__ = body.__name__, body.__doc__
    return run


def exact_judgement_inputs(
    x: AttentionInputs, spec: Spec, g: np.ndarray
) -> tuple[Grads, Grads, int] | str:
    """The exact gradients, their magnitudes M and the rounding count n for the loss
    sum(out * g) (x's decay included), or why the loss is undefined (an exact denominator
    of a normalised spec is 0)."""
    return family_of(spec).exact_gradients(x, spec, g)


# exact gradients kept for the next gradient check of a case: a vet plan's corners and
# search cases of one check (about 90), which the next check draws again
EXACT_KEPT = 256


@functools.lru_cache(maxsize=EXACT_KEPT)
def _exact(case: Case, spec: Spec) -> tuple[Grads, Grads, int] | str:
    """exact_judgement_inputs for the case's loss; cached, since every gradient check of a
    case needs them (callers must not modify the arrays)."""
    (q, _, v, _, _), x = inputs_of(case, spec)
    return exact_judgement_inputs(x, spec, as_array(loss_weights(case, q, v)))


def _setup(impl: Implementation, case: Case):
    """Inputs (the decay last), G, the exact gradients and magnitudes, n and the
    implementation's grads; UndefinedLoss where some exact denominator is 0."""
    exact = _exact_defined(case, impl.spec)
    inputs, g, grads = _implementation_gradients(impl, case)
    return inputs, g, *exact, grads


@functools.lru_cache(maxsize=EXACT_KEPT)
def _cancelled(case: Case, spec: Spec) -> dict[str, tuple[int, np.ndarray]]:
    """The family's cancelled terms of the case's loss (Family.cancelled_terms: the budget's
    floor where the backward's last step cancels); cached as _exact."""
    (q, _, v, _, _), x = inputs_of(case, spec)
    return family_of(spec).cancelled_terms(x, spec, as_array(loss_weights(case, q, v)))


def _exact_defined(case: Case, spec: Spec) -> tuple[Grads, Grads, int]:
    """_exact, or UndefinedLoss where some exact denominator is 0."""
    exact = _exact(case, spec)
    if isinstance(exact, str):
        raise UndefinedLoss(exact)
    return exact


def _implementation_gradients(impl: Implementation, case: Case):
    """Inputs (the decay last), G and the implementation's grads of the case's loss."""
    (q, k, v, w, decay), _ = inputs_of(case, impl.spec)
    g = loss_weights(case, q, v)
    return (q, k, v, w, decay), g, autograd_gradients(impl, q, k, v, w, g, decay, impl.spec)


NO_DECAY_GRADIENT = (
    "; d{name} is 0 everywhere: the output has no gradient in {what} (taken as a constant, "
    "or detached)"
)
DECAY_LEAVES = {"beta": "beta", "g": "the log-gates g"}


@check("gradient", backward=True)
@judged
def gradient(impl: Implementation, case: Case) -> Outcome:
    """dq, dk, dv (and dg) within the a-priori bound of the exact ones and within K_BUDGET
    times the golden forms' error."""
    (q, k, v, w, decay), g, exact, magnitude, n, grads = _setup(impl, case)
    golden = golden_samples(q, k, v, w, g, impl.spec, decay)
    u, cancelled = UNIT_ROUNDOFF[case.dtype], _cancelled(case, impl.spec)
    verdict = judge_gradients(grads, exact, magnitude, case.dtype, u, n, golden, cancelled)
    figures = {f"max_error_d{name}": e for name, e in verdict.max_error.items()}
    figures["max_error"] = max(verdict.max_error.values())
    figures["bound"] = verdict.bound
    for name, budget in (verdict.budget or {}).items():
        figures[f"budget_d{name}"] = budget
    severity = "wrong" if verdict.violations else "inaccurate"
    if not verdict.passed and not verdict.violations:
        figures |= stored_figures(
            impl.spec,
            case.dtype,
            lambda design: judge_gradients(
                grads, exact, magnitude, case.dtype, u, n,
                golden_samples(q, k, v, w, g, design, decay), cancelled,
            ),
        )  # fmt: skip
    message = verdict.message
    for name, what in DECAY_LEAVES.items():  # the decay's leaf, detached or a constant
        if not verdict.passed and name in grads and not grads[name].any() and exact[name].any():
            message += NO_DECAY_GRADIENT.format(name=name, what=what)
    return Outcome(verdict.passed, message, figures, severity=severity)


def _allowance(
    magnitude: Mapping[str, np.ndarray], n: int, dtype: str, units: Mapping[str, float]
) -> Grads:
    """Per element, u M times `units[name]`, and never more than twice the bound (two
    evaluations, each within it)."""
    u = UNIT_ROUNDOFF[dtype]
    return {
        name: np.minimum(
            2 * allowance(m, dtype, u, n), units[name] * u * effective_scale(m, dtype, u)
        )
        for name, m in magnitude.items()
    }


def _disagreement(
    a: Grads, b: Grads, allowance: Grads, exact: Grads, start: int = 0, names=None
) -> str | None:
    """Where a and b differ beyond the allowance in rows (tokens) start.. of `names` (all
    of exact's by default; where the exact gradient is defined), or None."""
    for name in names or exact:
        x, y, limit, ref = (
            t[:, :, start:] for t in (a[name], b[name], allowance[name], exact[name])
        )
        with np.errstate(invalid="ignore"):
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            bad = ~np.isnan(ref) & ~same & ~(np.abs(x - y) <= limit)
        if bad.any():
            at = tuple(int(t) for t in np.argwhere(bad)[0])
            where = [*at[:2], at[2] + start, *at[3:]]
            return (
                f"d{name}: {int(bad.sum())} element(s) differ beyond the allowance, e.g. at "
                f"{where}: {x[at]:.6g} against {y[at]:.6g}"
            )
    return None


@check("gradient-causality", backward=True)
@judged
def gradient_causality(impl: Implementation, case: Case) -> Outcome:
    """Redrawing G_i for i < t leaves dk_j and dv_j (the delta rule's dbeta_j), j >= t,
    unchanged, and dg_s, s >= t (rows i >= s alone reach it): within 2 K_BUDGET roundings
    of the exact gradient (a correct backward never combines G_i with them, so it
    reproduces them to the bit but for reassociation; a leak moves them by a whole term),
    and within twice the bound."""
    if case.n < 2:
        return Outcome(True, "N = 1: there is no earlier row of G to change")
    (q, k, v, w, decay), g, exact, magnitude, n, grads = _setup(impl, case)
    t = 1 + int(torch.randint(case.n - 1, (1,), generator=case_generator(case, 12)))
    other = loss_weights(case, q, v, salt=13)
    g2 = torch.cat([other[..., :t, :], g[..., t:, :]], dim=-2)
    grads2 = autograd_gradients(impl, q, k, v, w, g2, decay, impl.spec)
    u = UNIT_ROUNDOFF[case.dtype]
    floors = {
        name: 2 * K_BUDGET * rounding_floor(exact[name], magnitude[name], case.dtype, u)
        for name in exact
    }
    allowance = _allowance(magnitude, n, case.dtype, floors)
    names = tuple(name for name in exact if name != "q")
    found = _disagreement(grads, grads2, allowance, exact, start=t, names=names)
    if found is None:
        what = ", ".join(f"d{name}" for name in names)
        return Outcome(True, f"{what} of rows {t}.. unchanged when G of rows 0..{t - 1} changed")
    return Outcome(False, f"after G of rows 0..{t - 1} changed, " + found)


@check("gradient-associativity", backward=True)
@judged
def gradient_associativity(impl: Implementation, case: Case) -> Outcome:
    """The gradients agree with each golden form's within the implementation's budget plus
    the golden form's own error (each against the exact gradient), and within twice the
    bound."""
    (q, k, v, w, decay), g, exact, magnitude, n, grads = _setup(impl, case)
    forms = golden_forms(impl.spec)
    goldens = golden_gradients(q, k, v, w, g, impl.spec, decay)
    u = UNIT_ROUNDOFF[case.dtype]
    samples = golden_samples(q, k, v, w, g, impl.spec, decay)
    cancelled = _cancelled(case, impl.spec)
    verdict = judge_gradients(grads, exact, magnitude, case.dtype, u, n, samples, cancelled)
    units = {name: verdict.budget[name] + verdict.golden_max_error[name] for name in exact}
    allowance = _allowance(magnitude, n, case.dtype, units)
    for form, golden in zip(forms, goldens, strict=True):
        found = _disagreement(grads, golden, allowance, exact)
        if found is not None:
            return Outcome(False, f"against the golden {form} form's backward: " + found)
    return Outcome(True, f"the gradients agree with the golden {' and '.join(forms)} forms'")


@check("gradient-finite", backward=True)
@judged
def gradient_finite(impl: Implementation, case: Case) -> Outcome:
    """No NaN or inf where the exact gradient is finite and fits the dtype (the exact ones,
    a second of mpmath a case, are needed only where some computed one is not finite)."""
    (q, _, _, _, _), _, grads = _implementation_gradients(impl, case)
    if all(np.isfinite(t).all() for t in grads.values()):
        return Outcome(True, "every gradient is finite")
    exact, _, _ = _exact_defined(case, impl.spec)
    top = float(torch.finfo(q.dtype).max)
    for name in exact:
        with np.errstate(invalid="ignore"):
            bad = (
                np.isfinite(exact[name]) & (np.abs(exact[name]) <= top) & ~np.isfinite(grads[name])
            )
        if (marked := first_marked(bad)) is not None:
            count, at = marked
            return Outcome(
                False,
                f"d{name} is {grads[name][at]} at {list(at)} ({count} "
                f"element(s)) where the exact gradient is {exact[name][at]:.6g}",
            )
    return Outcome(True, "every gradient is finite where the exact one is finite and fits")
