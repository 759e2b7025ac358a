"""The delta rule behind families.protocol.Family: the hooks the shared layers call."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...implementations.forms import check_finite, check_tensors
from ...inputs import AttentionInputs
from ...reference.certified import Certified
from ...specs import Spec, SpecError
from ..decayed.notes import DECAY_NOTES
from ..decayed.values import decay_values, widest_gate_sum
from ..protocol import ArgumentNotes, Family, StateGradients
from .bound import delta_scale_and_bound, delta_state_bound
from .certified_gradients import certified_delta_gradients
from .fields import DELTA_SOURCE, OPTIONS, check
from .forms import DELTA_FORMS, delta_attention, grouped
from .golden import GOLDEN_DELTA_FORMS, golden_delta, golden_delta_with_state
from .gradient_bound import delta_cancelled_terms, delta_gradient_magnitudes, delta_roundings
from .gradients import exact_delta_gradients
from .inputs import (
    DELTA_KINDS,
    case_arguments,
    default_arguments,
    delta_arguments,
    long_arguments,
    pack_delta,
    validate_delta,
)
from .reference import (
    MP_MAX_STEPS,
    arb_delta,
    arb_delta_decimal,
    certified_delta,
    exact_delta_state,
    mp_delta,
)
from .vectors import KNOWN_ANSWER_SPECS, delta_vector_cases, formulas, vector_fields


def _pack(spec: Spec, arguments: dict[str, Any]) -> torch.Tensor:
    """beta (B, H, N) with the gates g packed beside it (inputs.pack_delta)."""
    if arguments.get("beta") is None:
        raise SpecError("the delta rule needs beta (B, H, N)")
    gates = decay_values(spec, None, arguments.get("g"))
    beta = torch.as_tensor(arguments["beta"])
    return pack_delta(beta, None if gates is None else torch.as_tensor(gates))


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """beta= and g= from the packed argument, in the kernel's layout, contiguous."""
    if layout == "bnhd":
        packed = packed.transpose(1, 2)
    return {name: t.contiguous() for name, t in delta_arguments(spec, packed).items()}


def _attention_with_state(q, k, v, spec, form, projection, chunk_size, initial_state, arguments):
    q, k = grouped(q, k, v)
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    beta, g = arguments.get("beta"), arguments.get("g")
    return delta_attention(q, k, v, spec, form, beta, g, chunk_size, initial_state)


def _attention(q, k, v, spec, form, projection, chunk_size, arguments) -> torch.Tensor:
    form = form or DELTA_FORMS[-1]
    return _attention_with_state(q, k, v, spec, form, projection, chunk_size, None, arguments)[0]


def _attention_varlen(q, k, v, spec, cu_seqlens, form, projection, chunk_size, arguments):
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    beta, g = arguments.get("beta"), arguments.get("g")
    form = form or DELTA_FORMS[-1]
    return delta_attention(q, k, v, spec, form, beta, g, chunk_size, None, cu_seqlens)[0]


def _exact(x: AttentionInputs, spec: Spec, engine: str) -> np.ndarray:
    """mpmath's recurrence up to MP_MAX_STEPS multiplications, arb's beyond, or the
    certified float64 one."""
    b, h, nq, _, d, dv = x.shape
    if engine == "auto":
        engine = "mp" if b * h * nq * d * dv <= MP_MAX_STEPS else "arb"
    if engine == "certified":
        return certified_delta(x, spec).values
    return (mp_delta if engine == "mp" else arb_delta)(x, spec)[0]


def _certified(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
    """certified_delta settles every row whose bound needs it: `settle` asks nothing more."""
    return certified_delta(x, spec)


def _exact_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    """Always defined (unnormalised): the gradients, gradient_bound.py's M and n."""
    exact = exact_delta_gradients(x, spec, g)
    return exact, delta_gradient_magnitudes(x, spec, g), delta_roundings(x, spec)


def _certified_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    exact, bounds = certified_delta_gradients(x, spec, g)
    return exact, bounds, delta_gradient_magnitudes(x, spec, g), delta_roundings(x, spec)


def _state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0):
    """The bound on S_N, and none on a denominator sum z (the rule has none)."""
    return delta_state_bound(x, spec, u, tiny), np.zeros(x.k.shape[:2] + x.k.shape[3:])


NOTES = ArgumentNotes(
    key="delta_rule",
    title="The delta rule's arguments",
    accuracy="q, k, v and the packed beta and gates of families.case_arguments of that "
    "case, not the draws above: unit-norm keys (raw under qk_l2norm), beta ~ U(0, 1)",
    long="the check's: unit-norm keys (raw under qk_l2norm), beta ~ U(0, 1); N up to "
    "{longest} ({full_longest} with --full)",
    scaling="families.default_arguments: beta = 1 / d every token",
    long_note=" The delta rule runs to N = {longest_power} (--full: "
    "{full_longest_power}): its a-priori bound and its golden are recurrences "
    "token by token (vet's long-context check takes it to 2^14); its keys are unit-norm "
    "(raw where the kernel normalises them), beta ~ U(0, 1), and its bound is its normwise "
    "one alone (docs/delta-rule.md): *bound* and *probabilistic bound* are that one.",
)

DELTA = Family(
    name="delta rule",
    folder="delta",
    label="delta",
    source=DELTA_SOURCE,
    claims=lambda spec: spec.delta_rule,
    check=check,
    arguments=("beta", "g"),
    pack=_pack,
    argument_names=lambda spec: ("beta",) + ("g",) * (spec.decay is not None),
    keywords=_keywords,
    validate=validate_delta,
    case_arguments=case_arguments,
    default_arguments=default_arguments,
    forms=lambda spec: DELTA_FORMS,
    attention=_attention,
    attention_with_state=_attention_with_state,
    attention_varlen=_attention_varlen,
    exact=_exact,
    certified=_certified,
    exact_state=lambda x, spec: (exact_delta_state(x, spec)[1], None),
    golden_forms=lambda spec: GOLDEN_DELTA_FORMS,
    long_form=lambda spec: GOLDEN_DELTA_FORMS[-1],
    golden=golden_delta,
    sum_length=lambda nk, d, m: nk * (d + 5),  # Nk steps of d + 5 roundings (bound.py)
    exact_gradients=_exact_gradients,
    certified_gradients=_certified_gradients,
    long_arguments=long_arguments,
    sums_memory=False,  # I - beta k k^T is non-expansive: the state stays bounded
    kinds=DELTA_KINDS,
    stepwise=True,
    scale_and_bound=delta_scale_and_bound,
    exact_decimal=arb_delta_decimal,
    known_answer_specs=KNOWN_ANSWER_SPECS,
    known_answer_cases=delta_vector_cases,
    vector_fields=vector_fields,
    formulas=formulas,
    state_bound=_state_bound,
    forgets=lambda spec: spec.decay is not None,
    per_token=lambda spec: True,  # beta, and the gates with it
    widest_gate_sum=widest_gate_sum,
    state_gradients=StateGradients(
        exact=exact_delta_gradients,
        magnitudes=delta_gradient_magnitudes,
        roundings=delta_roundings,
        golden_with_state=golden_delta_with_state,
        arguments=delta_arguments,
    ),
    cancelled_terms=delta_cancelled_terms,
    notes=(DECAY_NOTES, NOTES),
    options=OPTIONS,
)
