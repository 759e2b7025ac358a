"""Packed batches (--varlen; linattn_verify/checks/varlen.py) of every built-in spec and
form: each packed sequence, empty and one-token ones among them, equals its own run."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check

# each example runs five sequences, each with its own bound: a quarter of the examples
PACKED = settings(PROPERTY, max_examples=max(4, PROPERTY.max_examples // 4))


@pytest.mark.check("varlen")
@PACKED
@given(data=st.data())
def test_each_packed_sequence_equals_its_own_run(impl, device, data):
    assert_passes(run_check("varlen", impl, device, data))
