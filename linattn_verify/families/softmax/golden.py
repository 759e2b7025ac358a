"""Softmax attention's golden form: the quadratic one (quadratic.py), softmax having no
finite feature map for a linear one."""

from __future__ import annotations

import torch

from ...specs import Spec, summing
from .quadratic import FORMS, softmax_attention


def golden_forms(spec: Spec) -> tuple[str, ...]:
    """The golden forms whose error sets `spec`'s accuracy budgets: the quadratic form."""
    summing(spec, "golden forms")
    return FORMS


def long_form(spec: Spec) -> str:
    """The golden form of the long-context check (checks/long_context.py): the quadratic."""
    return "quadratic"


def golden_attention(q, k, v, spec: Spec, projection=None, form=None, decay=None) -> torch.Tensor:
    """Attention for `spec`, evaluated carefully in the quadratic form (None: it)."""
    if isinstance(spec, Spec):
        form = form or golden_forms(summing(spec, "golden forms"))[0]
    return softmax_attention(q, k, v, spec, projection, form, decay)
