"""Metamorphic properties: changes of the input with a known effect on the exact output.

Each compares two outputs of the implementation within the sum of their a-priori bounds
(core.py), so only a real change of what is computed fails them:
- v-affine: out(a V + c) = a out(V) + c (a = -2, c a power of two near max |v|; with
  eps > 0 only c = 0 holds). a V + c is rounded to the dtype: that rounding moves the exact
  output by at most u s' more, which the allowance adds. A decay (the same for both) keeps
  the output a weighted mean of v, so it holds for decayed specs too;
- permutation (non-causal, position-free maps): out(P q, S k, S v) = P out(q, k, v) for
  permutations P of the queries and S of the keys;
- batch-head: each (b, h) computed alone, with its own slice of the decay (gamma_h, or
  the log-gates g[b, h]), equals its slice of the batched output;
- layout: non-contiguous inputs (a strided slice, memory in another dimension order) give
  the output of contiguous ones (the same decay, log-gates in the implementation's layout).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..cases import Case
from ..families import validate
from ..under_test import Implementation
from .compare import Tolerance, agreement, mismatch
from .core import Outcome, as_array, case_generator, check, decay_part, inputs_of


@check("v-affine")
def v_affine(impl: Implementation, case: Case) -> Outcome:
    """out(a V + c) = a out(V) + c, a = -2 and c = 2^(ceil(log2 max|v|) + 1) (c = 0 if eps > 0),
    both with the case's decay."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    top = float(np.abs(x.v).max())
    c = 0.0 if spec.eps > 0 or top == 0 else 2.0 ** (math.ceil(math.log2(top)) + 1)
    a = -2.0
    wide = v.double() * a + c
    if wide.abs().max() > torch.finfo(v.dtype).max:
        return Outcome(True, f"a V + c overflows {case.dtype}: not applicable to this case")
    v2 = wide.to(v.dtype)
    x2 = validate(q, k, v2, spec, w, decay)
    tol, tol2 = Tolerance.of(x, spec), Tolerance.of(x2, spec)
    out = as_array(impl(q, k, v, w, decay))
    out2 = as_array(impl(q, k, v2, w, decay))
    # out2's bound, |a| times out's, one u s' for rounding a V + c, and float64's own
    allowance = tol2.allowance(1.0) + abs(a) * tol.allowance(1.0) + tol2.u * tol2.scale
    # a out is exact (a power of two); adding c rounds once in float64: 2^-53 |a out + c|
    allowance = allowance + 2.0**-53 * (np.abs(a * out) + c)
    found = mismatch(out2, a * out + c, tol2, allowance)
    return agreement(f"out({a:g} V + {c:g}) against {a:g} out(V) + {c:g}", found)


@check("permutation")
def permutation(impl: Implementation, case: Case) -> Outcome:
    """Permuting keys with values leaves outputs unchanged; permuting queries permutes them."""
    spec = impl.spec
    (q, k, v, w, _), x = inputs_of(case, spec)
    gen = case_generator(case, 1)
    p, s = (torch.randperm(case.n, generator=gen).to(q.device) for _ in range(2))
    tol = Tolerance.of(x, spec)
    out = as_array(impl(q, k, v, w))
    moved = as_array(impl(q[..., p, :], k[..., s, :], v[..., s, :], w))
    order = p.cpu().numpy()
    tol_p = Tolerance(tol.scale[..., order, :], tol.bound[..., order, :], tol.u)
    found = mismatch(moved, out[..., order, :], tol_p, tol_p.allowance())
    return agreement("queries permuted by P, keys and values by S, against P out", found)


@check("batch-head")
def batch_head(impl: Implementation, case: Case) -> Outcome:
    """Each (b, h) alone, with its slice of the decay (gamma[h], g[b, h]), equals its slice
    of the batched result."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    tol = Tolerance.of(x, spec)
    out = as_array(impl(q, k, v, w, decay))
    alone = np.empty_like(out)
    for b in range(case.b):
        for h in range(case.h):
            at = (slice(b, b + 1), slice(h, h + 1))
            one = (t[at] for t in (q, k, v))
            alone[at] = as_array(impl(*one, w, decay_part(decay, *at)))
    return agreement(
        "each (b, h) alone against the batched output", mismatch(alone, out, tol, tol.allowance())
    )


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values, every other element of a buffer twice as wide."""
    wide = torch.full(
        (*t.shape[:-1], 2 * t.shape[-1]), float("nan"), dtype=t.dtype, device=t.device
    )
    wide[..., ::2] = t
    return wide[..., ::2]


def _reordered(t: torch.Tensor) -> torch.Tensor:
    """The same values, laid out in memory in reverse dimension order."""
    return t.permute(3, 2, 1, 0).contiguous().permute(3, 2, 1, 0)


@check("layout")
def layout(impl: Implementation, case: Case) -> Outcome:
    """Non-contiguous inputs (in the implementation's own layout) give the contiguous output,
    with the same decay."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    tol = Tolerance.of(x, spec)
    native = [impl.to_layout(t).contiguous() for t in (q, k, v)]
    out = as_array(impl(q, k, v, w, decay))  # the contiguous output, its shape checked
    for name, make in (("strided", _strided), ("reordered", _reordered)):
        got = impl.call_raw(*(make(t) for t in native), w, decay)
        if got.shape != native[0].shape[:-1] + native[2].shape[-1:]:
            return Outcome(False, f"{name} inputs gave shape {tuple(got.shape)}")
        found = mismatch(as_array(impl.to_layout(got)), out, tol, tol.allowance())
        if found is not None:
            return agreement(f"{name} (non-contiguous) inputs against contiguous ones", found)
    return Outcome(True, "strided and reordered inputs give the contiguous output")
