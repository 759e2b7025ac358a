"""What a user names, made an Implementation: a built-in form, an adapter's name, a
module:fn or path.py:fn target, or a callable, with the options it claims (claim.CLAIM).
Every entry point resolves here: the commands, vet, the report, the pytest plugin,
assert_linear_attention, the zoo."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch

from ..adapters import ADAPTERS
from ..grammar import checked
from ..head_dims import HeadDims
from ..specs import Spec, SpecError
from ..target import did_you_mean, split_target
from .builtin import form_of, state_of
from .claim import (
    CLAIM,
    DECLARED,
    SOURCE,
    SPEC_FIELDS,
    STATE_LAYOUTS,
    default_cost,
    state_layout,
)
from .guard_bands import guarded
from .implementation import Implementation, Source, StreamFactory
from .names import label

_CLAIM = {o.name: o for o in CLAIM}
# what an adapter claims besides its spec: its library's, never the command line's
OWN_CLAIM = ("layout", "max_head_dim", "even_dims_backward")


def resolve(
    target: str | Callable[..., Any] | None = None,
    *,
    form: str | None = None,
    chunk_size: int | None = None,
    spec: Spec | None = None,
    stream: StreamFactory | None = None,
    load: bool = True,
    **claim: Any,
) -> Implementation:
    """The implementation a user names: target None (a built-in form: `form`, or the spec's
    fast form), an adapter's name, a module:fn / path.py:fn target, or a callable; `claim`:
    the options of claim.CLAIM by keyword (feature_map, causal, eps, normalize, scale,
    decay, layout, cost, state, varlen), each its default when not given, or `spec` (a
    Spec) for the spec's. stream: a callable's state API (the split-resume check). With
    load=False nothing is imported (Implementation.load() does it later). SpecError names
    what does not fit."""
    if unknown := sorted(set(claim) - set(_CLAIM)):
        raise SpecError(f"no option {unknown[0]!r}; the options: {', '.join(_CLAIM)}")
    values = checked(CLAIM, claim)
    checked(SOURCE, {"form": form, "chunk_size": chunk_size})
    if spec is not None:
        if any(values[f] != _CLAIM[f].default for f in SPEC_FIELDS):
            raise SpecError("give the spec either as spec= or as feature_map, causal, eps, ...")
        values |= {f: getattr(spec, f) for f in SPEC_FIELDS}
    if values["tf32"] and values["triton"] is None and not _triton_adapter(target):
        raise SpecError(
            "--tf32 rounds tl.dot inputs in Triton's interpreter: give --triton interpret"
        )
    if values["varlen"] and values["state"] is not None:
        raise SpecError("--varlen with --state (a state per packed sequence) is not supported")
    if values["step"] is not None and (values["varlen"] or values["state"] is not None):
        raise SpecError("--step is a step kernel's whole contract: drop --state and --varlen")
    if target is not None and (form is not None or chunk_size is not None):
        raise SpecError("--form and --chunk-size choose a built-in form, not a target")
    if stream is not None and not callable(target):
        raise SpecError("a stream is given with a callable; the built-in forms have theirs")
    if isinstance(target, str) and ":" not in target and target not in ADAPTERS:
        raise SpecError(
            f"no adapter {target!r}{did_you_mean(target, ADAPTERS)} (python -m "
            "linattn_verify adapters lists them); a target must look like module:function "
            "or path/file.py:function"
        )
    if isinstance(target, str) and target in ADAPTERS:
        impl = _adapter(target, values)
    elif values["feature_map"] is None:
        what = "the built-in form" if target is None else repr(label(target))
        raise SpecError(f"{what} needs --feature-map NAME (the spec it claims)")
    else:
        spec, state = Spec(**{f: values[f] for f in SPEC_FIELDS}), values["state"]
        if target is not None and state == DECLARED:
            layouts = " or ".join(STATE_LAYOUTS)
            raise SpecError(f"--state takes the layout of {label(target)}'s state: {layouts}")
        for name in ("state", "step"):
            if values[name] is not None and spec.no_state:
                raise SpecError(f"{_CLAIM[name].flag}: {spec.no_state}")
        impl = (
            _form(spec, form, chunk_size, values)
            if target is None
            else _target(target, spec, values, stream)
        )
    return impl.load() if load else impl


def from_options(
    target: str | None, values: Mapping[str, Any], load: bool = True
) -> Implementation:
    """resolve() of `target` with the options' values by keyword as a command line gives
    them (text parsed; SpecError names a bad one by its flag)."""
    given = checked((*SOURCE, *CLAIM), values, from_text=True)
    form, chunk_size = given.pop("form"), given.pop("chunk_size")
    return resolve(target, form=form, chunk_size=chunk_size, load=load, **given)


def _adapter(name: str, values: Mapping[str, Any]) -> Implementation:
    """A third-party library behind an adapter: its spec and layout are its claim."""
    adapter = ADAPTERS[name]
    claimed = (n for n in (*SPEC_FIELDS, *OWN_CLAIM) if n not in ("dot_precision", "stored"))
    fixed = [n for n in claimed if values[n] != _CLAIM[n].default]
    if fixed:
        flag = _CLAIM[fixed[0]].flag
        raise SpecError(
            f"{name} is an adapter: its spec, layout and head dimensions are its claim (drop "
            f"{flag})"
        )
    if values["step"] is not None:
        raise SpecError(f"{name} takes no --step: no adapter maps a step kernel yet")
    state = values["state"]
    if state is not None and adapter.state is None:
        raise SpecError(f"{name} takes no state (its library's function has none)")
    if state not in (None, DECLARED, adapter.state):
        raise SpecError(f"{name} carries its own state: give --state without a layout")
    if values["varlen"] and not adapter.varlen:
        raise SpecError(f"{name} takes no packed batch (no cu_seqlens)")
    if values["triton"] is not None and not adapter.triton:
        raise SpecError(f"{name} is not Triton code: drop --triton")
    triton = values["triton"] or automatic_triton(adapter)
    if values["tf32"] and triton != "interpret":
        raise SpecError(f"--tf32 is for Triton's interpreter; {name} runs natively here")
    how = {n: values[n] for n in ("dot_precision", "stored")}  # how it runs
    spec = replace(adapter.spec, **how)
    return Implementation(
        None, spec, Source("adapter", name), adapter.layout,
        values["cost"] or adapter.cost, state=adapter.state if state is not None else None,
        varlen=values["varlen"], triton=triton, tf32=values["tf32"], dtypes=adapter.dtypes,
        head_dims=adapter.head_dims,
    )  # fmt: skip


def head_dims(values: Mapping[str, Any]) -> HeadDims:
    """The head dimensions a target or a built-in form is declared to take."""
    return HeadDims(values["max_head_dim"], values["even_dims_backward"])


def automatic_triton(adapter) -> str | None:
    """How a Triton adapter runs unless told: natively where torch sees a CUDA device, else
    in Triton's interpreter ("interpret")."""
    return "interpret" if adapter.triton and not torch.cuda.is_available() else None


