"""Implementations under test: the built-in forms (implementations/forms.py) and a
callable named on the command line."""

from __future__ import annotations

import functools

from ..implementations import CausalStream, attention
from ..implementations.forms import DEFAULT_CHUNK
from ..specs import Spec
from ..target import load_target
from .core import Implementation


def forms_of(spec: Spec) -> tuple[str, ...]:
    """The forms that evaluate `spec`."""
    if not spec.info.kernelised:
        return ("quadratic",)
    return ("quadratic", "recurrent", "chunked") if spec.causal else ("quadratic", "linear")


def builtin(spec: Spec, form: str, chunk_size: int = DEFAULT_CHUNK) -> Implementation:
    """lv.attention in `form` as an Implementation (with its stream for the causal forms)."""
    fn = functools.partial(
        attention,
        feature_map=spec.feature_map,
        causal=spec.causal,
        form=form,
        eps=spec.eps,
        chunk_size=chunk_size,
    )
    stream = None
    if form in ("recurrent", "chunked"):

        def stream(max_len, projection):
            return CausalStream(
                spec.feature_map, projection, spec.eps, chunk_size, max_len=max_len, form=form
            )

    chunk = f" chunk_size={chunk_size}" if form == "chunked" else ""
    causal = " --causal" if spec.causal else ""
    eps = f" --eps {spec.eps!r}" if spec.eps else ""
    return Implementation(
        fn=fn,
        spec=spec,
        name=f"lv.attention {spec} form={form}{chunk}",
        command=f"--form {form} --chunk-size {chunk_size} --feature-map {spec.feature_map}"
        f"{causal}{eps}",
        stream=stream,
    )


def external(target: str, spec: Spec, layout: str = "bhnd") -> Implementation:
    """The callable `target` (module:fn or path/file.py:fn) claiming `spec`, as an
    Implementation; SpecError when it cannot be loaded."""
    command = f"--impl {target} --feature-map {spec.feature_map}"
    command += " --causal" * spec.causal + (f" --eps {spec.eps!r}" if spec.eps else "")
    command += f" --layout {layout}" if layout != "bhnd" else ""
    return Implementation(load_target(target), spec, target, command, layout)
