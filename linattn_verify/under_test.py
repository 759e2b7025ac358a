"""The implementation under test: one type for everything the suite judges, whatever it is
and wherever it comes from.

An Implementation is what it is (fn behind the contract of docs/contract.md, the spec it claims, its
contract options: the layout, the cost it claims) and where it comes from (its Source):

- a built-in form of lv.attention (kind "form": quadratic, linear, recurrent, chunked with
  its chunk size);
- a callable named by a target (kind "target": module:fn or path/file.py:fn);
- a third-party library behind an adapter (kind "adapter": its spec and layout are its
  claim; adapters.ADAPTERS);
- a callable handed over in process (kind "callable": assert_linear_attention, the zoo).

`resolve(...)` makes one from what a user gives, for every entry point (the commands, vet,
the report, the pytest plugin, testing, the zoo); its name, its test id and the command that
reproduces a check on it are derived here and nowhere else.
"""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .adapters import ADAPTERS
from .cases import Case
from .implementations import CausalStream, attention
from .implementations.forms import (
    DEFAULT_CHUNK,
    FORMS,
    attention_varlen,
    attention_with_state,
    fast_form,
    forms_of,
)
from .specs import DECAY_ARGUMENTS, DECAYS, FEATURE_MAPS, RSQRT_D, Spec, SpecError
from .target import load_target, split_target

KINDS = ("form", "target", "adapter", "callable")
LAYOUTS = ("bhnd", "bnhd")
# the carried state fn takes and returns with --state (docs/contract.md, "Carried state"):
# the pair (S, z), S (B, H, F, dv) and z (B, H, F), F the spec's feature dimension, for a
# normalised spec (a state without z could not continue its normaliser); S alone for an
# unnormalised one
STATE_LAYOUTS = ("Sz", "S")
DECLARED = "declared"  # --state without a layout: an adapter's or a built-in form's own
COSTS = ("linear", "quadratic")
# a stream factory: stream(max_len, projection) -> piece(q, k, v) -> out, carrying state
StreamFactory = Callable[[int, torch.Tensor | None], Callable[..., torch.Tensor]]


class ImplementationFailure(Exception):
    """The implementation raised or returned something that is not an output."""


@dataclass(frozen=True)
class Source:
    """Where an implementation comes from: kind (one of KINDS) and name (the form, the
    target module:fn, the adapter's name, or the callable's qualified name); chunk_size
    for the built-in chunked form."""

    kind: str
    name: str
    chunk_size: int | None = None


def default_cost(spec: Spec, form: str | None = None) -> str:
    """The growth an implementation claims unless it declares one: quadratic for softmax
    (no finite feature map) and for the built-in quadratic form, linear otherwise."""
    return "quadratic" if not spec.info.kernelised or form == "quadratic" else "linear"


