"""The IPLR rule behind families.protocol.Family: the hooks the shared layers call.

A family chosen by name (Spec.family == "iplr", --family iplr): the identity spec, causal,
unnormalised, with a and b (B, H, N, d) per token (family.arguments), packed into one
per-call tensor (B, H, N, 2 d) whose token axis is 2 (inputs.pack_iplr).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...implementations.forms import check_finite, check_tensors
from ...inputs import AttentionInputs
from ...specs import Spec, SpecError
from ..delta.inputs import DELTA_KINDS
from ..protocol import Family
from .bound import iplr_scale_and_bound, iplr_state_bound, step_roundings
from .forms import IPLR_FORMS, iplr_attention
from .golden import GOLDEN_IPLR_FORMS, golden_iplr
from .inputs import (
    case_arguments,
    default_arguments,
    iplr_arguments,
    long_arguments,
    pack_iplr,
    validate_iplr,
)
from .reference import certified_iplr, exact_iplr, exact_iplr_state

IPLR_SOURCE = (
    "identity plus low rank (fla-core 0.6.0, fla/ops/generalized_delta_rule/iplr/naive.py, "
    "iplr_recurrence): S_t = (I + b_t a_t^T) S_(t-1) + k_t v_t^T, o_t = c S_t^T q_t; the "
    "generalised delta rule of Yang et al. 2024, 'Parallelizing linear transformers with the "
    "delta rule', and RWKV-7's transition (Peng et al. 2025, 'RWKV-7 Goose') without its "
    "diagonal"
)
# what the folder does not serve yet, by check name (checks.not_applicable, the long checks)
_NO_GRADIENTS = "the IPLR folder has no exact gradients yet (families/iplr/)"
LACKS = {
    "gradient": _NO_GRADIENTS,
    "gradient-causality": _NO_GRADIENTS,
    "gradient-associativity": _NO_GRADIENTS,
    "gradient-finite": _NO_GRADIENTS,
    "state-gradient": _NO_GRADIENTS,
    "gradient-length": _NO_GRADIENTS,
    "long-context": "the IPLR folder has no certified float64 engine yet: arb alone is too "
    "slow at long N (families/iplr/reference.py)",
}


def check(spec: Spec) -> None:
    """SpecError unless `spec` is the IPLR rule's: causal, identity features, unnormalised,
    no decay, no eps (other families' options: families.registry.family_of)."""
    wrong = [
        what
        for what, bad in (
            ("causal", not spec.causal),
            ("the identity feature map", spec.feature_map != "identity"),
            ("unnormalised", spec.normalize),
            ("no decay", spec.decay is not None),
            ("eps 0", spec.eps != 0),
        )
        if bad
    ]
    if wrong:
        raise SpecError(f"the IPLR family takes {', '.join(wrong)}: not {spec}")


def _pack(spec: Spec, arguments: dict[str, Any]) -> torch.Tensor:
    """a and b (B, H, N, d) side by side (inputs.pack_iplr)."""
    if arguments.get("a") is None or arguments.get("b") is None:
        raise SpecError("the IPLR rule needs a and b (B, H, N, d)")
    return pack_iplr(torch.as_tensor(arguments["a"]), torch.as_tensor(arguments["b"]))


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """a= and b= from the packed argument, in the kernel's layout, contiguous."""
    if layout == "bnhd":
        packed = packed.transpose(1, 2)
    return {name: t.contiguous() for name, t in iplr_arguments(spec, packed).items()}


def _attention_with_state(q, k, v, spec, form, projection, chunk_size, initial_state, arguments):
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    a, b = arguments.get("a"), arguments.get("b")
    return iplr_attention(q, k, v, spec, form, a, b, chunk_size, initial_state)


def _attention(q, k, v, spec, form, projection, chunk_size, arguments) -> torch.Tensor:
    form = form or IPLR_FORMS[-1]
    return _attention_with_state(q, k, v, spec, form, projection, chunk_size, None, arguments)[0]


def _attention_varlen(q, k, v, spec, cu_seqlens, form, projection, chunk_size, arguments):
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    a, b = arguments.get("a"), arguments.get("b")
    form = form or IPLR_FORMS[-1]
    return iplr_attention(q, k, v, spec, form, a, b, chunk_size, None, cu_seqlens)[0]


def _no_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    raise SpecError(f"{spec}: {_NO_GRADIENTS}")


def _state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0):
    """The bound on S_N, and none on a denominator sum z (the rule has none)."""
    return iplr_state_bound(x, spec, u, tiny), np.zeros(x.k.shape[:2] + x.k.shape[3:])


IPLR = Family(
    name="IPLR rule",
    folder="iplr",
    label="iplr",
    source=IPLR_SOURCE,
    claims=lambda spec: spec.family == "iplr",
    check=check,
    arguments=("a", "b"),
    pack=_pack,
    argument_names=lambda spec: ("a", "b"),
    keywords=_keywords,
    validate=validate_iplr,
    case_arguments=case_arguments,
    default_arguments=default_arguments,
    forms=lambda spec: IPLR_FORMS,
    attention=_attention,
    attention_with_state=_attention_with_state,
    attention_varlen=_attention_varlen,
    exact=exact_iplr,
    certified=certified_iplr,
    exact_state=lambda x, spec: (exact_iplr_state(x, spec)[1], None),
    golden_forms=lambda spec: GOLDEN_IPLR_FORMS,
    long_form=lambda spec: GOLDEN_IPLR_FORMS[-1],
    golden=golden_iplr,
    sum_length=lambda nk, d, m: nk * step_roundings(d),  # Nk steps (bound.py)
    exact_gradients=_no_gradients,
    certified_gradients=_no_gradients,
    long_arguments=long_arguments,
    sums_memory=False,  # typical transitions do not expand: the state stays bounded
    kinds=DELTA_KINDS,  # their meaning for a and b: inputs.py
    stepwise=True,
    scale_and_bound=iplr_scale_and_bound,
    state_bound=_state_bound,
    lacks=LACKS,
    named=True,
    per_token=lambda spec: True,  # a and b per token, axis 2 (inputs.pack_iplr)
)
