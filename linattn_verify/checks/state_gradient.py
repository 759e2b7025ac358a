"""The backward pass of a carried state (--state with --grad): for the loss L = sum(out *
G) + sum(S_N * G_S), the output and the final state S_N weighted by cotangents seeded per
case, from an initial state S_0 drawn with the case,

- dL/dS_0 (fla's dh0, the final state's cotangent dht flowing into it through the decays)
  and dL_S/dv for L_S = sum(S_N * G_S) alone (dht into the inputs; dL_S/dq must be 0: the
  final state does not depend on the queries) against the exact ones of
  reference/state.py's exact_state_gradients, within accuracy/bound.py's
  state_gradient_bound (fla #1140 / PR #1141: dht and dh0 wrong for short chunks while the
  forward is exact).

Unnormalised specs only (the state is S; their gradients are linear in the cotangents):
the exact gradients of a normalised spec's (S, z) are not built yet.
"""

from __future__ import annotations

import numpy as np
import torch

from ..accuracy.bound import state_gradient_bound
from ..cases import Case
from ..inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from ..reference.state import exact_state_gradients
from ..under_test import Implementation, ImplementationFailure
from .core import Outcome, as_array, case_generator, check, inputs_of
from .gradients import loss_weights


def _draw(like: torch.Tensor, shape: tuple[int, ...], case: Case, salt: int) -> torch.Tensor:
    """N(0, 1) of `shape` from the case's seed, in like's dtype and device."""
    t = torch.randn(*shape, generator=case_generator(case, salt), dtype=torch.float64)
    return t.to(dtype=like.dtype, device=like.device)


def _backward(impl: Implementation, q, k, v, w, decay, s0, g_out, g_state):
    """(dq, dv, dS_0) of sum(out * g_out) + sum(S_N * g_state) through the kernel's
    autograd (g_out None: the final state's term alone), as float64 arrays."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, v, s0)]
    with torch.enable_grad():
        out, final = impl.call_state(leaves[0], k, leaves[1], w, leaves[2], decay=decay)
        loss = (final * g_state).sum() + (0 if g_out is None else (out * g_out).sum())
        if not loss.requires_grad:
            raise ImplementationFailure("returned a final state with no backward")
        try:
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        except Exception as err:  # the backward's failure is a finding
            raise ImplementationFailure(f"backward raised {type(err).__name__}: {err}") from None
    return [np.zeros(t.shape) if d is None else as_array(d) for t, d in zip(leaves, grads)]


def _beyond(what: str, got, want: np.ndarray, bound: np.ndarray, dtype) -> str | None:
    """Where got is farther than `bound` from want, or None; an exact value beyond dtype's
    range may be the infinity of its sign (its rounding)."""
    with np.errstate(invalid="ignore"):
        rounded_to_inf = (np.abs(want) > torch.finfo(dtype).max) & (got == np.sign(want) * np.inf)
        bad = ~((np.abs(got - want) <= bound) | rounded_to_inf)
    if not bad.any():
        return None
    i = tuple(int(t) for t in np.argwhere(bad)[0])
    return (
        f"{what}{list(i)} = {got[i]:.9g} against the exact {want[i]:.9g} ({int(bad.sum())} "
        f"element(s) beyond the bound, {bound[i]:.3g} there)"
    )


@check("state-gradient")
def state_gradient(impl: Implementation, case: Case) -> Outcome:
    """dL/dS_0 and the final state's dL_S/dv (and dL_S/dq = 0) within their bounds of the
    exact ones."""
    spec = impl.spec
    (q, k, v, w), x = inputs_of(case, spec)
    decay = case.decay(spec.decay)
    _, own = impl.call_state(q, k, v, w, None, decay=decay)
    s0 = _draw(own, tuple(own.shape), case, 31)
    g_out, g_state = loss_weights(case, q, v, salt=32), _draw(own, tuple(own.shape), case, 33)
    exact_s, exact_v = exact_state_gradients(x, spec, as_array(g_out), as_array(g_state))
    u = UNIT_ROUNDOFF[case.dtype]
    bound_s, bound_v = state_gradient_bound(
        x, spec, as_array(g_out), as_array(g_state), u, SMALLEST_SUBNORMAL[case.dtype]
    )
    if not (np.all(np.isfinite(bound_s)) and np.all(np.isfinite(bound_v))):
        return Outcome(True, f"not judged in {case.dtype}: the bound is vacuous (n u >= 1)")
    ds0 = _backward(impl, q, k, v, w, decay, s0, g_out, g_state)[2]
    dq, dv, _ = _backward(impl, q, k, v, w, decay, s0, None, g_state)
    problems = [
        _beyond("dL/dS_0", ds0, exact_s, bound_s, own.dtype),
        _beyond("dL_S/dv (from the final state alone)", dv, exact_v, bound_v, v.dtype),
    ]
    if np.any(dq != 0):
        at = tuple(int(t) for t in np.argwhere(dq != 0)[0])
        problems.append(f"dL_S/dq{list(at)} = {dq[at]:.3g}: the final state moves the queries")
    problems = [p for p in problems if p]
    if problems:
        return Outcome(False, "; ".join(problems))
    return Outcome(True, "dL/dS_0 and the final state's dL_S/dv within their bounds")
