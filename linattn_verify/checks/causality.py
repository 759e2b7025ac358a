"""Causal specs: no output depends on a later token, and a sequence in pieces equals one pass.

- causality: tokens t+1 ... N-1 (q, k and v) are replaced by unrelated, larger ones (4x the
  magnitude, values offset by 1000); rows 0 ... t must not move beyond the bound;
- split-resume: an implementation with a state API (Implementation.stream) fed the
  sequence in two or three pieces gives the one-pass output.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch

from ..cases import Case
from ..families import case_arguments, family_of, validate
from ..under_test import Implementation
from .compare import Tolerance, agreement, mismatch
from .core import Outcome, as_array, case_generator, check, inputs_of

LATER_OFFSET = 1000.0  # added to the replaced values: a leak moves outputs far out of bound


@check("causality")
def causality(impl: Implementation, case: Case) -> Outcome:
    """Changing tokens j > t never changes output rows i <= t."""
    spec = impl.spec
    if case.n < 2:
        return Outcome(True, "N = 1: there is no later token to change")
    (q, k, v, w, decay), x = inputs_of(case, spec)
    t = int(torch.randint(case.n - 1, (1,), generator=case_generator(case, 2)))
    top = torch.finfo(q.dtype).max
    other = dataclasses.replace(case, seed=case.seed + 1, magnitude=min(4 * case.magnitude, top))
    q2, k2, v2, _, decay2 = case_arguments(other, spec)  # later gates (and beta) changed too
    later = slice(t + 1, None)
    q2, k2 = (
        torch.cat([q[..., : t + 1, :], q2[..., later, :]], -2),
        torch.cat([k[..., : t + 1, :], k2[..., later, :]], -2),
    )
    v_later = (v2[..., later, :].double() + LATER_OFFSET).to(v.dtype)
    v2 = torch.cat([v[..., : t + 1, :], v_later], -2)
    if family_of(spec).per_token(spec):
        decay2 = torch.cat([decay[:, :, : t + 1], decay2[:, :, later]], 2)
    else:  # one per call (gamma, or none): the same
        decay2 = decay
    tol = Tolerance.of(x, spec)
    tol2 = Tolerance.of(validate(q2, k2, v2, spec, w, decay2), spec)
    out = as_array(impl(q, k, v, w, decay))
    changed = as_array(impl(q2, k2, v2, w, decay2))
    allowance = tol.allowance(1.0) + tol2.allowance(1.0)  # each input's own bound
    found = mismatch(changed, out, tol, allowance, (..., slice(0, t + 1), slice(None)))
    return agreement(f"rows 0..{t} after tokens {t + 1}..{case.n - 1} changed", found)


@check("split-resume")
def split_resume(impl: Implementation, case: Case) -> Outcome:
    """The sequence in two or three pieces through impl.stream equals one pass."""
    spec = impl.spec
    (q, k, v, w, _), x = inputs_of(case, spec)
    if impl.stream is None:
        return Outcome(True, f"{impl.name} has no state API: not applicable")
    if case.n < 2:
        return Outcome(True, "N = 1: one piece is the whole sequence")
    cuts = torch.randint(1, case.n, (2,), generator=case_generator(case, 3))
    bounds = [0, *sorted({int(c) for c in cuts}), case.n]
    tol = Tolerance.of(x, spec)
    whole = as_array(impl(q, k, v, w))
    try:
        piece = impl.stream(case.n, w)
        parts = [piece(*(t[..., a:b, :] for t in (q, k, v))) for a, b in itertools.pairwise(bounds)]
        pieces = as_array(torch.cat(parts, dim=-2))
    except Exception as err:  # the stream's failure is a finding
        return Outcome(False, f"the stream raised {type(err).__name__}: {err}")
    if pieces.shape != whole.shape:
        return Outcome(False, f"pieces gave shape {pieces.shape}, one pass {whole.shape}")
    split = ", ".join(f"{a}:{b}" for a, b in itertools.pairwise(bounds))
    return agreement(
        f"pieces [{split}] against one pass", mismatch(pieces, whole, tol, tol.allowance())
    )
