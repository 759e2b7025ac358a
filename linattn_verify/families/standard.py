"""The families whose modules still sit in the horizontal packages, behind the same
protocol: kernelised attention (scale, eps, normalisation), the scalar decays (a constant
gamma per head, or log-gates per token), channel gates, and softmax. Their references are
reference/'s engines, their forms and golden forms their folders' (families/<f>/forms.py,
golden.py) and their bound accuracy/bound.py's, each until its folder lands
(docs/architecture.md, "Families")."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..cases import Case, constant_decay, rated_decay
from ..inputs import AttentionInputs, decay_values, validate
from ..reference import exact_attention
from ..reference.arb import arb_decimal, arb_denominator_signs
from ..reference.certified import Certified
from ..reference.certified_engine import certified_attention
from ..reference.grad import exact_gradients_and_magnitudes, roundings
from ..reference.similarity import Similarity
from ..reference.state import exact_state
from ..specs import DECAY_ARGUMENTS, DECAY_SOURCES, FEATURE_MAPS, Spec
from .channel_gates import forms as channel_gates_forms
from .channel_gates import golden as channel_gates_golden
from .channel_gates import reference as channel_gates_reference
from .channel_gates.quadratic import weights as channel_gates_weights
from .decayed import forms as decayed_forms
from .decayed import golden as decayed_golden
from .decayed import reference as decayed_reference
from .decayed.notes import DECAY_NOTES
from .decayed.quadratic import weights as decayed_weights
from .kernelised import certified_gradients as kernelised_gradients
from .kernelised import forms as kernelised_forms
from .kernelised import golden as kernelised_golden
from .kernelised import reference as kernelised_reference
from .kernelised.quadratic import weights as kernelised_weights
from .protocol import ArgumentNotes, Family
from .softmax import certified_gradients as softmax_gradients
from .softmax import forms as softmax_forms
from .softmax import golden as softmax_golden
from .softmax import reference as softmax_reference
from .softmax.quadratic import weights as softmax_weights


def _argument_names(spec: Spec) -> tuple[str, ...]:
    return () if spec.decay is None else (DECAY_ARGUMENTS[spec.decay],)


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """gamma= or g= (specs.DECAY_ARGUMENTS); log-gates in the kernel's layout."""
    if spec.gated and layout == "bnhd":
        packed = packed.transpose(1, 2).contiguous()
    return {name: packed for name in _argument_names(spec)}


def _case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    return (*case.tensors(), case.decay(spec.decay))


