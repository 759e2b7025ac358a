"""A packed batch (--varlen: fn(q, k, v, cu_seqlens=offsets) with B = 1, the FlashAttention
convention): sequences of several lengths, empty ones first, between and last and a
one-token one among them (fla #103: empty sequences give NaN or an illegal access), each
drawn afresh, packed one after another, give
what each gives run by itself: nothing leaks across a boundary (fla PR #955, #837), and a
batch of one sequence gives the plain call's output (vllm PR #22034: batch size 1). A
decayed spec's log-gates are drawn with each sequence and packed along N like its tokens
(each sequence's own run gets its slice g[:, :, a:b]); a constant gamma is shared."""

from __future__ import annotations

import dataclasses
import itertools

import torch

from ..cases import Case
from ..families import case_arguments, family_of, validate
from ..specs import Spec
from ..under_test import Implementation
from .compare import Tolerance, mismatch
from .core import Outcome, as_array, check, decay_part, inputs_of


def _lengths(n: int) -> list[int]:
    """The lengths packed: empty ones first, in the middle and last, the case's own, one
    token, an odd part, the case's again (a boundary after every kind of sequence)."""
    return [0, n, 0, 1, n // 2 + 1, n, 0]


def _sequence(case: Case, s: int, n: int, spec: Spec) -> list[torch.Tensor | None]:
    """q, k, v (1, H, n, d) of packed sequence s and its decay (families.case_arguments): drawn
    afresh, of the case's kind and magnitude, so that no two sequences share a token."""
    drawn = dataclasses.replace(case, b=1, n=n, seed=case.seed + 7919 * (s + 1))
    q, k, v, _, decay = case_arguments(drawn, spec)
    return [q, k, v, decay]


def _tokens(n: int) -> str:
    return "1 token" if n == 1 else f"{n} tokens"


def _after(lengths: list[int], s: int) -> str:
    """Where packed sequence s starts, in words: first, right after an empty one, or after
    one of some tokens."""
    if s == 0:
        return "the first"
    if lengths[s - 1] == 0:
        return "right after an empty sequence"
    return f"right after one of {_tokens(lengths[s - 1])}"


@check("varlen")
def varlen(impl: Implementation, case: Case) -> Outcome:
    """Each sequence of a packed batch equals its own run (with its slice of the packed
    log-gates); one sequence equals the plain call."""
    spec = impl.spec
    (q, k, v, w, decay), _ = inputs_of(case, spec)
    first = slice(0, 1)
    lengths = _lengths(case.n)
    empty = [*(t[:1, :, :0] for t in (q, k, v)), decay_part(decay, first, tokens=slice(0, 0))]
    parts = [_sequence(case, s, n, spec) if n else empty for s, n in enumerate(lengths)]
    packed = [torch.cat([p[i] for p in parts], dim=-2) for i in range(3)]
    packed_decay = torch.cat([p[3] for p in parts], 2) if family_of(spec).per_token(spec) else decay
    offsets = [0, *itertools.accumulate(lengths)]
    cu = torch.tensor(offsets, dtype=torch.int32, device=q.device)
    out = as_array(impl.call_varlen(*packed, w, cu, packed_decay))
    for s, (n, (a, end)) in enumerate(zip(lengths, itertools.pairwise(offsets), strict=True)):
        if n == 0:
            continue
        own_decay = decay_part(packed_decay, tokens=slice(a, end))
        x = validate(*parts[s][:3], spec, w, own_decay)
        own = as_array(impl(*parts[s][:3], w, own_decay))
        tol = Tolerance.of(x, spec)
        found = mismatch(out[..., a:end, :], own, tol, tol.allowance())
        if found is not None:
            what = (
                f"sequence {s} of a packed batch ({_tokens(n)}, {_after(lengths, s)}; lengths "
                f"{lengths}, counted from 0; cu_seqlens {offsets}) against its own run"
            )
            return Outcome(False, found.describe(what), {"units": found.units})
    single = torch.tensor([0, case.n], dtype=torch.int32, device=q.device)
    row, row_decay = [t[first] for t in (q, k, v)], decay_part(decay, first)
    one = as_array(impl.call_varlen(*row, w, single, row_decay))
    plain = as_array(impl(*row, w, row_decay))
    tol = Tolerance.of(validate(*row, spec, w, row_decay), spec)
    if (found := mismatch(one, plain, tol, tol.allowance())) is not None:
        what = "a batch of one packed sequence against the plain call"
        return Outcome(False, found.describe(what), {"units": found.units})
    return Outcome(True, f"packed lengths {lengths} equal their own runs")
