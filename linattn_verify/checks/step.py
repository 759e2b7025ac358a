"""A step kernel (--step: fn(q, k, v, cache=..., slots=...) applies one token per request to
its slot of a state cache, in place; docs/step.md).

- step-decode: the prefix's exact state in a slot (the prefill), then the rest of the
  sequence decoded one token a call: every output against the whole sequence's exact one
  (bound and budget, as the reference check judges), and the slot after the last token
  against the exact state (the state bound: the prefix summed exactly and rounded once is
  one way to evaluate it). A state not written back shows here;
- step-cache: one call on requests in slots of a cache of 2B + 2 (none at its row's
  index, in a drawn order), a pad request (slot -1) among them: the named slots hold each
  request's exact next state, every other slot is bit-for-bit what it was (the last one
  included, which slot -1 indexes in torch), and each request's output is exact. A slot
  read as the batch index, or the pad slot written, shows here.

The cache is in under_test's cache_dtype; a slot's state is what --state's layout is.
"""

from __future__ import annotations

import torch

from ..accuracy.judgement import Judgement
from ..cases import Case
from ..families import family_of
from ..under_test import Implementation
from ..under_test.implementation import Cache, cache_dtype, zero_cache
from .core import Outcome, case_generator, check, decay_part, inputs_of
from .state import (
    by_nature,
    exact_parts,
    prefix_length,
    state_allowance,
    state_mismatch,
    state_parts,
)

# why no gradient check applies to a step kernel (issue 47: decoding has no backward)
NO_BACKWARD = "a step kernel decodes: gradients are not part of serving"


def _cache(impl: Implementation, x, p: int, shape: tuple[int, ...], q: torch.Tensor) -> Cache:
    """A cache of `shape` (B, H, F, dv) holding the exact state of the first p tokens of x."""
    if p == 0:
        return zero_cache(impl.spec, shape, q.dtype, q.device)
    parts = (
        torch.from_numpy(t).to(q.device, cache_dtype(q.dtype))
        for t in exact_parts(x.first(p), impl.spec)
    )
    return tuple(parts) if impl.spec.normalize else next(parts)


def _judged(case: Case, impl: Implementation, p: int, rows: torch.Tensor, what: str) -> Outcome:
    """The outputs of tokens p.. (B, H, N - p, dv) judged as the reference check judges a
    whole output: rows 0..p-1 are the exact ones, rounded to the dtype."""
    judgement = Judgement.of_case(case, impl.spec)
    whole = torch.from_numpy(judgement.ref).to(rows.dtype)
    whole[..., p:, :] = rows.to("cpu")
    verdict = judgement(whole)
    figures = {"max_error": verdict.max_error, "relative_error": verdict.relative_error}
    if verdict.passed:
        return Outcome(True, f"{what}: {verdict.message}", figures)
    return Outcome(False, f"{what}: {verdict.message}", figures, severity=verdict.severity)


def _state_outcome(
    impl: Implementation, x, got: tuple, dtype: torch.dtype, what: str
) -> Outcome | None:
    """The failure of states `got` (parts, (B, ...)) against the exact state after x, or
    None when they are within its bound."""
    if problem := state_mismatch(got, exact_parts(x, impl.spec), state_allowance(impl, x, 1.0)):
        if nature := by_nature(impl, x, [x.q.shape[2]], dtype):
            return Outcome(False, f"{what}: {nature}", by_nature=nature)
        return Outcome(False, f"{what} against the exact state: {problem}")
    return None


@check("step-decode")
def step_decode(impl: Implementation, case: Case) -> Outcome:
    """Prefill (the prefix's exact state), then one token a call: each output and the slot
    after the last token against the whole sequence's exact output and state."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    p = prefix_length(case) if case.n > 1 else 0
    f = spec.info.feature_dim(q.shape[-1], None if w is None else w.shape[0])
    cache = _cache(impl, x, p, (*v.shape[:2], f, v.shape[-1]), q)
    slots = torch.arange(q.shape[0], device=q.device)
    outs = [
        impl.call_step(
            *(t[..., i : i + 1, :] for t in (q, k, v)), w, cache, slots,
            decay_part(decay, tokens=slice(i, i + 1)),
        )
        for i in range(p, case.n)
    ]  # fmt: skip
    what = f"tokens {p}..{case.n - 1} decoded from the exact state of the first {p}"
    parts = state_parts(cache, spec)
    outcome = _judged(case, impl, p, torch.cat(outs, dim=-2), what)
    if outcome.passed:
        last = "the slot after the last token"
        return _state_outcome(impl, x, parts, parts[0].dtype, last) or outcome
    if p and (nature := by_nature(impl, x, [p], parts[0].dtype)):  # the prefill's
        return Outcome(False, f"{what}: {nature}", by_nature=nature)
    return outcome


def _with_pad(t: torch.Tensor, at: int) -> torch.Tensor:
    """t (B, ...) with a copy of its request 0 inserted at `at`: the pad request."""
    return torch.cat([t[:at], t[:1], t[at:]])


def _slots(b: int, case: Case) -> torch.Tensor:
    """The slots of b requests in a cache of 2b + 2: b + 1..2b in a drawn order, so that no
    request's slot is its row in a batch of b + 1 (the pad's included), and neither the
    rows' slots nor the last (which slot -1 indexes) are named."""
    return b + 1 + torch.randperm(b, generator=case_generator(case, 47))


@check("step-cache")
def step_cache(impl: Implementation, case: Case) -> Outcome:
    """One call on requests in drawn slots with a pad request (slot -1): the named slots
    exact, every other slot bit-for-bit untouched, the outputs exact."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    b, p = q.shape[0], case.n - 1  # the prefix, then its last token
    f = spec.info.feature_dim(q.shape[-1], None if w is None else w.shape[0])
    prefix = state_parts(_cache(impl, x, p, (*v.shape[:2], f, v.shape[-1]), q), spec)
    slots = _slots(b, case)
    generator = case_generator(case, 48)
    parts = tuple(
        torch.randn((2 * b + 2, *t.shape[1:]), generator=generator, dtype=t.dtype).to(t.device)
        for t in prefix
    )  # every slot a state of its own
    for part, t in zip(parts, prefix, strict=True):
        part[slots.to(part.device)] = t
    before = tuple(t.clone() for t in parts)
    at = int(torch.randint(0, b + 1, (1,), generator=generator))
    token = (_with_pad(t[..., p:, :], at) for t in (q, k, v))
    gates = decay_part(decay, tokens=slice(p, None))
    if gates is not None and family_of(spec).per_token(spec):
        gates = _with_pad(gates, at)
    named = _with_pad(slots, at)
    named[at] = -1
    cache = parts if spec.normalize else parts[0]
    out = impl.call_step(*token, w, cache, named.to(q.device), gates)
    called = f"requests in slots {named.tolist()} of {2 * b + 2}"
    unnamed = sorted(set(range(2 * b + 2)) - set(slots.tolist()))
    for name, old, new in zip(("S", "z"), before, parts):
        if written := [j for j in unnamed if not torch.equal(old[j], new[j])]:
            last = " (the last, which slot -1 indexes)" * (written[-1] == 2 * b + 1)
            return Outcome(False, f"{called}: unnamed slot(s) {written} of {name} written{last}")
    got = tuple(t[slots.to(t.device)] for t in parts)
    if failed := _state_outcome(impl, x, got, parts[0].dtype, f"{called}: the named slots"):
        return failed
    keep = torch.tensor([i for i in range(b + 1) if i != at], device=out.device)
    return _judged(case, impl, p, out.index_select(0, keep), f"{called}: the outputs")
