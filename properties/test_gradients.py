"""The backward pass: for L = sum(out * G), dq, dk, dv against the exact reference gradients
(bound and budget), causality of the gradients (causal specs), agreement with the golden
forms' backward, and finiteness. One test draws a case and runs every gradient check that
applies on it, so the exact gradients are computed once per case."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check

from linattn_verify.checks import GRAD_CHECKS, not_applicable
from linattn_verify.checks.search import GRADIENT_LEAST, GRADIENT_SHARE, property_examples

GRAD_EXAMPLES = property_examples(GRADIENT_SHARE, GRADIENT_LEAST)


@pytest.mark.check("gradient")
@settings(PROPERTY, max_examples=GRAD_EXAMPLES)
@given(data=st.data())
def test_gradients(impl, device, data):
    names = [n for n in GRAD_CHECKS if not not_applicable(n, impl)]
    first = run_check(names[0], impl, device, data)
    assert_passes(first)
    for name in names[1:]:
        assert_passes(GRAD_CHECKS[name](impl, first.case))