def _references(similarity: Similarity) -> dict[str, Any]:
    """The reference hooks of a family whose engines are reference/'s, with its folder's
    similarities (families/<name>/reference.py)."""

    def exact(x: AttentionInputs, spec: Spec, engine: str = "auto") -> np.ndarray:
        return exact_attention(x, spec, similarity, engine)

    def certified(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
        return certified_attention(x, spec, similarity, settle)

    def exact_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
        """The gradients and their magnitudes (reference/grad.py), or why L is undefined
        (an exact denominator of a normalised spec is 0)."""
        if spec.normalize and (zero := arb_denominator_signs(x, spec, similarity) == 0).any():
            at = tuple(int(t) for t in np.argwhere(zero)[0])
            return f"the exact denominator of row (b, h, i) = {at} is 0"
        hooks = similarity.gradients
        return (*exact_gradients_and_magnitudes(x, spec, g, hooks), roundings(x, spec, hooks))

    return dict(
        exact=exact,
        certified=certified,
        exact_state=lambda x, spec: exact_state(x, spec, similarity),
        exact_gradients=exact_gradients,
        exact_decimal=lambda x, spec, digits: arb_decimal(x, spec, digits, similarity),
        similarity=similarity,
    )


def _certified_gradients(gradients, similarity: Similarity):
    """Family.certified_gradients from a folder's certified_gradients(x, spec, g), n by its
    similarity's hooks (Similarity.gradients)."""
    hooks = similarity.gradients
    return lambda x, spec, g: (*gradients(x, spec, g), roundings(x, spec, hooks))


def _long_arguments(spec: Spec, k: torch.Tensor, rates: torch.Tensor, seed: int, dtype):
    """The keys as given and the decay of `rates` (cases.rated_decay); a constant decay's
    first memory kept below 1 in `dtype` too (float16 and bfloat16 round exp(-2^-12) to 1:
    it stays at the dtype's largest value below 1, 1 - 2^-11 or 1 - 2^-8)."""
    decay = rated_decay(spec.decay, rates, tuple(k.shape), seed)
    if spec.decay == "constant":
        below_one = 1 - torch.finfo(dtype).eps / 2
        decay[::2] = torch.minimum(decay[::2].to(dtype).double(), torch.tensor(below_one))
    return k, decay


def _family(
    name: str,
    source: str,
    claims,
    arguments: tuple[str, ...],
    similarity,
    gradients,
    forms,
    golden,
    weights,
    quadratic: bool = False,
    notes: tuple[ArgumentNotes, ...] = (),
) -> Family:
    """A family of this module: the same horizontal modules, its own specs and arguments;
    its folder's similarities (similarity), certified_gradients (gradients), forms (an object
    with forms_of, attention, attention_with_state and attention_varlen), golden forms
    (golden_forms, long_form, golden_attention) and weights."""
    return Family(
        name=name,
        folder=None,
        source=source,
        claims=claims,
        check=lambda spec: None,
        arguments=arguments,
        pack=lambda spec, arguments: decay_values(spec, arguments.get("gamma"), arguments.get("g")),
        argument_names=_argument_names,
        keywords=_keywords,
        validate=validate,
        case_arguments=_case_arguments,
        default_arguments=lambda spec, q: constant_decay(spec.decay, q),
        forms=forms.forms_of,
        attention=forms.attention,
        attention_with_state=forms.attention_with_state,
        attention_varlen=forms.attention_varlen,
        golden_forms=golden.golden_forms,
        long_form=golden.long_form,
        golden=golden.golden_attention,
        weights=weights,
        sum_length=lambda nk, d, m: m + nk + 1,  # m features, Nk keys, eps
        certified_gradients=_certified_gradients(gradients, similarity),
        long_arguments=_long_arguments,
        sums_memory=True,
        kinds=(),
        stepwise=False,
        forgets=lambda spec: spec.decay is not None,
        quadratic=quadratic,
        notes=notes,
        **_references(similarity),
    )


SOFTMAX = _family(
    "softmax",
    FEATURE_MAPS["softmax"].source,
    lambda spec: not spec.info.kernelised,
    (),
    softmax_reference.SOFTMAX,
    softmax_gradients.certified_gradients,
    softmax_forms,
    softmax_golden,
    softmax_weights,
    quadratic=True,
)
CHANNEL_GATED = _family(
    "channel gates",
    DECAY_SOURCES["channel-gates"],
    lambda spec: spec.decay == "channel-gates",
    ("g",),
    channel_gates_reference.CHANNEL_GATES,
    kernelised_gradients.certified_gradients,
    channel_gates_forms.FORMS,  # forms_of: kernelised attention's
    channel_gates_golden,
    channel_gates_weights,
    notes=(DECAY_NOTES,),
)
DECAYED = _family(
    "scalar decay and gates",
    f"{DECAY_SOURCES['constant']}; {DECAY_SOURCES['gates']}",
    lambda spec: spec.decay in ("constant", "gates"),
    ("gamma", "g"),
    decayed_reference.DECAYED,
    kernelised_gradients.certified_gradients,
    decayed_forms.FORMS,  # forms_of: kernelised attention's
    decayed_golden,
    decayed_weights,
    notes=(DECAY_NOTES,),
)
KERNELISED = _family(
    "kernelised",
    "Katharopoulos et al. 2020, eq. 2-6: sim(q, k) = phi(q) . phi(k)",
    lambda spec: True,
    (),
    kernelised_reference.KERNELISED,
    kernelised_gradients.certified_gradients,
    kernelised_forms,
    kernelised_golden,
    kernelised_weights,
)
