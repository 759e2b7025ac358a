"""What the families whose output sums similarities share (kernelised attention, softmax,
the scalar decays, channel gates; DESIGN.md, "Spec families"): reference/'s engines run
with a family's similarities (reference/similarity.py), the shared a-priori bound with its
terms (protocol.SumsBound), and `sums_family`, the Family of a folder's pieces. A family of
them takes no argument beyond q, k, v and W unless its folder gives its own (the decays':
families/decayed/arguments.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..cases import Case
from ..inputs import AttentionInputs, validate
from ..reference import exact_attention
from ..reference.arb import arb_decimal, arb_denominator_signs
from ..reference.certified import Certified
from ..reference.certified_engine import certified_attention
from ..reference.grad import exact_gradients_and_magnitudes, roundings
from ..reference.similarity import Similarity
from ..reference.state import exact_state
from ..specs import Spec
from .protocol import Family

# the argument hooks of a family that takes none beyond q, k, v and W
NO_ARGUMENTS: dict[str, Any] = {
    "arguments": (),
    "pack": lambda spec, arguments: None,
    "validate": validate,
    "argument_names": lambda spec: (),
    "keywords": lambda spec, packed, layout: {},
    "case_arguments": lambda case, spec: _tensors(case),
    "default_arguments": lambda spec, q: None,
    "long_arguments": lambda spec, k, rates, seed, dtype: (k, None),
}


def _tensors(case: Case) -> tuple[torch.Tensor | None, ...]:
    """(q, k, v, W, None) of a case: no packed argument."""
    return (*case.tensors(), None)


def _references(similarity: Similarity) -> dict[str, Any]:
    """The reference hooks of a family whose engines are reference/'s, with its folder's
    similarities (families/<name>/reference.py)."""

    def exact(x: AttentionInputs, spec, engine: str = "auto") -> np.ndarray:
        return exact_attention(x, spec, similarity, engine)

    def certified(x: AttentionInputs, spec, settle: np.ndarray | None = None) -> Certified:
        return certified_attention(x, spec, similarity, settle)

    def exact_gradients(x: AttentionInputs, spec, g: np.ndarray):
        """The gradients and their magnitudes (reference/grad.py), or why L is undefined
        (an exact denominator of a normalised spec is 0)."""
        if spec.normalize and (zero := arb_denominator_signs(x, spec, similarity) == 0).any():
            at = tuple(int(t) for t in np.argwhere(zero)[0])
            return f"the exact denominator of row (b, h, i) = {at} is 0"
        hooks = similarity.gradients
        return (*exact_gradients_and_magnitudes(x, spec, g, hooks), roundings(x, spec, hooks))

    return {
        "exact": exact,
        "certified": certified,
        "exact_state": lambda x, spec: exact_state(x, spec, similarity),
        "exact_gradients": exact_gradients,
        "exact_decimal": lambda x, spec, digits: arb_decimal(x, spec, digits, similarity),
        "similarity": similarity,
    }


def _certified_gradients(gradients, similarity: Similarity):
    """Family.certified_gradients from a folder's certified_gradients(x, spec, g), n by its
    similarity's hooks (Similarity.gradients)."""
    hooks = similarity.gradients
    return lambda x, spec, g: (*gradients(x, spec, g), roundings(x, spec, hooks))


def sums_family(
    *,
    similarity: Similarity,
    gradients,
    forms,
    golden,
    arguments=NO_ARGUMENTS,
    check: Callable[[Spec], None] = lambda spec: None,
    **own: Any,
) -> Family:
    """The Family of a folder's pieces: its similarities (similarity), its certified
    gradients(x, spec, g), its forms (forms_of, attention, attention_with_state,
    attention_varlen), its golden forms (golden_forms, long_form, golden_attention), its
    argument hooks (`arguments`: NO_ARGUMENTS or its own), its spec's rules (`check`: none
    beyond specs.Spec's own by default) and `own`, the rest of its fields
    (name, folder, source, claims, weights, sums_bound, ...)."""
    return Family(
        check=check,
        forms=forms.forms_of,
        attention=forms.attention,
        attention_with_state=forms.attention_with_state,
        attention_varlen=forms.attention_varlen,
        golden_forms=golden.golden_forms,
        long_form=golden.long_form,
        golden=golden.golden_attention,
        sum_length=lambda nk, d, m: m + nk + 1,  # m features, Nk keys, eps
        certified_gradients=_certified_gradients(gradients, similarity),
        sums_memory=True,
        kinds=(),
        stepwise=False,
        **arguments,
        **_references(similarity),
        **own,
    )
