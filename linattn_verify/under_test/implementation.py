"""What an implementation under test is and how it is called: fn behind the contract
(docs/contract.md), the spec and contract options it claims, and where it comes from (its
Source). Every call goes through here: keywords by the spec, layouts converted, states and
packed batches checked, the implementation's exceptions turned into ImplementationFailure.
The options that name it again (command) and the line that reruns a check on a case
(reproduce) are its own.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .. import triton_interpret
from ..adapters import ADAPTERS
from ..cases import Case
from ..families import family_of, spec_words
from ..grammar import words
from ..head_dims import UNDECLARED, HeadDims
from ..implementations.forms import DEFAULT_CHUNK
from ..specs import RSQRT_D, Spec, SpecError
from ..target import load_target
from . import builtin
from .claim import CLAIM, DECLARED, LAYOUTS, SOURCE, SPEC_FIELDS, STATE_LAYOUTS, default_cost
from .guard_bands import OutOfBounds, guarded
from .names import importable_name

# a stream factory: stream(max_len, projection) -> piece(q, k, v) -> out, carrying state
StreamFactory = Callable[[int, torch.Tensor | None], Callable[..., torch.Tensor]]


class ImplementationFailure(Exception):
    """The implementation raised or returned something that is not an output."""


@dataclass(frozen=True)
class Source:
    """Where an implementation comes from: kind "form" (a built-in form of lv.attention, its
    chunk_size for the chunked form), "target" (module:fn or path.py:fn), "adapter" (a
    third-party library, adapters.ADAPTERS) or "callable" (handed over in process); name:
    the form, the target, the adapter's name or the callable's qualified name."""

    kind: str
    name: str
    chunk_size: int | None = None


@dataclass(frozen=True)
class Implementation:
    """Anything under test, behind the contract: fn(q, k, v[, projection=W]) (docs/contract.md).

    layout: the layout fn takes and returns, "bhnd" (B, H, N, d) or "bnhd" (B, N, H, d);
    calls go through __call__ with (B, H, N, d) tensors. cost: the growth it claims.
    stream: for causal specs with a state API, stream(max_len, W) returns a callable that
    takes the sequence in pieces. state: the layout of the carried state (claim.STATE_LAYOUTS)
    when fn takes one: fn(q, k, v[, projection], initial_state=...) returns (out, final
    state), initial_state None for a sequence from its start. varlen: fn also takes a packed
    batch, fn(q, k, v[, projection], cu_seqlens=offsets) with B = 1 (docs/contract.md,
    "Packed batches"), cu_seqlens None for a plain one. step: the layout of each slot of the
    state cache when fn is a step kernel (--step: fn(q, k, v[, projection], cache=...,
    slots=...) applies one token per request, docs/contract.md, "Step kernels"); a whole
    sequence is then decoded token by token (decode). triton: "interpret" when fn's Triton
    kernels run in Triton's interpreter (triton_interpret.py; tf32: TF32 products), fn then
    called on guarded inputs (guard_bands.py). dtypes: the dtypes its library claims (an
    adapter's; None: every one), and head_dims the head dimensions it takes (--max-head-dim,
    --even-dims-backward, or an adapter's), vet's judgement kept inside them. fn is None while the
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
    step: str | None = None
    triton: str | None = None
    tf32: bool = False
    dtypes: tuple[str, ...] | None = None
    head_dims: HeadDims = UNDECLARED

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
        words = spec_words(spec)  # the label: the word of a family its fields do not name
        order = ("eps", "normalize", "decay", "label", "qk_l2norm")
        rest = "".join(f"-{words[f]}" for f in order if f in words)
        rest += f"-scale{spec.scale_for(1) if spec.scale != RSQRT_D else 'rsqrtd'}" * (
            spec.scale != 1.0
        )
        causal = "causal" if spec.causal else "full"
        return f"{spec.feature_map}-{causal}-{self.source.name}{chunk}{rest}"

    @property
    def command(self) -> str:
        """The options that name it to a command (`check`, `vet`, ...): what resolve takes.
        How its Triton kernels run is said even where it is automatic (so that a command
        copied to a machine with a GPU runs what it ran here)."""
        kind, name = self.source.kind, self.source.name
        triton = {"triton": self.triton, "tf32": self.tf32}
        if kind == "adapter":  # its spec and layout are its own
            cost = self.cost if self.cost != ADAPTERS[name].cost else None
            state = DECLARED if self.state is not None else None
            given = {"cost": cost, "state": state, "varlen": self.varlen, **triton,
                     "dot_precision": self.spec.dot_precision,
                     "stored": self.spec.stored}  # fmt: skip
            return shlex.join(["--impl", name, *words(CLAIM, given)])
        if kind == "form":
            source = words(SOURCE, {"form": name, "chunk_size": self.source.chunk_size})
            state = DECLARED if self.state is not None else None
        else:
            source = ["--impl", name if kind == "target" else importable_name(self.fn)]
            state = self.state
        default = default_cost(self.spec, name if kind == "form" else None)
        values = {f: getattr(self.spec, f) for f in SPEC_FIELDS} | {
            "layout": self.layout,
            "cost": self.cost if self.cost != default else None,
            "state": state,
            "varlen": self.varlen,
            "step": self.step,
            **triton,
            "max_head_dim": self.head_dims.largest,
            "even_dims_backward": self.head_dims.even_backward,
        }
        return shlex.join([*source, *words(CLAIM, values)])

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
        if self.triton == "interpret":
            triton_interpret.enable()  # before the target imports triton
        if kind == "adapter":
            adapter = ADAPTERS[name]
            fn = (adapter.load_state if self.state else adapter.load)()
            return replace(self, fn=guarded(fn) if self.triton else fn)
        if kind == "target":
            fn = load_target(name)
            return replace(self, fn=guarded(fn) if self.triton else fn)
        if kind == "form":
            chunk_size, stateful = self.source.chunk_size, self.state is not None
            fn, stream = builtin.calls(self.spec, name, chunk_size, self.varlen, stateful)
            return replace(self, fn=fn, stream=stream)
        raise SpecError(f"the callable {name} cannot be loaded again: pass it in process")

    def to_layout(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, H, N, x) tensor in the implementation's layout (a view)."""
        return t.transpose(1, 2) if self.layout == "bnhd" else t

    def _keywords(self, projection, decay) -> dict[str, Any]:
        """fn's keyword arguments besides q, k, v: the projection of a Performer map, and the
        spec's packed per-call argument `decay` (Family.pack: a decay's gamma or log-gates,
        the delta rule's beta and gates) by the keywords its family names, in fn's layout
        (Family.keywords)."""
        kwargs = {"projection": projection} if self.spec.info.needs_projection else {}
        family = family_of(self.spec)
        names = " and ".join(family.argument_names(self.spec))
        if not names:
            if decay is not None:
                raise SpecError(f"{self.name} takes no decay: its spec has none")
            return kwargs
        if decay is None:
            raise SpecError(f"{self.name} needs {names} ({family.name})")
        return kwargs | family.keywords(self.spec, decay, self.layout)

    def running(self) -> contextlib.AbstractContextManager:
        """Where fn's kernels run, its backward included: Triton's interpreter with this
        implementation's TF32 setting (triton_interpret.running), else nothing to set."""
        if self.triton == "interpret":
            return triton_interpret.running(self.tf32)
        return contextlib.nullcontext()

    def _run(self, q, k, v, projection, decay, **extra) -> Any:
        """What fn returns for q, k, v in its layout and its keywords (_keywords, extra); any
        exception it raises becomes ImplementationFailure."""
        if self.fn is None:
            raise SpecError(f"{self.name} is declared, not loaded: call load() first")
        kwargs = self._keywords(projection, decay) | extra
        try:
            with self.running():
                return self.fn(q, k, v, **kwargs)
        except OutOfBounds as err:
            raise ImplementationFailure(str(err)) from None
        except Exception as err:  # the implementation's failure is a finding, not a crash
            hint = self._keyword_hint(err, kwargs)
            raise ImplementationFailure(f"raised {type(err).__name__}: {err}{hint}") from None

    def _keyword_hint(self, err: Exception, kwargs: dict[str, Any]) -> str:
        """ " (vet passes X= for ...)" where fn rejected a keyword vet passes, else ""."""
        rejected = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        name = rejected.group(1) if isinstance(err, TypeError) and rejected else None
        if name not in kwargs:
            return ""
        claims = {"initial_state": "--state", "cu_seqlens": "--varlen", "cache": "--step",
                  "slots": "--step",
                  "projection": f"--feature-map {self.spec.feature_map}"}  # fmt: skip
        claim = claims.get(name, f"the spec {self.spec}")
        return (
            f" (vet passes {name}= for {claim}, docs/contract.md: take it under that name, "
            "or claim what the kernel computes)"
        )

    def not_a_tensor(self, out: Any, what: str = "") -> ImplementationFailure:
        """The failure of an output that is no tensor, with the option that declares a
        tuple of (output, state) where the spec carries one (--state)."""
        hint = ""
        if isinstance(out, tuple) and self.state is None and not self.spec.no_state:
            hint = f" (if it is (output, state), declare it: --state {' or '.join(STATE_LAYOUTS)})"
        return ImplementationFailure(
            f"returned {type(out).__name__}{what}, not a torch tensor{hint}"
        )

    def layout_hint(self, shape: tuple[int, ...], want: tuple[int, ...]) -> str:
        """ " (--layout X: ...)" where `shape` is the expected shape `want` (in fn's layout)
        in the other layout, else ""."""
        other = next(layout for layout in LAYOUTS if layout != self.layout)
        swapped = (want[0], want[2], want[1], *want[3:]) if len(want) == 4 else None
        if tuple(shape) == swapped and want[1] != want[2]:
            return f" (that is the {other} layout's: declare --layout {other})"
        return ""

    def _output(self, out: Any, want: tuple[int, ...], what: str = "") -> torch.Tensor:
        """out (in fn's layout) as (B, H, N, dv) = want; ImplementationFailure otherwise."""
        if not isinstance(out, torch.Tensor):
            raise self.not_a_tensor(out, what)
        if out.dim() != 4 or tuple(self.to_layout(out).shape) != want:
            shape = tuple(out.shape)
            native = tuple(self.to_layout(torch.empty(want, device="meta")).shape)
            raise ImplementationFailure(
                f"returned shape {shape}{what}, expected {want} ({self.layout})"
                + self.layout_hint(shape, native)
            )
        return self.to_layout(out)

    def call_raw(self, q, k, v, projection=None, decay=None) -> torch.Tensor:
        """fn's output tensor for tensors already in its layout (the decay in bhnd's)."""
        if self.step is not None:
            return self._decode(q, k, v, projection, decay)
        if self.state is not None:
            return self.call_state(q, k, v, projection, None, True, decay)[0]
        out = self._run(q, k, v, projection, decay)
        if not isinstance(out, torch.Tensor):
            raise self.not_a_tensor(out)
        return out

    def call_state(
        self, q, k, v, projection=None, initial_state=None, layout_given: bool = False, decay=None
    ) -> tuple[torch.Tensor, Any]:
        """(out, final state) of fn continuing from initial_state (None: from the start), q,
        k, v (B, H, N, d) unless layout_given (already in fn's layout, and so is out); the
        shapes of out and of the state (its layout's) checked."""
        if self.state is None:
            raise SpecError(f"{self.name} takes no state: declare its layout with --state")
        if not layout_given:
            q, k, v = (self.to_layout(t).contiguous() for t in (q, k, v))
        result = self._run(q, k, v, projection, decay, initial_state=initial_state)
        if not isinstance(result, tuple | list) or len(result) != 2:
            got = type(result).__name__
            raise ImplementationFailure(f"returned {got}, not the pair (out, final_state)")
        q_, v_ = self.to_layout(q), self.to_layout(v)  # (B, H, N, d) views
        want = (*v_.shape[:2], q_.shape[2], v_.shape[-1])  # v's heads (Spec.value_heads)
        out, final = self._output(result[0], want), result[1]
        m = None if projection is None else projection.shape[0]
        f = self.spec.info.feature_dim(q_.shape[-1], m)
        if problem := _state_problem(final, (*want[:2], f, want[3]), self.state):
            raise ImplementationFailure(f"returned a final state {problem}")
        return self.to_layout(out) if layout_given else out, final

    def call_step(
        self, q, k, v, projection, cache: Cache, slots: torch.Tensor, decay=None, layout_given=False
    ) -> torch.Tensor:
        """fn's outputs (B, H, 1, dv) for one token per request, q, k, v (B, H, 1, d) unless
        layout_given (already in fn's layout, and so is the output), request b's state in
        slot slots[b] of `cache` (-1: none), which fn updates in place (docs/contract.md,
        "Step kernels"); decay: this token's part."""
        if self.step is None:
            raise SpecError(f"{self.name} is no step kernel: declare its cache with --step")
        if not layout_given:
            q, k, v = (self.to_layout(t).contiguous() for t in (q, k, v))
        out = self._run(q, k, v, projection, decay, cache=cache, slots=slots)
        q_, v_ = self.to_layout(q), self.to_layout(v)
        out = self._output(out, (*v_.shape[:2], q_.shape[2], v_.shape[-1]), " for a step")
        return self.to_layout(out) if layout_given else out

    def _decode(self, q, k, v, projection, decay) -> torch.Tensor:
        """fn's output (in its layout) for whole sequences in its layout, decoded token by
        token: request b in slot b of a cache of zero states."""
        q_, v_ = self.to_layout(q), self.to_layout(v)
        m = None if projection is None else projection.shape[0]
        f = self.spec.info.feature_dim(q_.shape[-1], m)
        cache = zero_cache(self.spec, (v_.shape[0], v_.shape[1], f, v_.shape[-1]), q.dtype,
                           q.device)  # fmt: skip
        slots = torch.arange(q_.shape[0], device=q.device)
        per_token = decay is not None and family_of(self.spec).per_token(self.spec)
        axis = 1 if self.layout == "bnhd" else 2  # the tokens' in fn's layout
        outs = [
            self.call_step(
                *(t.narrow(axis, i, 1) for t in (q, k, v)), projection, cache, slots,
                decay[:, :, i : i + 1] if per_token else decay, layout_given=True,
            )
            for i in range(q_.shape[2])
        ]  # fmt: skip
        return torch.cat(outs, dim=axis)

    def call_varlen(
        self, q, k, v, projection, cu_seqlens: torch.Tensor, decay=None
    ) -> torch.Tensor:
        """fn's output (1, H, T, dv) for the packed batch q, k, v (1, H, T, d) of cu_seqlens."""
        if not self.varlen:
            raise SpecError(f"{self.name} takes no packed batch: declare it with --varlen")
        args = (self.to_layout(t).contiguous() for t in (q, k, v))
        out = self._run(*args, projection, decay, cu_seqlens=cu_seqlens)
        return self._output(out, (*v.shape[:2], q.shape[2], v.shape[-1]), " for a packed batch")

    def __call__(self, q, k, v, projection=None, decay=None) -> torch.Tensor:
        """The output (B, H, N, dv) for (B, H, N, d) inputs (H: v's heads, G times q's for
        grouped value heads, Spec.value_heads), contiguous in fn's layout; decay:
        a decayed spec's gamma (H,) or log-gates (B, H, N) or (B, H, N, d), or the delta
        rule's packed beta and gates (families.case_arguments: Family.pack's)."""
        args = (self.to_layout(t).contiguous() for t in (q, k, v))
        out = self.call_raw(*args, projection, decay)
        return self._output(out, (*v.shape[:2], q.shape[2], v.shape[-1]))


Cache = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # S, or (S, z) (--step Sz)


def cache_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of a step kernel's state cache for inputs of `dtype`: float32, float64 for
    float64 inputs (a serving engine keeps its states wider than 16-bit tokens)."""
    return torch.promote_types(dtype, torch.float32)


def zero_cache(spec: Spec, shape: tuple[int, int, int, int], dtype, device) -> Cache:
    """A cache of zero states, S of `shape` (slots, H, F, dv), with z (slots, H, F) for a
    normalised spec, in cache_dtype(dtype)."""
    s = torch.zeros(shape, dtype=cache_dtype(dtype), device=device)
    return (s, s.new_zeros(shape[:3])) if spec.normalize else s


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
