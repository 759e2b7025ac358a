"""The built-in forms of lv.attention as implementations under test: which form evaluates
a spec, and the calls (fn, and the stream of a causal form) that evaluate it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..families import arguments, family_of, fast_form, forms_of
from ..families.kernelised.forms import CausalStream
from ..implementations.forms import DEFAULT_CHUNK
from ..specs import Spec, SpecError
from .claim import state_layout


def form_of(spec: Spec, form: str | None, chunk_size: int | None) -> tuple[str, int | None]:
    """(form, chunk size) of the built-in form that evaluates `spec`: `form`, or the spec's
    fast form; the chunk size for the chunked form alone, DEFAULT_CHUNK unless given."""
    form = form or fast_form(spec)
    if form not in forms_of(spec):
        raise SpecError(
            f"form {form!r} does not evaluate {spec}; its forms: {', '.join(forms_of(spec))}"
        )
    if chunk_size is not None and form != "chunked":
        raise SpecError(f"--chunk-size is for the chunked form, not {form!r}")
    return form, (chunk_size or DEFAULT_CHUNK) if form == "chunked" else None


def state_of(spec: Spec, form: str, name: str) -> str:
    """The layout of the state the built-in form `form` (called `name`) carries when asked
    for one: (S, z) of its causal stream, S alone when unnormalised."""
    if form not in ("recurrent", "chunked"):
        raise SpecError(f"{name} carries no state: the recurrent and chunked forms do")
    return state_layout(spec)


def calls(
    spec: Spec, form: str, chunk_size: int | None, varlen: bool, stateful: bool
) -> tuple[Callable[..., Any], Callable[..., Any] | None]:
    """(fn, stream) of the built-in form `form` evaluating `spec` (its family's:
    families.Family): fn takes packed batches with varlen and carries its state when
    stateful; the stream, for the causal forms of a plain spec."""
    family, chunk_size = family_of(spec), chunk_size or DEFAULT_CHUNK

    def fn(q, k, v, projection=None, initial_state=None, cu_seqlens=None, **given):
        given = arguments(spec, **given)
        if varlen and cu_seqlens is not None:
            return family.attention_varlen(
                q, k, v, spec, cu_seqlens, form, projection, chunk_size, given
            )
        if stateful and not varlen:
            return family.attention_with_state(
                q, k, v, spec, form, projection, chunk_size, initial_state, given
            )
        return family.attention(q, k, v, spec, form, projection, chunk_size, given)

    if form not in ("recurrent", "chunked") or not spec.plain:
        return fn, None

    def stream(max_len, projection):
        return CausalStream(
            spec.feature_map, projection, spec.eps, chunk_size, max_len=max_len, form=form
        )

    return fn, stream
