"""Softmax attention's built-in forms: the quadratic one alone (quadratic.py), softmax having
no finite feature map for a linear, recurrent or chunked one."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from ...implementations.forms import (
    DEFAULT_CHUNK,
    FORMS,
    check_finite,
    check_tensors,
    defined,
    varlen,
)
from ...specs import Spec, SpecError, summing
from .quadratic import softmax_attention


def forms_of(spec: Spec) -> tuple[str, ...]:
    """The forms that evaluate `spec`: the quadratic one."""
    summing(spec, "forms")
    return ("quadratic",)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str | None = None,
    projection: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    arguments: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Attention of `spec` in `form`, "quadratic" (None: it) (families.protocol.Family)."""
    spec = defined(spec, spec.causal)
    check_tensors(q, k, v, spec, projection)
    form = form or "quadratic"
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    if form != "quadratic":
        raise SpecError(f"{spec.feature_map!r} has no finite feature map: only form='quadratic'")
    check_finite(q, k, v, projection)
    return softmax_attention(q, k, v, spec, projection)


def attention_with_state(q, k, v, spec: Spec, *args: Any) -> tuple[torch.Tensor, Any]:
    """SpecError: softmax carries no state (it has no finite feature map)."""
    raise SpecError(f"{spec.feature_map!r} has no finite feature map: it cannot stream")


# attention() of a packed batch, called as Family.attention_varlen is (implementations.forms.varlen)
attention_varlen = partial(varlen, attention)
