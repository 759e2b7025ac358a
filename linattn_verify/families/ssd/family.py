"""The SSD layer behind families.protocol.Family: the hooks the shared layers call.

A family chosen by name (Spec.family == "ssd", --family ssd): the identity spec, causal,
unnormalised, scale 1, with q, k, v = C, B, x and dt, A, D, dt_bias (and z with --z-gate)
beside them (family.arguments), packed into one per-call tensor (B, H, N, 4 [+ dv]) whose
token axis is 2 (inputs.pack_ssd); its own options (fields.py) say which transform dt takes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...implementations.forms import check_finite, check_tensors
from ...inputs import AttentionInputs
from ...specs import Spec, SpecError
from ..delta.forms import grouped
from ..protocol import Family
from .bound import ssd_scale_and_bound, ssd_state_bound
from .fields import OPTIONS, SSD_SOURCE, check
from .forms import SSD_FORMS, ssd_attention
from .golden import GOLDEN_SSD_FORMS, golden_ssd
from .inputs import (
    case_arguments,
    default_arguments,
    long_arguments,
    names,
    pack_ssd,
    ssd_arguments,
    validate_ssd,
)
from .reference import certified_ssd, exact_ssd, exact_ssd_state

ARGUMENTS = ("dt", "A", "D", "dt_bias", "z")
# what the folder does not serve yet, by check name (checks.not_applicable, the long checks)
_NO_GRADIENTS = "the SSD folder has no exact gradients yet (families/ssd/)"
LACKS = {
    "gradient": _NO_GRADIENTS,
    "gradient-causality": _NO_GRADIENTS,
    "gradient-associativity": _NO_GRADIENTS,
    "gradient-finite": _NO_GRADIENTS,
    "state-gradient": _NO_GRADIENTS,
    "gradient-length": _NO_GRADIENTS,
    "decay": "the SSD draws do not take the decay check's rates yet: dt and A come from "
    "Mamba-2's ranges (families/ssd/inputs.py)",
    "long-context": "the SSD folder has no certified float64 engine yet: arb alone is too "
    "slow at long N (families/ssd/reference.py)",
}


def _pack(spec: Spec, arguments: dict[str, Any]) -> torch.Tensor:
    """dt, A, D, dt_bias (and z) as one tensor (inputs.pack_ssd)."""
    missing = [name for name in names(spec) if arguments.get(name) is None]
    if missing:
        shapes = "dt (B, H, N); A, D, dt_bias (H,)" + "; z (B, H, N, dv)" * spec.z_gate
        raise SpecError(f"the SSD layer of {spec} needs {', '.join(missing)}: {shapes}")
    return pack_ssd(*(torch.as_tensor(arguments[name]) for name in names(spec)))


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """dt, A, D, dt_bias and z from the pack, in the kernel's layout, contiguous."""
    if layout == "bnhd":
        packed = packed.transpose(1, 2)
    given = ssd_arguments(spec, packed, head_axis=2 if layout == "bnhd" else 1)
    return {name: t.contiguous() for name, t in given.items()}


def _attention_with_state(q, k, v, spec, form, projection, chunk_size, initial_state, arguments):
    q, k = grouped(q, k, v)  # C and B shared by groups of heads
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    packed = _pack(spec, arguments).to(v.dtype)
    return ssd_attention(q, k, v, spec, form, packed, chunk_size, initial_state)


def _attention(q, k, v, spec, form, projection, chunk_size, arguments) -> torch.Tensor:
    form = form or SSD_FORMS[-1]
    return _attention_with_state(q, k, v, spec, form, projection, chunk_size, None, arguments)[0]


def _attention_varlen(q, k, v, spec, cu_seqlens, form, projection, chunk_size, arguments):
    q, k = grouped(q, k, v)
    check_tensors(q, k, v, spec, projection)
    check_finite(q, k, v, projection)
    packed = _pack(spec, arguments).to(v.dtype)
    form = form or SSD_FORMS[-1]
    return ssd_attention(q, k, v, spec, form, packed, chunk_size, None, cu_seqlens)[0]


def _no_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    raise SpecError(f"{spec}: {_NO_GRADIENTS}")


def _state_bound(x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0):
    """The bound on S_N, and none on a denominator sum z (the layer has none)."""
    return ssd_state_bound(x, spec, u, tiny), np.zeros(x.k.shape[:2] + x.k.shape[3:])


SSD = Family(
    name="SSD layer",
    folder="ssd",
    label="ssd",
    source=SSD_SOURCE,
    claims=lambda spec: spec.family == "ssd",
    check=check,
    arguments=ARGUMENTS,
    pack=_pack,
    argument_names=names,
    keywords=_keywords,
    validate=validate_ssd,
    case_arguments=case_arguments,
    default_arguments=default_arguments,
    forms=lambda spec: SSD_FORMS,
    attention=_attention,
    attention_with_state=_attention_with_state,
    attention_varlen=_attention_varlen,
    exact=exact_ssd,
    certified=certified_ssd,
    exact_state=lambda x, spec: (exact_ssd_state(x, spec)[1], None),
    golden_forms=lambda spec: GOLDEN_SSD_FORMS,
    long_form=lambda spec: GOLDEN_SSD_FORMS[-1],
    golden=golden_ssd,
    sum_length=lambda nk, d, m: nk + d + 2,  # the state's additions and the dot (bound.py)
    exact_gradients=_no_gradients,
    certified_gradients=_no_gradients,
    long_arguments=long_arguments,
    sums_memory=False,  # the decays exp(dt A) < 1 forget: the state stays bounded
    kinds=(),
    stepwise=True,
    scale_and_bound=ssd_scale_and_bound,
    state_bound=_state_bound,
    lacks=LACKS,
    named=True,
    per_token=lambda spec: True,  # dt and z per token, axis 2 (inputs.pack_ssd)
    options=OPTIONS,
    forgets=lambda spec: True,
)
