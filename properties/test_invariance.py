"""Invariances: linearity and affine invariance in V, permutation equivariance
(non-causal, position-free maps), batch and head independence, layout and strides."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check


@pytest.mark.check("v-affine")
@PROPERTY
@given(data=st.data())
def test_v_affine(impl, device, data):
    assert_passes(run_check("v-affine", impl, device, data))


@pytest.mark.check("permutation")
@PROPERTY
@given(data=st.data())
def test_permutation(impl, device, data):
    assert_passes(run_check("permutation", impl, device, data))


@pytest.mark.check("batch-head")
@PROPERTY
@given(data=st.data())
def test_batch_head_independence(impl, device, data):
    assert_passes(run_check("batch-head", impl, device, data))


@pytest.mark.check("layout")
@PROPERTY
@given(data=st.data())
def test_layout_and_strides(impl, device, data):
    assert_passes(run_check("layout", impl, device, data))
