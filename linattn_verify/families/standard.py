"""The families whose modules still sit in the horizontal packages, behind the same
protocol: kernelised attention (scale, eps, normalisation), the scalar decays (a constant
gamma per head, or log-gates per token), channel gates, and softmax. Their references are
reference/'s engines, their forms implementations/forms.py's, their golden form
implementations/golden.py's and their bound accuracy/bound.py's, each until its folder lands
(docs/architecture.md, "Families")."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..cases import Case, constant_decay
from ..implementations import forms, golden
from ..inputs import AttentionInputs, decay_values, validate
from ..reference import exact_attention
from ..reference.arb import arb_decimal, arb_denominator_signs
from ..reference.certified import Certified
from ..reference.certified_engine import certified_attention
from ..reference.certified_grad import certified_gradients
from ..reference.grad import exact_gradients_and_magnitudes, roundings
from ..reference.state import exact_state
from ..specs import DECAY_ARGUMENTS, DECAY_SOURCES, FEATURE_MAPS, Spec
from .channel_gates import bound as channel_gates_bound
from .decayed import bound as decayed_bound
from .kernelised import bound as kernelised_bound
from .kernelised.gradient_bound import state_gradient_bound
from .protocol import Family, SumsBound
from .softmax import bound as softmax_bound


def _spec_options(spec: Spec) -> dict[str, Any]:
    """The keywords of implementations/forms.py that say what `spec` is."""
    fields = ("feature_map", "eps", "normalize", "scale", "decay")
    return {name: getattr(spec, name) for name in fields}


def _attention(q, k, v, spec: Spec, form, projection, chunk_size, arguments) -> torch.Tensor:
    options = _spec_options(spec) | arguments
    return forms.attention(
        q,
        k,
        v,
        causal=spec.causal,
        form=form,
        projection=projection,
        chunk_size=chunk_size,
        **options,
    )


def _attention_with_state(
    q, k, v, spec: Spec, form, projection, chunk_size, initial_state, arguments
):
    options = _spec_options(spec) | arguments
    return forms.attention_with_state(
        q,
        k,
        v,
        projection=projection,
        form=form,
        chunk_size=chunk_size,
        initial_state=initial_state,
        **options,
    )


def _attention_varlen(q, k, v, spec: Spec, cu_seqlens, form, projection, chunk_size, arguments):
    options = _spec_options(spec) | arguments
    return forms.attention_varlen(
        q,
        k,
        v,
        cu_seqlens,
        causal=spec.causal,
        form=form,
        projection=projection,
        chunk_size=chunk_size,
        **options,
    )


def _certified(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
    return certified_attention(x, spec, settle=settle)


def _argument_names(spec: Spec) -> tuple[str, ...]:
    return () if spec.decay is None else (DECAY_ARGUMENTS[spec.decay],)


def _keywords(spec: Spec, packed: Any, layout: str) -> dict[str, Any]:
    """gamma= or g= (specs.DECAY_ARGUMENTS); log-gates in the kernel's layout."""
    if spec.gated and layout == "bnhd":
        packed = packed.transpose(1, 2).contiguous()
    return {name: packed for name in _argument_names(spec)}


def _case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    return (*case.tensors(), case.decay(spec.decay))


def _exact_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    """The gradients and their magnitudes (reference/grad.py), or why L is undefined (an
    exact denominator of a normalised spec is 0)."""
    if spec.normalize and (zero := arb_denominator_signs(x, spec) == 0).any():
        at = tuple(int(t) for t in np.argwhere(zero)[0])
        return f"the exact denominator of row (b, h, i) = {at} is 0"
    return (*exact_gradients_and_magnitudes(x, spec, g), roundings(x, spec))


def _certified_gradients(x: AttentionInputs, spec: Spec, g: np.ndarray):
    return (*certified_gradients(x, spec, g), roundings(x, spec))


def _family(name: str, source: str, claims, arguments: tuple[str, ...], **bound) -> Family:
    """A family of this module: the same horizontal modules, its own specs and arguments, and
    its own terms of the shared bound (`bound`: sums_bound, state_bound and
    state_gradient_bound, from its folder's bound.py)."""
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
        attention=_attention,
        attention_with_state=_attention_with_state,
        attention_varlen=_attention_varlen,
        exact=exact_attention,
        certified=_certified,
        exact_state=exact_state,
        golden_forms=golden.golden_forms,
        long_form=golden.long_form,
        golden=golden.golden_attention,
        sum_length=lambda nk, d, m: m + nk + 1,  # m features, Nk keys, eps
        exact_gradients=_exact_gradients,
        certified_gradients=_certified_gradients,
        long_arguments=lambda spec, k, decay, seed: (k, decay),
        sums_memory=True,
        kinds=(),
        exact_decimal=arb_decimal,
        stepwise=False,
        **bound,
    )


def _decayed_sums(balls) -> SumsBound:
    """The decays' terms of the shared bound: their balls, the rest the scalar decays'."""
    return SumsBound(
        balls,
        decayed_bound.fast_sums,
        decayed_bound.denominator_condition,
        kernelised_bound.feature_count,
    )


SOFTMAX = _family(
    "softmax",
    FEATURE_MAPS["softmax"].source,
    lambda spec: not spec.info.kernelised,
    (),
    sums_bound=SumsBound(softmax_bound.ball_sums),
)
CHANNEL_GATED = _family(
    "channel gates",
    DECAY_SOURCES["channel-gates"],
    lambda spec: spec.decay == "channel-gates",
    ("g",),
    sums_bound=_decayed_sums(channel_gates_bound.ball_sums),
    state_bound=decayed_bound.state_bound,
    state_gradient_bound=decayed_bound.state_gradient_bound,
)
DECAYED = _family(
    "scalar decay and gates",
    f"{DECAY_SOURCES['constant']}; {DECAY_SOURCES['gates']}",
    lambda spec: spec.decay in ("constant", "gates"),
    ("gamma", "g"),
    sums_bound=_decayed_sums(decayed_bound.ball_sums),
    state_bound=decayed_bound.state_bound,
    state_gradient_bound=decayed_bound.state_gradient_bound,
)
KERNELISED = _family(
    "kernelised",
    "Katharopoulos et al. 2020, eq. 2-6: sim(q, k) = phi(q) . phi(k)",
    lambda spec: True,
    (),
    sums_bound=SumsBound(
        kernelised_bound.ball_sums,
        kernelised_bound.fast_sums,
        kernelised_bound.denominator_condition,
        kernelised_bound.feature_count,
    ),
    state_bound=kernelised_bound.state_bound,
    state_gradient_bound=state_gradient_bound,
)