@dataclass(frozen=True)
class Implementation:
    """Anything under test, behind the contract: fn(q, k, v[, projection=W]) (docs/contract.md).

    layout: the layout fn takes and returns, "bhnd" (B, H, N, d) or "bnhd" (B, N, H, d);
    calls go through __call__ with (B, H, N, d) tensors. cost: the growth it claims.
    stream: for causal specs with a state API, stream(max_len, W) returns a callable that
    takes the sequence in pieces. state: the layout of the carried state (STATE_LAYOUTS)
    when fn takes one: fn(q, k, v[, projection], initial_state=...) returns (out, final
    state), initial_state None for a sequence from its start. varlen: fn also takes a packed
    batch, fn(q, k, v[, projection], cu_seqlens=offsets) with B = 1 (docs/contract.md,
    "Packed batches"), cu_seqlens None for a plain one. fn is None while the
    implementation is only declared (resolve(..., load=False): picklable, for a worker
    process to load()).
    """

    fn: Callable[..., Any] | None = field(compare=False, repr=False)
    spec: Spec
    source: Source
    layout: str = "bhnd"
    cost: str = "linear"
    stream: StreamFactory | None = field(default=None, compare=False, repr=False)
    state: str | None = None
    varlen: bool = False

    @property
    def name(self) -> str:
        """What messages call it."""
        if self.source.kind != "form":
            return self.source.name
        chunk = f" chunk_size={self.source.chunk_size}" if self.source.name == "chunked" else ""
        return f"lv.attention {self.spec} form={self.source.name}{chunk}"

    @property
    def test_id(self) -> str:
        """Its id in a parametrised test: elu-causal-chunked, an adapter's or target's name."""
        if self.source.kind != "form":
            return self.source.name
        spec, size = self.spec, self.source.chunk_size
        chunk = f"-c{size}" if size not in (None, DEFAULT_CHUNK) else ""
        eps = f"-eps{spec.eps:g}" if spec.eps else ""
        causal = "causal" if spec.causal else "full"
        rest = "-unnormalised" * (not spec.normalize) + f"-{spec.decay}" * bool(spec.decay)
        rest += f"-scale{spec.scale_for(1) if spec.scale != RSQRT_D else 'rsqrtd'}" * (
            spec.scale != 1.0
        )
        return f"{spec.feature_map}-{causal}-{self.source.name}{chunk}{eps}{rest}"

    @property
    def command(self) -> str:
        """The options that name it to a command (`check`, `vet`, ...): what resolve takes."""
        kind, name = self.source.kind, self.source.name
        if kind == "adapter":
            words = ["--impl", name]
            if self.cost != ADAPTERS[name].cost:
                words += ["--cost", self.cost]
            words += ["--state"] * (self.state is not None)
            words += ["--varlen"] * self.varlen
            return shlex.join(words)
        if kind == "form":
            words = ["--form", name]
            if name == "chunked":
                words += ["--chunk-size", str(self.source.chunk_size)]
        else:
            words = ["--impl", name if kind == "target" else _importable_name(self.fn)]
        words += ["--feature-map", self.spec.feature_map]
        words += ["--causal"] * self.spec.causal
        words += ["--eps", repr(self.spec.eps)] * bool(self.spec.eps)
        words += ["--no-normalize"] * (not self.spec.normalize)
        words += ["--scale", str(self.spec.scale)] * (self.spec.scale != 1.0)
        words += ["--decay", str(self.spec.decay)] * (self.spec.decay is not None)
        words += ["--layout", self.layout] * (self.layout != "bhnd")
        default = default_cost(self.spec, name if kind == "form" else None)
        words += ["--cost", self.cost] * (self.cost != default)
        if self.state is not None and kind != "form":
            words += ["--state", self.state]
        elif self.state is not None:
            words += ["--state"]
        words += ["--varlen"] * self.varlen
        return shlex.join(words)

    def reproduce(self, check: str, case: Case) -> str:
        """One line that reruns check `check` on `case`."""
        return (
            f"python -m linattn_verify check {check} {self.command} "
            f"--case {shlex.quote(case.to_json())}"
        )

    def load(self) -> Implementation:
        """The implementation with its fn (imports a target or an adapter's library; raises
        SpecError when it cannot be loaded); itself when already loaded."""
        if self.fn is not None:
            return self
        kind, name = self.source.kind, self.source.name
        if kind == "adapter":
            adapter = ADAPTERS[name]
            return replace(self, fn=(adapter.load_state if self.state else adapter.load)())
        if kind == "target":
            return replace(self, fn=load_target(name))
        if kind == "form":
            return _builtin(self)
        raise SpecError(f"the callable {name} cannot be loaded again: pass it in process")

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, H, N, x) tensor in the implementation's layout (a view)."""
        return t.transpose(1, 2) if self.layout == "bnhd" else t

    def _keywords(self, projection, decay) -> dict[str, Any]:
        """fn's keyword arguments besides q, k, v: the projection of a Performer map, the
        decay of a decayed spec by its keyword (specs.DECAY_ARGUMENTS), log-gates (B, H, N)
        in fn's layout ((B, N, H) for bnhd)."""
        kwargs = {"projection": projection} if self.spec.info.needs_projection else {}
        if self.spec.decay is None:
            if decay is not None:
                raise SpecError(f"{self.name} takes no decay: its spec has none")
            return kwargs
        if decay is None:
            raise SpecError(f"{self.name} needs its decay ({self.spec.decay})")
        if self.spec.decay == "gates" and self.layout == "bnhd":
            decay = decay.transpose(1, 2).contiguous()
        return kwargs | {DECAY_ARGUMENTS[self.spec.decay]: decay}

    def call_raw(self, q, k, v, projection=None, decay=None) -> torch.Tensor:
        """fn on tensors already in its layout (the decay in bhnd's); any exception becomes
        ImplementationFailure."""
        if self.fn is None:
            raise SpecError(f"{self.name} is declared, not loaded: call load() first")
        if self.state is not None:
            return self.call_state(q, k, v, projection, None, True, decay)[0]
        kwargs = self._keywords(projection, decay)
        try:
            out = self.fn(q, k, v, **kwargs)
        except Exception as err:  # the implementation's failure is a finding, not a crash
            raise ImplementationFailure(f"raised {type(err).__name__}: {err}") from None
        if not isinstance(out, torch.Tensor):
            raise ImplementationFailure(f"returned {type(out).__name__}, not a torch tensor")
        return out

    def call_state(
        self, q, k, v, projection=None, initial_state=None, layout_given: bool = False, decay=None
    ) -> tuple[torch.Tensor, Any]:
        """(out, final state) of fn continuing from initial_state (None: from the start), q,
        k, v (B, H, N, d) unless layout_given (already in fn's layout); the state the pair
        (S, z), its shapes checked, and out's (ImplementationFailure otherwise)."""
        if self.state is None:
            raise SpecError(f"{self.name} takes no state: declare its layout with --state")
        if self.fn is None:
            raise SpecError(f"{self.name} is declared, not loaded: call load() first")
        if not layout_given:
            q, k, v = (self.to_layout(t).contiguous() for t in (q, k, v))
        kwargs = self._keywords(projection, decay)
        try:
            result = self.fn(q, k, v, **kwargs, initial_state=initial_state)
        except Exception as err:  # the implementation's failure is a finding, not a crash
            raise ImplementationFailure(f"raised {type(err).__name__}: {err}") from None
        if not isinstance(result, tuple | list) or len(result) != 2:
            got = type(result).__name__
            raise ImplementationFailure(f"returned {got}, not the pair (out, final_state)")
        out, final = result
        if not isinstance(out, torch.Tensor):
            raise ImplementationFailure(f"returned {type(out).__name__}, not a torch tensor")
        q_, v_ = self.to_layout(q), self.to_layout(v)  # (B, H, N, d) views
        want = (*q_.shape[:3], v_.shape[-1])
        if out.dim() != 4 or tuple(self.to_layout(out).shape) != want:
            raise ImplementationFailure(
                f"returned shape {tuple(out.shape)}, expected {want} ({self.layout})"
            )
        m = None if projection is None else projection.shape[0]
        f = self.spec.info.feature_dim(q_.shape[-1], m)
        if problem := _state_problem(final, (*want[:2], f, want[3]), self.state):
            raise ImplementationFailure(f"returned a final state {problem}")
        return out if layout_given else self.to_layout(out), final

    def call_varlen(
        self, q, k, v, projection, cu_seqlens: torch.Tensor, decay=None
    ) -> torch.Tensor:
        """fn's output for the packed batch q, k, v (1, H, T, d) of cu_seqlens, (1, H, T, dv)
        (ImplementationFailure for anything else)."""
        if not self.varlen:
            raise SpecError(f"{self.name} takes no packed batch: declare it with --varlen")
        if self.fn is None:
            raise SpecError(f"{self.name} is declared, not loaded: call load() first")
        args = [self.to_layout(t).contiguous() for t in (q, k, v)]
        kwargs = self._keywords(projection, decay)
        try:
            out = self.fn(*args, **kwargs, cu_seqlens=cu_seqlens)
        except Exception as err:  # the implementation's failure is a finding, not a crash
            raise ImplementationFailure(f"raised {type(err).__name__}: {err}") from None
        want = (*q.shape[:3], v.shape[-1])
        if not isinstance(out, torch.Tensor) or out.dim() != 4:
            raise ImplementationFailure(f"returned {type(out).__name__} for a packed batch")
        if tuple(self.to_layout(out).shape) != want:
            shape = tuple(out.shape)
            raise ImplementationFailure(
                f"returned shape {shape} for a packed batch, expected {want} ({self.layout})"
            )
        return self.to_layout(out)

    def __call__(self, q, k, v, projection=None, decay=None) -> torch.Tensor:
        """The output (B, H, N, dv) for (B, H, N, d) inputs, contiguous in fn's layout; decay:
        a decayed spec's gamma (H,) or log-gates (B, H, N) (Case.decay)."""
        args = (self.to_layout(t).contiguous() for t in (q, k, v))
        out = self.call_raw(*args, projection, decay)
        want = (*q.shape[:3], v.shape[-1])
        if out.dim() != 4 or tuple(self.to_layout(out).shape) != want:
            shape = tuple(out.shape)
            raise ImplementationFailure(f"returned shape {shape}, expected {want} ({self.layout})")
        return self.to_layout(out)


