"""The backward pass of a carried state (--state with --grad): for the loss L = sum(out *
G) + sum(S_N * G_S) (+ sum(z_N * G_z) when normalised), the output and the final state
(S_N, z_N) weighted by cotangents seeded per case, from an initial state drawn with the
case (unnormalised: N(0, 1); normalised: the exact state of the case's own sequence, a
plausible prefix, so that the normaliser stays away from 0),

- dL/dS_0 (fla's dh0, the final state's cotangent dht flowing into it through the decays),
  dL/dz_0 when normalised (the normaliser's share: it says whether the backward accounts
  for z_0), and dL_S/dv for the final state's terms alone (dht into the inputs; dL_S/dq
  must be 0: the final state does not depend on the queries) against the exact ones of
  reference/state.py's exact_state_gradients, within accuracy/state_bounds.py's
  state_gradient_bound (fla #1140 / PR #1141: dht and dh0 wrong for short chunks while the
  forward is exact);
- dL_S/dk and, for gates and channel gates, dL_S/dg of the final state's terms alone
  against reference/final_state.py's exact ones, within the gradient bound gamma_n M
  (accuracy/gradient.py): a backward whose dk or dg misses dht's share is caught here (a
  constant decay's gamma is held fixed, as RetNet fixes it: no dgamma to judge).
"""

from __future__ import annotations

import numpy as np
import torch

from ..accuracy.gradient import judge_gradients
from ..accuracy.state_bounds import state_gradient_bound
from ..cases import Case
from ..families import Family, exact_state, family_of
from ..families.dispatch import roundings
from ..inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ..reference.common import ReferenceAccuracyError
from ..reference.final_state import final_state_gradients
from ..reference.state import exact_state_gradients
from ..under_test import Implementation, ImplementationFailure
from .core import Outcome, as_array, case_generator, check, inputs_of
from .gradients import loss_weights, stored_figures
from .state import state_parts


def _draw(like: torch.Tensor, shape: tuple[int, ...], case: Case, salt: int) -> torch.Tensor:
    """N(0, 1) of `shape` from the case's seed, in like's dtype and device."""
    t = torch.randn(*shape, generator=case_generator(case, salt), dtype=torch.float64)
    return t.to(dtype=like.dtype, device=like.device)


def _backward(impl: Implementation, q, k, v, w, decay, initial, cotangents, g_out):
    """(dq, dk, dv, dg (zeros without gates; the delta rule's packed (beta, g) one), d
    initial...) of sum(out * g_out) + sum(final *
    cotangents) through the kernel's autograd (g_out None: the final state's terms alone),
    as float64 arrays; initial and cotangents: the state's parts, (S,) or (S, z)."""
    per_token = family_of(impl.spec).per_token(impl.spec)  # gates, beta and gates, ...
    leaf = decay if per_token else torch.zeros(())
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, leaf, *initial)]
    state = leaves[4] if len(initial) == 1 else tuple(leaves[4:])
    given_decay = leaves[3] if per_token else decay
    with torch.enable_grad():
        out, final = impl.call_state(leaves[0], leaves[1], leaves[2], w, state, decay=given_decay)
        parts = state_parts(final, impl.spec)
        loss = sum((f * c).sum() for f, c in zip(parts, cotangents, strict=True))
        loss = loss + (0 if g_out is None else (out * g_out).sum())
        if not loss.requires_grad:
            raise ImplementationFailure("returned a final state with no backward")
        try:
            with impl.running():  # a Triton kernel's backward in the interpreter too
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        except Exception as err:  # the backward's failure is a finding
            raise ImplementationFailure(f"backward raised {type(err).__name__}: {err}") from None
    return [np.zeros(t.shape) if d is None else as_array(d) for t, d in zip(leaves, grads)]


def _beyond(what: str, got, want: np.ndarray, bound: np.ndarray, dtype) -> str | None:
    """Where got is farther than `bound` from want, or None; an exact value beyond dtype's
    range may be the infinity of its sign (its rounding); an element whose bound is infinite
    is not judged."""
    with np.errstate(invalid="ignore"):
        rounded_to_inf = (np.abs(want) > torch.finfo(dtype).max) & (got == np.sign(want) * np.inf)
        bad = np.isfinite(bound) & ~((np.abs(got - want) <= bound) | rounded_to_inf)
    if not bad.any():
        return None
    i = tuple(int(t) for t in np.argwhere(bad)[0])
    return (
        f"{what}{list(i)} = {got[i]:.9g} against the exact {want[i]:.9g} ({int(bad.sum())} "
        f"element(s) beyond the bound, {bound[i]:.3g} there)"
    )


