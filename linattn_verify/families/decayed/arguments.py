"""A decay's argument hooks (Family.pack, validate, argument_names, keywords,
case_arguments, default_arguments, long_arguments, forgets, widest_gate_sum): gamma (H,) or
the log-gates g, per token (values.py), drawn by cases.Case.decay; shared by the scalar
decays and channel gates (the delta rule packs its gates with beta: families/delta/inputs.py)."""

from __future__ import annotations

from typing import Any

import torch

from ...cases import Case, constant_decay, rated_decay
from ...specs import Spec
from .values import DECAY_ARGUMENTS, pack_decay, validate_decayed, widest_gate_sum


def _names(spec: Spec) -> tuple[str, ...]:
    return (DECAY_ARGUMENTS[spec.decay],)


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """gamma= or g= (DECAY_ARGUMENTS); log-gates in the kernel's layout."""
    if spec.gated and layout == "bnhd":
        packed = packed.transpose(1, 2).contiguous()
    return {name: packed for name in _names(spec)}


def _case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    return (*case.tensors(), case.decay(spec.decay))


def _long_arguments(spec: Spec, k: torch.Tensor, rates: torch.Tensor, seed: int, dtype):
    """The keys as given and the decay of `rates` (cases.rated_decay); a constant decay's
    first memory kept below 1 in `dtype` too (float16 and bfloat16 round exp(-2^-12) to 1:
    it stays at the dtype's largest value below 1, 1 - 2^-11 or 1 - 2^-8)."""
    decay = rated_decay(spec.decay, rates, tuple(k.shape), seed)
    if spec.decay == "constant":
        below_one = 1 - torch.finfo(dtype).eps / 2
        decay[::2] = torch.minimum(decay[::2].to(dtype).double(), torch.tensor(below_one))
    return k, decay


def decay_arguments(names: tuple[str, ...]) -> dict[str, Any]:
    """The hooks of a family whose argument is a decay, taken by the keywords `names`."""
    return {
        "arguments": names,
        "pack": pack_decay,
        "validate": validate_decayed,
        "argument_names": _names,
        "keywords": _keywords,
        "case_arguments": _case_arguments,
        "default_arguments": lambda spec, q: constant_decay(spec.decay, q),
        "long_arguments": _long_arguments,
        "forgets": lambda spec: True,
        "widest_gate_sum": widest_gate_sum,
    }