def resolve(
    target: str | Callable[..., Any] | None = None,
    *,
    form: str | None = None,
    chunk_size: int | None = None,
    spec: Spec | None = None,
    feature_map: str | None = None,
    causal: bool | None = None,
    eps: float | None = None,
    layout: str | None = None,
    cost: str | None = None,
    stream: StreamFactory | None = None,
    state: str | None = None,
    varlen: bool = False,
    load: bool = True,
    normalize: bool | None = None,
    scale: float | str | None = None,
    decay: str | None = None,
) -> Implementation:
    """The implementation a user names: target None (a built-in form, `form` or the fast
    form of the spec), an adapter's name, a module:fn / path.py:fn target, or a callable;
    feature_map, causal and eps (or `spec`, a Spec) are the spec it claims (an adapter's is
    its own). With
    load=False nothing is imported (Implementation.load() does it later). state: the layout
    of the state fn carries (STATE_LAYOUTS), or DECLARED for an adapter's or a built-in
    form's own. varlen: fn takes packed batches too (cu_seqlens). normalize, scale, decay:
    the rest of the spec (specs.Spec; defaults True, 1, None). SpecError names what does
    not fit."""
    if varlen and state is not None:
        raise SpecError("--varlen with --state (a state per packed sequence) is not supported")
    rest = (normalize, scale, decay)
    if spec is not None:
        if (feature_map, causal, eps, *rest) != (None,) * 6:
            raise SpecError("give the spec either as spec= or as feature_map, causal, eps, ...")
        feature_map, causal, eps = spec.feature_map, spec.causal, spec.eps
        normalize, scale, decay = spec.normalize, spec.scale, spec.decay
    if cost is not None and cost not in COSTS:
        raise SpecError(f"cost must be one of {', '.join(COSTS)}, got {cost!r}")
    if layout is not None and layout not in LAYOUTS:
        raise SpecError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if target is not None and (form is not None or chunk_size is not None):
        raise SpecError("--form and --chunk-size choose a built-in form, not a target")
    if stream is not None and not callable(target):
        raise SpecError("a stream is given with a callable; the built-in forms have theirs")
    if isinstance(target, str) and target in ADAPTERS:
        adapter = ADAPTERS[target]
        given = [
            n
            for n, value in (
                ("feature-map", feature_map),
                ("causal", causal),
                ("eps", eps),
                ("layout", layout),
                ("no-normalize", normalize is False),
                ("scale", scale),
                ("decay", decay),
            )
            if value
        ]
        if given:
            raise SpecError(
                f"{target} is an adapter: its spec and layout are its claim (drop --{given[0]})"
            )
        if state is not None and adapter.state is None:
            raise SpecError(f"{target} takes no state (its library's function has none)")
        if state not in (None, DECLARED, adapter.state):
            raise SpecError(f"{target} carries its own state: give --state without a layout")
        if varlen and not adapter.varlen:
            raise SpecError(f"{target} takes no packed batch (no cu_seqlens)")
        impl = Implementation(
            None, adapter.spec, Source("adapter", target), adapter.layout, cost or adapter.cost,
            state=adapter.state if state is not None else None, varlen=varlen,
        )  # fmt: skip
        return impl.load() if load else impl
    if feature_map is None:
        what = "the built-in form" if target is None else repr(_label(target))
        raise SpecError(f"{what} needs --feature-map NAME (the spec it claims)")
    spec = Spec(
        feature_map, bool(causal), eps or 0.0, normalize is not False,
        1.0 if scale is None else scale, decay,
    )  # fmt: skip
    if target is None:
        impl = replace(_form(spec, form, chunk_size, layout, cost, load=False), varlen=varlen)
        if state is not None:
            impl = replace(impl, state=_builtin_state(impl, state))
        return _builtin(impl) if load else impl
    if state == DECLARED or state not in (None, *STATE_LAYOUTS):
        layouts = " or ".join(STATE_LAYOUTS)
        raise SpecError(f"--state takes the layout of {_label(target)}'s state: {layouts}")
    if state is not None and spec.no_state:
        raise SpecError(f"--state: {spec.no_state}")
    if state not in (None, state_layout(spec)):
        raise SpecError(f"--state {state}: the state of {spec} is {state_layout(spec)}")
    if callable(target):
        source = Source("callable", _label(target))
        return Implementation(
            target, spec, source, layout or "bhnd", cost or default_cost(spec), stream, state,
            varlen,
        )  # fmt: skip
    if not isinstance(target, str):
        raise SpecError(f"a target is module:fn, path.py:fn or a callable, got {target!r}")
    split_target(target)  # a malformed target is an error now, not in a worker
    impl = Implementation(
        None, spec, Source("target", target), layout or "bhnd", cost or default_cost(spec),
        state=state, varlen=varlen,
    )  # fmt: skip
    return impl.load() if load else impl


