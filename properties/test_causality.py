"""Causal specs: later tokens never change earlier outputs; pieces equal one pass."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check


@pytest.mark.check("causality")
@PROPERTY
@given(data=st.data())
def test_causality(impl, device, data):
    assert_passes(run_check("causality", impl, device, data))


@pytest.mark.check("split-resume")
@PROPERTY
@given(data=st.data())
def test_split_and_resume(impl, device, data):
    assert_passes(run_check("split-resume", impl, device, data))
