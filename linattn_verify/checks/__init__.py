"""The checks: one plain function per property, (implementation, case) -> CheckResult.

`pytest properties/`, `vet` and `report` call these same functions (docs/architecture.md, "Layers").
CHECKS names them all; `not_applicable(name, impl)` says why one does not apply.
"""

from __future__ import annotations

from ..families import family_of
from ..under_test import Implementation
from .agreement import associativity, reference_agreement
from .causality import causality, split_resume
from .contract import contract
from .decay import decay
from .gradients import gradient, gradient_associativity, gradient_causality, gradient_finite
from .invariance import batch_head, layout, permutation, v_affine
from .positivity import convex_hull, positivity
from .state import final_state, initial_state, state_split
from .state_gradient import state_gradient
from .step import NO_BACKWARD, step_cache, step_decode
from .value_heads import value_heads
from .varlen import varlen

CHECKS = {
    fn.check_name: fn
    for fn in (
        contract,
        reference_agreement,
        associativity,
        positivity,
        convex_hull,
        v_affine,
        permutation,
        causality,
        batch_head,
        layout,
        split_resume,
        state_split,
        initial_state,
        final_state,
        step_decode,
        step_cache,
        varlen,
        decay,
        value_heads,
    )
}
STATE_CHECKS = ("state-split", "initial-state", "final-state")  # with --state
STEP_CHECKS = ("step-decode", "step-cache")  # with --step


# The backward pass (vet --grad, properties/test_gradients.py): opt-in, each case costs an
# exact gradient (reference/grad.py).
GRAD_CHECKS = {
    fn.check_name: fn
    for fn in (
        gradient,
        gradient_causality,
        gradient_associativity,
        gradient_finite,
        state_gradient,
    )
}
ALL_CHECKS = CHECKS | GRAD_CHECKS


# the checks of a normalised output's properties
NORMALISED = ("positivity", "convex-hull", "v-affine")


def not_applicable(name: str, impl: Implementation) -> str | None:
    """Why check `name` does not apply to impl's spec (None when it does)."""
    spec, family = impl.spec, family_of(impl.spec)
    if impl.step is not None and name in GRAD_CHECKS:
        return NO_BACKWARD
    if lacking := family.lacks.get(name):
        return lacking
    if name == "split-resume" and family.forgets(spec):
        return "the stream API carries no decay (the state checks take it)"
    if name == "decay" and not family.forgets(spec):
        return "no decay declared"
    if not spec.normalize and name in NORMALISED:
        return "an unnormalised output is no weighted mean of v"
    if name == "associativity" and family.quadratic:
        return f"{spec.feature_map} has no feature map: one association only"
    if name == "convex-hull" and not spec.info.positive:
        return f"{spec.feature_map} is not a positive kernel"
    if name == "permutation" and spec.ordered:
        return spec.ordered
    if name in ("causality", "gradient-causality") and not spec.causal:
        return "non-causal spec"
    if name == "split-resume" and (not spec.causal or impl.stream is None):
        return "no state API" if spec.causal else "non-causal spec"
    if name in (*STATE_CHECKS, "state-gradient"):
        return _state_not_applicable(name, impl)
    if name in STEP_CHECKS:
        return _state_not_applicable(name, impl)
    if name == "varlen" and not impl.varlen:
        return "no --varlen declared"
    if name == "value-heads" and spec.value_heads == 1:
        return "no --value-heads declared"
    return None


def _state_not_applicable(name: str, impl: Implementation) -> str | None:
    """Why a check of the carried state does not apply."""
    spec, step = impl.spec, name in STEP_CHECKS
    if (impl.step if step else impl.state) is None:
        return f"no --{'step' if step else 'state'} declared"
    if spec.no_state:
        return spec.no_state
    if name != "state-split" and spec.feature_map == "taylor":
        return "the taylor spec fixes sim, not the order of the features a state holds"
    return None


__all__ = [
    "ALL_CHECKS",
    "CHECKS",
    "GRAD_CHECKS",
    "STATE_CHECKS",
    "STEP_CHECKS",
    "associativity",
    "batch_head",
    "causality",
    "contract",
    "convex_hull",
    "decay",
    "final_state",
    "gradient",
    "gradient_associativity",
    "gradient_causality",
    "gradient_finite",
    "initial_state",
    "layout",
    "not_applicable",
    "permutation",
    "positivity",
    "reference_agreement",
    "split_resume",
    "state_gradient",
    "state_split",
    "step_cache",
    "step_decode",
    "v_affine",
    "value_heads",
    "varlen",
]