def _scale(text: str) -> float | str:
    """--scale's value: RSQRT_D or a number."""
    return text if text == RSQRT_D else float(text)


# The options that name an implementation to a command (what `command` writes and resolve
# takes), besides the target itself: (flag, keyword arguments of add_argument), shared by
# the commands (argparse) and the pytest plugin.
OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        "--form",
        {
            "choices": FORMS,
            "help": "a built-in form of lv.attention, when no target is "
            "given (default: linear, or chunked for a causal spec)",
        },
    ),
    (
        "--chunk-size",
        {
            "type": int,
            "metavar": "C",
            "help": f"the chunked form's chunk (default {DEFAULT_CHUNK})",
        },
    ),
    (
        "--feature-map",
        {
            "choices": list(FEATURE_MAPS),
            "metavar": "NAME",
            "help": "the spec fn claims; required for a module:fn or path.py:fn target and a "
            "--form (an adapter claims its own): " + ", ".join(FEATURE_MAPS),
        },
    ),
    ("--causal", {"action": "store_true", "help": "the claimed spec is causal"}),
    ("--eps", {"type": float, "help": "the denominator eps it claims (default 0)"}),
    (
        "--normalize",
        {
            "action": argparse.BooleanOptionalAction,
            "default": None,
            "help": "--no-normalize: the claimed spec is unnormalised, out_i = sum_j "
            "sim(q_i, k_j) v_j (default: normalised, divided by eps + sum_j sim(q_i, k_j))",
        },
    ),
    (
        "--scale",
        {
            "type": _scale,
            "metavar": "C",
            "help": f"every similarity times C: a number or {RSQRT_D} (1/sqrt(d), fla's "
            "default); default 1",
        },
    ),
    (
        "--decay",
        {
            "choices": DECAYS,
            "help": "causal decay: constant (fn takes gamma=(H,), sim times gamma^(i-j)) or "
            "gates (fn takes log-gates g=(B, H, N), sim times exp(g_(j+1) + ... + g_i))",
        },
    ),
    (
        "--layout",
        {
            "choices": LAYOUTS,
            "help": "the layout fn takes and returns: bhnd (B, H, N, d; the default) or bnhd",
        },
    ),
    (
        "--cost",
        {
            "choices": COSTS,
            "help": "the growth it claims (default: quadratic for "
            "softmax and the quadratic form, else linear)",
        },
    ),
    (
        "--state",
        {
            "nargs": "?",
            "const": DECLARED,
            "metavar": "LAYOUT",
            "help": "fn(q, k, v, initial_state=STATE) returns (out, final_state): S (the "
            "state S, (B, H, F, dv)) or Sz (the pair (S, z), z (B, H, F)); an adapter or a "
            "built-in form: --state alone (docs/contract.md, 'Carried state')",
        },
    ),
    (
        "--varlen",
        {
            "action": "store_true",
            "help": "fn also takes a packed batch, fn(q, k, v, cu_seqlens=OFFSETS) with B = 1 "
            "(docs/contract.md, 'Packed batches')",
        },
    ),
)