def _triton_adapter(target: Any) -> bool:
    return isinstance(target, str) and target in ADAPTERS and ADAPTERS[target].triton


def _form(spec: Spec, form, chunk_size, values: Mapping[str, Any]) -> Implementation:
    """A built-in form of lv.attention claiming `spec`."""
    if values["layout"] != _CLAIM["layout"].default:
        raise SpecError("--layout describes a target; the built-in forms take (B, H, N, d)")
    if values["triton"] is not None:
        raise SpecError("--triton describes a target; the built-in forms are not Triton code")
    if values["step"] is not None:
        raise SpecError("--step describes a target; the built-in forms are no step kernels")
    form, chunk_size = form_of(spec, form, chunk_size)
    cost = values["cost"] or default_cost(spec, form)
    source = Source("form", form, chunk_size)
    impl = Implementation(None, spec, source, "bhnd", cost, varlen=values["varlen"],
                          head_dims=head_dims(values))  # fmt: skip
    if values["state"] is not None:
        impl = replace(impl, state=state_of(spec, form, impl.name))
    return impl


def _target(target, spec: Spec, values: Mapping[str, Any], stream) -> Implementation:
    """A callable in process, or one a module:fn or path.py:fn target names."""
    for name in ("state", "step"):
        if values[name] not in (None, state_layout(spec)):
            given = f"{_CLAIM[name].flag} {values[name]}"
            raise SpecError(f"{given}: the state of {spec} is {state_layout(spec)}")
    if values["step"] is not None and not spec.sums_similarities:
        raise SpecError("--step: the step checks serve the kernelised specs so far")
    contract = {
        "layout": values["layout"],
        "cost": values["cost"] or default_cost(spec),
        "state": values["state"],
        "varlen": values["varlen"],
        "step": values["step"],
        "triton": values["triton"],
        "tf32": values["tf32"],
        "head_dims": head_dims(values),
    }
    if callable(target):
        fn = guarded(target) if values["triton"] else target
        return Implementation(fn, spec, Source("callable", label(target)), stream=stream,
                              **contract)  # fmt: skip
    if not isinstance(target, str):
        raise SpecError(f"a target is module:fn, path.py:fn or a callable, got {target!r}")
    split_target(target)  # a malformed target is an error now, not in a worker
    return Implementation(None, spec, Source("target", target), **contract)
