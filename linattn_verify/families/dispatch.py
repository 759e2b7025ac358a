"""Every family's spec through one door: the exact reference, the built-in forms, the golden
form and the exact state of any spec, each asked of the spec's family (registry.py). The
public `reference` and `attention` take a spec's fields as keywords, as they always have."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..cases import Case
from ..implementations.forms import DEFAULT_CHUNK
from ..inputs import AttentionInputs
from ..reference import ENGINES, grad
from ..reference.certified import Certified
from ..reference.common import MAX_PREC
from ..reference.similarity import Gradients
from ..specs import Spec, SpecError
from .registry import FAMILIES, family_of


def exact(x: AttentionInputs, spec: Spec, engine: str = "auto") -> np.ndarray:
    """Exact attention for validated inputs of any spec, by `engine` (reference.ENGINES)."""
    if engine not in ENGINES:
        raise SpecError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return family_of(spec).exact(x, spec, engine)


def validate(
    q: Any, k: Any, v: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> AttentionInputs:
    """Exact float64 copies of inputs checked against any spec (inputs.validate's; decay
    the family's packed argument: Family.pack)."""
    return family_of(spec).validate(q, k, v, spec, projection, decay)


def case_arguments(case: Case, spec: Spec) -> tuple[torch.Tensor | None, ...]:
    """(q, k, v, W, decay) of `spec` on a case: the tensors and the family's packed argument
    (a decay's gamma or log-gates, the delta rule's beta and gates)."""
    return family_of(spec).case_arguments(case, spec)


def default_arguments(spec: Spec, q: torch.Tensor) -> torch.Tensor | None:
    """The packed argument for inputs q (B, H, N, d) that come from no case (the scaling
    runs), constant over tokens, in q's dtype and device."""
    return family_of(spec).default_arguments(spec, q)


def certified(x: AttentionInputs, spec: Spec, settle: np.ndarray | None = None) -> Certified:
    """The certified engine of `spec`'s family, settling the rows `settle` marks where it
    takes them (every row by default)."""
    return family_of(spec).certified(x, spec, settle)


def exact_state(x: AttentionInputs, spec: Spec) -> tuple[np.ndarray, np.ndarray | None]:
    """The exact state after the last key of x, (S, z; None where the family has no z)."""
    return family_of(spec).exact_state(x, spec)


def _gradients(spec: Spec) -> Gradients | None:
    """The hooks of `spec`'s family into reference/grad.py (None: a family with its own)."""
    similarity = family_of(spec).similarity
    return None if similarity is None else similarity.gradients


def roundings(x: AttentionInputs, spec: Spec) -> int:
    """reference.grad.roundings for any spec that sums its similarities."""
    return grad.roundings(x, spec, _gradients(spec))


def exact_gradients(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, max_prec: int = MAX_PREC
) -> dict[str, np.ndarray]:
    """reference.grad.exact_gradients for any spec (SpecError where the family has its own)."""
    return grad.exact_gradients(x, spec, g_out, _gradients(spec), max_prec)


def gradient_magnitudes(x: AttentionInputs, spec: Spec, g_out: np.ndarray) -> dict[str, np.ndarray]:
    """reference.grad.gradient_magnitudes for any spec that sums its similarities."""
    return grad.gradient_magnitudes(x, spec, g_out, _gradients(spec))


def exact_gradients_and_magnitudes(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, max_prec: int = MAX_PREC
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """reference.grad.exact_gradients_and_magnitudes for any spec that sums its
    similarities."""
    return grad.exact_gradients_and_magnitudes(x, spec, g_out, _gradients(spec), max_prec)


def reference_gradients(
    q: Any, k: Any, v: Any, g_out: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> dict[str, np.ndarray]:
    """Like reference() for the gradients: validates q, k, v (and W, g_out, and the decay:
    gamma (H,) or the log-gates g (B, H, N), or (B, H, N, d) for channel gates, as
    validate takes it) for `spec`, then exact_gradients. Torch tensors or numpy arrays of
    any judged dtype, taken exactly."""
    return exact_gradients(validate(q, k, v, spec, projection, decay), spec, g_out)


def spec_words(spec: Spec) -> dict[str, str]:
    """The words that name `spec` beside its map, causality and scale, by field, where it
    is not the plain spec: eps ("eps1e-06"), normalize ("unnormalised"), its decay, its
    family's label (Family.label: "delta") and qk_l2norm ("l2norm"); vector names
    (known_answers.spec_label) and test ids (Implementation.test_id) order them."""
    words = {
        "eps": f"eps{spec.eps:g}" * (spec.eps != 0),
        "normalize": "unnormalised" * (not spec.normalize),
        "decay": spec.decay or "",
        "label": family_of(spec).label or "",
        "qk_l2norm": "l2norm" * spec.qk_l2norm,
    }
    return {field: word for field, word in words.items() if word}


def forms_of(spec: Spec) -> tuple[str, ...]:
    """The built-in forms that evaluate `spec`, the fast one last."""
    return family_of(spec).forms(spec)


def fast_form(spec: Spec) -> str:
    """The form `attention` takes at large N (the last of forms_of)."""
    return forms_of(spec)[-1]


def golden_forms(spec: Spec) -> tuple[str, ...]:
    """The golden forms whose larger error sets `spec`'s accuracy budgets."""
    return family_of(spec).golden_forms(spec)


def long_form(spec: Spec) -> str:
    """The golden form of the long-context check, O(N) where the spec allows."""
    return family_of(spec).long_form(spec)


def golden_attention(q, k, v, spec: Spec, projection=None, form=None, decay=None) -> torch.Tensor:
    """The golden form `form` (None: the first of golden_forms) of `spec`'s family; decay as
    inputs.validate takes it (Family.pack)."""
    if not isinstance(spec, Spec):
        raise SpecError(f"spec must be a linattn_verify.Spec, got {type(spec).__name__}")
    return family_of(spec).golden(q, k, v, spec, projection, form or golden_forms(spec)[0], decay)


def arguments(spec: Spec, **given: Any) -> dict[str, Any]:
    """The arguments given that `spec`'s family takes (Family.arguments: gamma, g, beta, ...);
    SpecError for another family's argument given (not None), naming the families that take
    it, and TypeError for a keyword no family takes (a misspelt one)."""
    family = family_of(spec)
    for name, value in given.items():
        owners = ", ".join(f.name for f in FAMILIES if name in f.arguments)
        if not owners:
            raise TypeError(f"unexpected keyword argument {name!r}")
        if value is not None and name not in family.arguments:
            takes = " and ".join(family.arguments) or "no argument but q, k, v (and W)"
            raise SpecError(f"{spec} takes {takes}, not {name} (an argument of: {owners})")
    return {name: value for name, value in given.items() if name in family.arguments}


# the fields of a Spec that the keyword APIs below take, in _spec_of's order
_FIELDS = (
    "feature_map",
    "causal",
    "eps",
    "normalize",
    "scale",
    "decay",
    "delta_rule",
    "qk_l2norm",
    "family",
)


def _spec_of(spec: Spec | None, fields: tuple[Any, ...], **forced: Any) -> Spec:
    """`spec` itself, or the Spec of the fields given as keywords (_FIELDS' values, `forced`
    over them); TypeError for a spec that is no Spec, or one given beside fields that are
    not their defaults."""
    if spec is None:
        return Spec(**dict(zip(_FIELDS, fields, strict=True)) | forced)
    if not isinstance(spec, Spec):
        raise TypeError(f"spec must be a linattn_verify.Spec, not {type(spec).__name__}")
    defaults = Spec("elu")
    given = [
        name
        for name, value in zip(_FIELDS, fields, strict=True)
        if value != getattr(defaults, name)
    ]
    if given:
        raise TypeError(f"give the spec or its fields, not both: {', '.join(given)} beside spec")
    return spec


def reference(
    q: Any,
    k: Any,
    v: Any,
    feature_map: str = "elu",
    causal: bool = False,
    projection: Any = None,
    eps: float = 0.0,
    engine: str = "auto",
    *,
    normalize: bool = True,
    scale: float | str = 1.0,
    decay: str | None = None,
    gamma: Any = None,
    g: Any = None,
    delta_rule: bool = False,
    qk_l2norm: bool = False,
    beta: Any = None,
    family: str | None = None,
    spec: Spec | None = None,
    **more: Any,
) -> np.ndarray:
    """Exact attention output (B, H, Nq, dv) as float64, within one ulp of the true value.

    q, k: (B, H, N, d); v: (B, H, N, dv); torch tensors or numpy arrays of float16, bfloat16,
    float32 or float64, taken exactly as they are. Rows whose denominator is exactly zero
    (relu with eps = 0) are NaN: the definition is 0/0 there. normalize, scale and decay
    are the spec's (specs.Spec); a decay's values are gamma (H,) for "constant" and the
    log-gates g, (B, H, N) for "gates" and (B, H, N, d) for "channel-gates". delta_rule
    and qk_l2norm are the spec's too (families/delta/fields.py: feature_map "identity", causal,
    normalize=False), with beta (B, H, N); family: a family chosen by name (Spec.family),
    `more` its arguments (Family.arguments: the IPLR rule's a and b). Or `spec`, a Spec,
    in place of its fields.
    """
    fields = (feature_map, causal, eps, normalize, scale, decay, delta_rule, qk_l2norm, family)
    spec = _spec_of(spec, fields)
    chosen = family_of(spec)
    values = chosen.pack(spec, arguments(spec, gamma=gamma, g=g, beta=beta, **more))
    return exact(validate(q, k, v, spec, projection, values), spec, engine)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "elu",
    causal: bool = False,
    form: str | None = None,
    projection: torch.Tensor | None = None,
    eps: float = 0.0,
    chunk_size: int = DEFAULT_CHUNK,
    *,
    normalize: bool = True,
    scale: float | str = 1.0,
    decay: str | None = None,
    gamma: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    delta_rule: bool = False,
    qk_l2norm: bool = False,
    beta: torch.Tensor | None = None,
    family: str | None = None,
    spec: Spec | None = None,
    **more: Any,
) -> torch.Tensor:
    """Attention of any spec in a built-in `form` (None: the family's choice; forms_of).

    q, k: (B, H, N, d), v: (B, H, N, dv); any floating dtype, any strides, CPU or CUDA;
    projection W (m, d) for the Performer maps. Returns (B, H, Nq, dv) in q's dtype. The
    spec's fields as reference's, or `spec`; a decay's gamma or g, the delta rule's beta and g.
    """
    fields = (feature_map, causal, eps, normalize, scale, decay, delta_rule, qk_l2norm, family)
    spec = _spec_of(spec, fields)
    chosen = family_of(spec)
    given = arguments(spec, gamma=gamma, g=g, beta=beta, **more)
    return chosen.attention(q, k, v, spec, form, projection, chunk_size, given)


def attention_with_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "elu",
    projection: torch.Tensor | None = None,
    eps: float = 0.0,
    form: str = "chunked",
    chunk_size: int = DEFAULT_CHUNK,
    initial_state: Any = None,
    *,
    normalize: bool = True,
    scale: float | str = 1.0,
    decay: str | None = None,
    gamma: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    delta_rule: bool = False,
    qk_l2norm: bool = False,
    beta: torch.Tensor | None = None,
    family: str | None = None,
    spec: Spec | None = None,
    **more: Any,
) -> tuple[torch.Tensor, Any]:
    """Causal attention of a sequence that continues the one whose state is initial_state
    (None: nothing before), in `form`: (output, the state after the last token), the state's
    layout the family's (families/kernelised/forms.py's (S, z), S alone unnormalised; the delta
    rule's S (B, H, d, dv)). The spec's fields as reference's (causal), or `spec`."""
    fields = (feature_map, False, eps, normalize, scale, decay, delta_rule, qk_l2norm, family)
    spec = _spec_of(spec, fields, causal=True)
    if not spec.causal:
        raise SpecError(f"a state is carried by a causal spec, not {spec}")
    chosen = family_of(spec)
    given = arguments(spec, gamma=gamma, g=g, beta=beta, **more)
    return chosen.attention_with_state(
        q, k, v, spec, form, projection, chunk_size, initial_state, given
    )


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    **options: Any,
) -> torch.Tensor:
    """attention(q, k, v, **options) of a packed batch: q, k, v (1, H, T, d) holding the
    sequences of cu_seqlens one after another (inputs.check_cu_seqlens), each attending to
    itself only (empty ones allowed); without cu_seqlens, attention() itself."""
    if cu_seqlens is None:
        return attention(q, k, v, **options)
    defaults = Spec("elu")
    given_spec = options.pop("spec", None)
    fields = tuple(options.pop(name, getattr(defaults, name)) for name in _FIELDS)
    spec = _spec_of(given_spec, fields)
    family = family_of(spec)
    form, projection = options.pop("form", None), options.pop("projection", None)
    chunk_size = options.pop("chunk_size", DEFAULT_CHUNK)
    given = arguments(spec, **options)  # what is left: the family's arguments
    return family.attention_varlen(q, k, v, spec, cu_seqlens, form, projection, chunk_size, given)
