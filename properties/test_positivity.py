"""Positive denominators and finite outputs (every dtype, adversarial magnitudes), and
outputs in the convex hull of the values for positive kernels.

relu and cosformer (a query with no positive similarity: denominator 0), performer-trig
(sin/cos features) and identity (q . k) (a negative denominator) violate positivity by
nature;
test_positivity_by_nature shows a counterexample for each as an expected failure, and
test_positivity still fails them on any non-finite output where the exact denominator is
positive.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check

BY_NATURE = {
    "relu": "relu features are 0 on negative coordinates: a query with no positive "
    "similarity to any key has denominator exactly 0 (0/0)",
    "performer-trig": "sin/cos random features are signed: the estimated denominator "
    "can be 0 or negative",
    "cosformer": "relu(q_i).relu(k_j) cos(...) is 0 when no key shares a positive "
    "coordinate with the query: denominator exactly 0 (0/0)",
    "identity": "q . k is signed: the denominator q_i . sum_j k_j can be 0 or negative",
}


@pytest.mark.check("positivity")
@PROPERTY
@given(data=st.data())
def test_positivity(impl, device, data):
    result = run_check("positivity", impl, device, data)
    if result.by_nature and impl.spec.feature_map in BY_NATURE:
        return  # shown by test_positivity_by_nature; finite outputs were still checked
    assert_passes(result)


@pytest.mark.check("positivity", impls_filter=lambda i: i.spec.feature_map in BY_NATURE)
def test_positivity_by_nature(impl, device):
    """A counterexample for the maps whose denominator is not positive: found, shown, and
    reported as an expected failure with the reason."""
    from linattn_verify.checks.search import find_failure

    result = find_failure("positivity", impl, device=device, nature=True)
    assert result is not None and result.by_nature, (
        f"no counterexample to positivity found for {impl.spec.feature_map}, which has one "
        "by nature: the strategies no longer reach it"
    )
    pytest.xfail(f"{BY_NATURE[impl.spec.feature_map]}. Counterexample: {result.report()}")


@pytest.mark.check("convex-hull")
@PROPERTY
@given(data=st.data())
def test_convex_hull(impl, device, data):
    assert_passes(run_check("convex-hull", impl, device, data))