def from_options(
    target: str | None, values: Mapping[str, Any], load: bool = True
) -> Implementation:
    """resolve() of `target` with OPTIONS' values by their dest names (chunk_size, ...)."""
    return resolve(
        target,
        form=values.get("form"),
        chunk_size=values.get("chunk_size"),
        feature_map=values.get("feature_map"),
        causal=values.get("causal") or None,
        eps=values.get("eps"),
        layout=values.get("layout"),
        cost=values.get("cost"),
        state=values.get("state"),
        varlen=bool(values.get("varlen")),
        load=load,
        normalize=values.get("normalize"),
        scale=values.get("scale"),
        decay=values.get("decay"),
    )


def _form(spec: Spec, form, chunk_size, layout, cost, load: bool) -> Implementation:
    """A built-in form of lv.attention claiming `spec`."""
    if layout not in (None, "bhnd"):
        raise SpecError("--layout describes a target; the built-in forms take (B, H, N, d)")
    form = form or fast_form(spec)
    if form not in FORMS:
        raise SpecError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    if form not in forms_of(spec):
        raise SpecError(
            f"form {form!r} does not evaluate {spec}; its forms: {', '.join(forms_of(spec))}"
        )
    if chunk_size is not None and form != "chunked":
        raise SpecError(f"--chunk-size is for the chunked form, not {form!r}")
    if form == "chunked":
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int | None):
            raise SpecError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        chunk_size = DEFAULT_CHUNK if chunk_size is None else chunk_size
        if chunk_size < 1:
            raise SpecError(f"chunk_size must be a positive integer, got {chunk_size}")
    impl = Implementation(
        None, spec, Source("form", form, chunk_size), "bhnd", cost or default_cost(spec, form)
    )
    return _builtin(impl) if load else impl


