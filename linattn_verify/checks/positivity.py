"""Properties of positive kernels: a positive denominator and outputs in the convex hull.

- positivity: phi(q_i).Z_i + eps > 0 exactly (from the arb engine; Z_i = sum_j w_ij
  phi(k_j) with a decay w_ij) and no NaN/inf in the output for finite inputs. relu and
  cosformer (a row with no positive similarity has denominator 0) and performer-trig
  (sin/cos features: the denominator can be negative) violate it by nature: the check
  fails with `by_nature` set and the row that shows it;
- convex hull: for positive kernels out_ic = sum_j a_ij v_jc / sum_j a_ij lies within
  [min_j v_jc, max_j v_jc] over the keys row i sees, up to the a-priori bound (a decay
  w_ij > 0 leaves the weights a_ij w_ij positive; with eps > 0 the weights sum to less
  than 1: the hull of the values and 0).
"""

from __future__ import annotations

import numpy as np
import torch

from ..cases import Case
from ..families import family_of
from ..reference.arb import arb_denominator_signs
from ..under_test import Implementation
from .compare import Tolerance, mismatch
from .core import Outcome, as_array, check, first_marked, inputs_of


@check("positivity")
def positivity(impl: Implementation, case: Case) -> Outcome:
    """The output (with the case's decay) is finite where the exact denominator is positive,
    and every exact denominator is positive (a spec that violates that fails by nature)."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    signs = arb_denominator_signs(x, spec, family_of(spec).similarity)
    out = as_array(impl(q, k, v, w, decay))
    demanded = np.broadcast_to((signs > 0)[..., None], out.shape)
    if not spec.info.positive:  # a signed kernel's output may leave the dtype's range:
        # finite is demanded only where |out| <= s fits it (positive kernels: within max |v|)
        top = float(torch.finfo(q.dtype).max)
        with np.errstate(invalid="ignore"):
            demanded = demanded & (Tolerance.of(x, spec).scale <= top)
    if (marked := first_marked(~np.isfinite(out) & demanded)) is not None:
        count, at = marked
        return Outcome(
            False,
            f"{count} non-finite output element(s), e.g. {out[at]} at "
            f"(b, h, i, c) = {at}, where the exact denominator is positive",
            # the element shown, for naming its cause (vet/causes.py)
            {"non_finite": float(count), "worst_index": list(at), "worst_output": float(out[at])},
        )
    if (signs <= 0).any():
        row = tuple(int(t) for t in np.argwhere(signs <= 0)[0])
        what = "zero" if signs[row] == 0 else "negative"
        reason = (
            f"{spec.feature_map}: the exact denominator eps + sum_j sim(q_i, k_j) is {what} "
            f"at (b, h, i) = {row} (outputs are finite wherever it is positive and fits)"
        )
        return Outcome(False, reason, {"non_positive_rows": float((signs <= 0).sum())}, reason)
    return Outcome(True, "every exact denominator is positive and every output finite")


@check("convex-hull")
def convex_hull(impl: Implementation, case: Case) -> Outcome:
    """Every output (with the case's decay) within [min_j v_j, max_j v_j] per coordinate
    over the visible keys."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    tol = Tolerance.of(x, spec)
    out = as_array(impl(q, k, v, w, decay))
    vals = x.v
    if spec.causal:
        lo, hi = np.minimum.accumulate(vals, axis=2), np.maximum.accumulate(vals, axis=2)
    else:
        lo = np.broadcast_to(vals.min(axis=2, keepdims=True), out.shape)
        hi = np.broadcast_to(vals.max(axis=2, keepdims=True), out.shape)
    if spec.eps > 0:
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    nearest = np.clip(out, lo, hi)  # out itself when inside; NaN stays NaN
    found = mismatch(out, nearest, tol, tol.allowance(times=1.0))
    if found is None:
        return Outcome(True, "every output lies in the convex hull of the values it sees")
    return Outcome(
        False,
        found.describe("outside the convex hull of the visible values"),
        {"units": found.units, "allowed": found.allowed},
    )
