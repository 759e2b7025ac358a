"""The long-context check's reference (checks/long_context.py, _standard): settled by arb in
the rows it judges by their value (the budget's, those of a finite bound, those near the
dtype's range), left at the certified float64 pass's value, within its bound, in the rows
judged only for finiteness (performer-trig's cancelling denominators at long N)."""

from __future__ import annotations

import numpy as np
import pytest

from linattn_verify.accuracy.verdict import judge
from linattn_verify.checks import long_context as lc
from linattn_verify.families import exact, family_of, validate
from linattn_verify.families.decayed.forms import decayed_attention
from linattn_verify.reference import certified_engine as engine
from linattn_verify.specs import RSQRT_D, Spec

SPEC = Spec("performer-trig", causal=True, decay="gates", scale=RSQRT_D)
N = 257
SHARE = 1e-11  # below the largest bound / s of the judged rows: some go to arb


@pytest.fixture
def fresh(monkeypatch):
    """The check's kept standards cleared before and after (they depend on the share)."""

    def clear():
        for kept in (lc._standard, lc._reference_and_golden, lc._drawn):
            kept.cache_clear()

    clear()
    monkeypatch.setattr(engine, "CERTIFIED_SHARE", SHARE)
    yield
    clear()


def test_only_the_rows_judged_by_their_value_are_settled(fresh):
    draw = lc.Draw(SPEC, "float16", 1, 2, 16, N, 2, "cpu")
    q, k, v, w, decay = draw.tensors(N)
    x = validate(q, k, v, SPEC, w, decay)
    ref, golden, bounds, resolvable = lc.standard(draw, N)
    kept = lc._reference_and_golden(draw)[0]  # the float64 pass, settled in place
    unjudged = ~resolvable[..., 0] & np.isinf(bounds["float16"][1]).all(axis=-1)
    assert unjudged.any()  # this draw has a row whose denominator cancels past float16
    exact_values = exact(x, SPEC, "arb")
    err = np.abs(ref - exact_values)
    share = SHARE * kept.scale
    before = engine.certified_attention(
        x, SPEC, family_of(SPEC).similarity, settle=np.zeros(x.shape[:3], dtype=bool)
    )
    assert (before.bound[~unjudged] > share[~unjudged]).any(axis=-1).sum() > 1
    assert np.all(kept.bound[~unjudged] <= share[~unjudged])  # those went to arb
    assert np.all(err[~unjudged] <= kept.bound[~unjudged])
    # the unjudged row: the float64 pass's, which the full engine would have settled
    assert np.array_equal(kept.bound[unjudged], before.bound[unjudged])
    assert (kept.bound[unjudged] > share[unjudged]).any()
    assert np.all(err[unjudged] <= kept.bound[unjudged])
    out = decayed_attention(q, k, v, SPEC, "chunked", w, decay=decay)[0]
    full = engine.certified_attention(x, SPEC, family_of(SPEC).similarity)
    got, want = (judge(out, x, SPEC, r, golden, None, resolvable) for r in (ref, full.values))
    assert got.passed and want.passed
    assert got.budget == want.budget and got.bound_violations == want.bound_violations == 0


def test_a_row_left_to_the_bound_is_judged_by_its_value_where_the_bound_is_finite():
    """_judged_rows: the budget's rows; else a finite bound in the dtype, or exact values
    that may lie on either side of its range (float16's 65504), need the settled value."""
    values = np.array([1.0, 1.0, 65500.0, 1.0])[None, None, :, None]
    bound = np.array([1e-9, 1e-9, 8.0, 1e-9])[None, None, :, None]
    ref = engine.Certified(values, bound, np.ones_like(values))
    resolvable = np.array([True, False, False, False])[None, None, :, None]
    dtype_bound = np.array([np.inf, 3.0, np.inf, np.inf])[None, None, :, None]
    got = lc._judged_rows(ref, resolvable, dtype_bound, "float16")
    assert got.tolist() == [[[True, True, True, False]]]