def _builtin_state(impl: Implementation, state: str) -> str:
    """The state layout of a built-in form asked for one: (S, z) of its causal stream."""
    spec, form = impl.spec, impl.source.name
    if state not in (DECLARED, *STATE_LAYOUTS):
        raise SpecError("the built-in forms carry the pair (S, z): --state without a layout")
    if spec.no_state:
        raise SpecError(f"--state: {spec.no_state}")
    if form not in ("recurrent", "chunked"):
        raise SpecError(f"{impl.name} carries no state: the recurrent and chunked forms do")
    return state_layout(spec)


def state_layout(spec: Spec) -> str:
    """The layout of a spec's carried state: (S, z) when normalised, S alone otherwise."""
    return "Sz" if spec.normalize else "S"


def _builtin(impl: Implementation) -> Implementation:
    """The built-in form of `impl` with its fn (taking packed batches with varlen, carrying
    its state with state) and its stream for the causal forms."""
    spec, form = impl.spec, impl.source.name
    chunk_size = impl.source.chunk_size or DEFAULT_CHUNK
    if impl.varlen:
        fn = functools.partial(attention_varlen, causal=spec.causal, form=form)
    elif impl.state is not None:
        fn = functools.partial(attention_with_state, form=form)
    else:
        fn = functools.partial(attention, causal=spec.causal, form=form)
    fn = functools.partial(fn, feature_map=spec.feature_map, eps=spec.eps, chunk_size=chunk_size)
    if not spec.plain:
        fn = functools.partial(fn, normalize=spec.normalize, scale=spec.scale, decay=spec.decay)
    stream = None
    if form in ("recurrent", "chunked") and spec.plain:

        def stream(max_len, projection):
            return CausalStream(
                spec.feature_map, projection, spec.eps, chunk_size, max_len=max_len, form=form
            )

    return replace(impl, fn=fn, stream=stream)


def _state_problem(state: Any, want: tuple[int, int, int, int], layout: str) -> str | None:
    """What is wrong with a state (S, z), or S alone for layout "S", for (B, H, F, dv) =
    want, or None."""
    if layout == "S":
        if not isinstance(state, torch.Tensor):
            return f"of type {type(state).__name__}, not the tensor S"
        if tuple(state.shape) != want:
            return f"S of shape {tuple(state.shape)}, not (B, H, F, dv) = {want}"
        return None
    if not isinstance(state, tuple | list) or len(state) != 2:
        return f"of type {type(state).__name__}, not the pair (S, z)"
    if not all(isinstance(t, torch.Tensor) for t in state):
        return "that is not made of torch tensors"
    s, z = state
    if tuple(s.shape) != want:
        return f"S of shape {tuple(s.shape)}, not (B, H, F, dv) = {want}"
    if tuple(z.shape) != want[:3]:
        return f"z of shape {tuple(z.shape)}, not (B, H, F) = {want[:3]}"
    return None


def _label(fn: Any) -> str:
    """A callable's qualified name (of the function a partial wraps), or a target as is."""
    if isinstance(fn, str):
        return fn
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__qualname__", type(inner).__name__)


def _importable_name(fn: Any) -> str:
    """module:name (path.py:name for a script's) under which `fn` itself can be loaded, found
    among its module's attributes; else <qualname>, which names it but cannot be loaded."""
    inner = fn.func if isinstance(fn, functools.partial) else fn
    module = sys.modules.get(getattr(inner, "__module__", None) or "")
    for attr, value in vars(module).items() if module is not None else ():
        if value is fn:
            if module.__name__ == "__main__" and getattr(module, "__file__", None):
                return f"{Path(module.__file__)}:{attr}"
            return f"{module.__name__}:{attr}"
    return f"<{_label(fn)}>"
