"""Spec families: each one folder behind one protocol (protocol.Family), named by the
registry; `dispatch` takes any family's spec through that protocol (docs/architecture.md,
"Families")."""

from .dispatch import (
    arguments,
    attention,
    attention_varlen,
    attention_with_state,
    case_arguments,
    certified,
    default_arguments,
    exact,
    exact_state,
    fast_form,
    forms_of,
    golden_attention,
    golden_forms,
    long_form,
    reference,
    spec_words,
    validate,
)
from .protocol import Family
from .registry import FAMILIES, family_of

__all__ = [
    "FAMILIES",
    "Family",
    "arguments",
    "attention",
    "attention_varlen",
    "attention_with_state",
    "case_arguments",
    "certified",
    "default_arguments",
    "exact",
    "exact_state",
    "family_of",
    "fast_form",
    "forms_of",
    "golden_attention",
    "golden_forms",
    "long_form",
    "reference",
    "spec_words",
    "validate",
]
