"""The calling contract: output shape, dtype and device; inputs untouched."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check


@pytest.mark.check("contract")
@PROPERTY
@given(data=st.data())
def test_contract(impl, device, data):
    assert_passes(run_check("contract", impl, device, data))
