"""The carried state (--state; linattn_verify/checks/state.py) of every built-in form that
carries one: pieces equal one pass, an exact prefix state continues the sequence, the final
state is within its bound of the exact one."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check


def _judged(name, impl, device, data):
    """The check's result, unless the exact state is beyond what a state in true units of
    the kernel's dtype holds (overflow, or key sums below its smallest normal): by nature."""
    result = run_check(name, impl, device, data)
    if not result.by_nature:
        assert_passes(result)


@pytest.mark.check("state-split")
@PROPERTY
@given(data=st.data())
def test_pieces_with_the_state_carried_equal_one_pass(impl, device, data):
    _judged("state-split", impl, device, data)


@pytest.mark.check("initial-state")
@PROPERTY
@given(data=st.data())
def test_an_exact_prefix_state_continues_the_sequence(impl, device, data):
    _judged("initial-state", impl, device, data)


@pytest.mark.check("final-state")
@PROPERTY
@given(data=st.data())
def test_the_final_state_is_within_its_bound(impl, device, data):
    _judged("final-state", impl, device, data)
