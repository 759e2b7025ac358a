"""A packed batch (--varlen: fn(q, k, v, cu_seqlens=offsets) with B = 1, the FlashAttention
convention): sequences of several lengths, an empty one and a one-token one among them
(fla #103: empty sequences give NaN or an illegal access), packed one after another, give
what each gives run by itself: nothing leaks across a boundary (fla PR #955, #837), and a
batch of one sequence gives the plain call's output (vllm PR #22034: batch size 1)."""

from __future__ import annotations

import itertools

import torch

from ..cases import Case
from ..inputs import validate
from ..under_test import Implementation
from .compare import Tolerance, mismatch
from .core import Outcome, as_array, check, inputs_of


def _lengths(n: int) -> list[int]:
    """The lengths packed: the case's own, an empty one, one token, an odd part, and the
    whole again (a boundary after every kind of sequence)."""
    return [n, 0, 1, max(1, n // 2 + 1) if n > 1 else 1, n][: 5 if n > 1 else 3]


def _sequences(case: Case) -> list[tuple[int, int]]:
    """(batch row, length) of each packed sequence: rows taken in turn from the case."""
    return [(s % case.b, n) for s, n in enumerate(_lengths(case.n))]


@check("varlen")
def varlen(impl: Implementation, case: Case) -> Outcome:
    """Each sequence of a packed batch equals its own run; one sequence equals the plain
    call."""
    spec = impl.spec
    (q, k, v, w), _ = inputs_of(case, spec)
    seqs = _sequences(case)
    parts = [[t[b : b + 1, :, :n] for t in (q, k, v)] for b, n in seqs]
    packed = [torch.cat([p[i] for p in parts], dim=-2) for i in range(3)]
    offsets = [0, *itertools.accumulate(n for _, n in seqs)]
    cu = torch.tensor(offsets, dtype=torch.int32, device=q.device)
    out = as_array(impl.call_varlen(*packed, w, cu))
    for s, ((_, n), (a, end)) in enumerate(zip(seqs, itertools.pairwise(offsets), strict=True)):
        if n == 0:
            continue
        x = validate(*parts[s], spec, w)
        own = as_array(impl(*parts[s], w))
        tol = Tolerance.of(x, spec)
        found = mismatch(out[..., a:end, :], own, tol, tol.allowance())
        if found is not None:
            after = f", after {seqs[s - 1][1]} tokens" if s else ""
            what = (
                f"sequence {s} (length {n}{after}) of a packed batch of lengths "
                f"{[m for _, m in seqs]} (cu_seqlens {offsets}) against its own run"
            )
            return Outcome(False, found.describe(what), {"units": found.units})
    single = torch.tensor([0, case.n], dtype=torch.int32, device=q.device)
    one = as_array(impl.call_varlen(*(t[:1] for t in (q, k, v)), w, single))
    plain = as_array(impl(*(t[:1] for t in (q, k, v)), w))
    tol = Tolerance.of(validate(*(t[:1] for t in (q, k, v)), spec, w), spec)
    if (found := mismatch(one, plain, tol, tol.allowance())) is not None:
        what = "a batch of one packed sequence against the plain call"
        return Outcome(False, found.describe(what), {"units": found.units})
    return Outcome(True, f"packed lengths {[n for _, n in seqs]} equal their own runs")