def _keys_and_gates(x, spec, dtype: str, exact_and_mags: tuple, grads: dict) -> str | None:
    """dL_S/dk (and dL_S/dg of gates) judged against the exact ones (final_state.py) by
    the a-priori gradient bound, gamma_n M (accuracy/gradient.py; n: grad.roundings, a
    generous count for the state's shorter paths), or what goes beyond it."""
    exact, mags = exact_and_mags
    got = {name: grads[name] for name in exact}
    verdict = judge_gradients(got, exact, mags, dtype, UNIT_ROUNDOFF[dtype], roundings(x, spec))
    if verdict.passed:
        return None
    names = " and ".join(f"dL_S/d{name}" for name in exact)
    return f"{names} (from the final state alone): {verdict.message}"


def _initial(impl: Implementation, case: Case, x, like) -> tuple[torch.Tensor, ...]:
    """The initial state's parts, each in the dtype and device of the kernel's own: N(0, 1)
    for S alone, the exact state of the case's sequence for (S, z)."""
    if not impl.spec.normalize:
        return (_draw(like[0], tuple(like[0].shape), case, 31),)
    exact = exact_state(x, impl.spec)
    return tuple(torch.as_tensor(t).to(part) for t, part in zip(exact, like, strict=True))


@check("state-gradient", backward=True)
def state_gradient(impl: Implementation, case: Case) -> Outcome:
    """dL/dS_0 (and dL/dz_0) and the final state's dL_S/dv, dL_S/dk (and dL_S/dg; dL_S/dq =
    0) within their bounds of the exact ones; a family's own model: _own_model."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    own = state_parts(impl.call_state(q, k, v, w, None, decay=decay)[1], spec)
    g_out = loss_weights(case, q, v, salt=32)
    cotangents = [_draw(t, tuple(t.shape), case, 33 + n) for n, t in enumerate(own)]
    family = family_of(spec)
    if family.state_gradients is not None:
        return _own_model(family, impl, case, (q, k, v, w, decay), x, g_out, cotangents)
    arrays = [as_array(t) for t in cotangents]
    g_z = arrays[1] if spec.normalize else None
    try:
        initial = _initial(impl, case, x, own)
        given = [as_array(t) for t in initial]
        exact = exact_state_gradients(
            x,
            spec,
            as_array(g_out),
            arrays[0],
            g_z,
            given if spec.normalize else None,
            similarity=family_of(spec).similarity,
        )
        initial_parts = (given[0], given[1] if spec.normalize else None)
        keys_and_gates = final_state_gradients(
            x, spec, arrays[0], g_z, initial_parts, similarity=family_of(spec).similarity
        )
    except ReferenceAccuracyError as err:
        return Outcome(True, f"not judged: {err}")
    normalised = (g_z, given, exact) if spec.normalize else None
    u, tiny = UNIT_ROUNDOFF[case.dtype], SMALLEST_SUBNORMAL[case.dtype]
    bound_s, bound_z, bound_v = state_gradient_bound(
        x, spec, as_array(g_out), arrays[0], u, tiny, normalised
    )
    bounds = [b for b in (bound_s, bound_z, bound_v) if b is not None]
    if not any(np.isfinite(b).any() for b in bounds):
        return Outcome(
            True,
            f"not judged in {case.dtype}: every bound is infinite (n u >= 1, or each row's "
            "normaliser within its error of 0)",
        )
    d_initial = _backward(impl, q, k, v, w, decay, initial, cotangents, g_out)[4:]
    dq, dk, dv, dg = _backward(impl, q, k, v, w, decay, initial, cotangents, None)[:4]
    problems = [
        _beyond("dL/dS_0", d_initial[0], exact.s0, bound_s, own[0].dtype),
        _beyond("dL_S/dv (from the final state alone)", dv, exact.v, bound_v, v.dtype),
        _keys_and_gates(x, spec, case.dtype, keys_and_gates, {"k": dk, "g": dg}),
    ]
    if spec.normalize:
        problems.append(_beyond("dL/dz_0", d_initial[1], exact.z0, bound_z, own[1].dtype))
    if np.any(dq != 0):
        at = tuple(int(t) for t in np.argwhere(dq != 0)[0])
        problems.append(f"dL_S/dq{list(at)} = {dq[at]:.3g}: the final state moves the queries")
    problems = [p for p in problems if p]
    if problems:
        return Outcome(False, "; ".join(problems))
    names = "dL/dS_0, dL/dz_0" if spec.normalize else "dL/dS_0"
    unjudged = sum(int((~np.isfinite(b)).sum()) for b in bounds)
    rest = f" ({unjudged} element(s) not judged: their bound is infinite)" * bool(unjudged)
    of_state = "dL_S/dv, dL_S/dk" + ", dL_S/dg" * ("g" in family.argument_names(spec))
    return Outcome(True, f"{names} and the final state's {of_state} within their bounds" + rest)


def _own_model(family: Family, impl: Implementation, case: Case, inputs, x, g_out, cotangents):
    """A family's own model (Family.state_gradients; the delta rule's): every gradient of
    L = sum(out * G) + sum(S_N * G_S) from S_0 ~ N(0, 1), dL/dS_0 included, against the
    exact ones, within the a-priori bound gamma_n M and the budget of the golden form's
    backward from the same S_0 (gradient.py: the budget judges where the loose bound
    cannot, in float16 and bfloat16 above all)."""
    spec, model = impl.spec, family.state_gradients
    (q, k, v, w, decay), s0 = inputs, _draw(cotangents[0], tuple(cotangents[0].shape), case, 31)
    arrays = [as_array(t) for t in (g_out, cotangents[0], s0)]
    try:
        exact = model.exact(x, spec, *arrays)
    except ReferenceAccuracyError as err:
        return Outcome(True, f"not judged: {err}")
    grads = _backward(impl, q, k, v, w, decay, (s0,), cotangents, g_out)
    got = dict(zip(("q", "k", "v"), grads[:3])) | model.arguments(spec, grads[3])
    golden = _golden_gradients(family, spec, (q, k, v, decay, s0), g_out, cotangents[0])
    mags = model.magnitudes(x, spec, *arrays)
    n, u = model.roundings(x, spec), UNIT_ROUNDOFF[case.dtype]
    cancelled = family.cancelled_terms(x, spec, *arrays)
    got = got | {"S0": grads[4]}
    verdict = judge_gradients(got, exact, mags, case.dtype, u, n, [golden], cancelled)
    what = ", ".join(f"dL/d{name}" for name in exact)
    if verdict.passed:
        return Outcome(True, f"{what} of the output and final state: {verdict.message}")
    severity = "wrong" if verdict.violations else "inaccurate"
    message = f"{what} of the output and final state: {verdict.message}"
    figures = {f"max_error_d{name}": e for name, e in verdict.max_error.items()}
    figures |= {"max_error": max(verdict.max_error.values()), "bound": verdict.bound}
    figures |= {f"budget_d{name}": b for name, b in (verdict.budget or {}).items()}
    if not verdict.violations:
        tensors = (q, k, v, decay, s0)

        def verdict_of(design):
            rounded = _golden_gradients(family, design, tensors, g_out, cotangents[0])
            return judge_gradients(got, exact, mags, case.dtype, u, n, [rounded], cancelled)

        figures |= stored_figures(spec, case.dtype, verdict_of)
    return Outcome(False, message, figures, severity=severity)


def _golden_gradients(family: Family, spec, tensors, g_out, g_state) -> dict[str, np.ndarray]:
    """The golden form's gradients (StateGradients.golden_with_state, autograd) of
    sum(out * g_out) + sum(S_N * g_state) for (q, k, v, the packed argument, S_0)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    model = family.state_gradients
    with torch.enable_grad():
        out, final = model.golden_with_state(*leaves[:3], spec, leaves[3], leaves[4])
        loss = (out * g_out).sum() + (final * g_state.to(final.dtype)).sum()
        grads = torch.autograd.grad(loss, leaves)
    named = dict(zip(("q", "k", "v"), grads[:3])) | model.arguments(spec, grads[3])
    return {name: as_array(t) for name, t in (named | {"S0": grads[4]}).items()}
