"""Agreement: with the exact reference (accuracy model: bound and budget) and between the
associations (phi(Q) phi(K)^T) V and phi(Q) (phi(K)^T V), every chunk size included."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from property_helpers import PROPERTY, assert_passes, run_check

from linattn_verify.under_test import resolve


@pytest.mark.check("reference")
@PROPERTY
@given(data=st.data())
def test_reference_agreement(impl, device, data):
    assert_passes(run_check("reference", impl, device, data))


def _other_forms(impl, case):
    """For the built-in chunked forms: every chunk size from 1 to N + 1 (ragged tails,
    N < chunk) and the recurrent form; nothing else for other implementations."""
    if impl.source.kind != "form" or impl.source.name != "chunked":
        return ()
    chunked = [resolve(form="chunked", chunk_size=c, spec=impl.spec) for c in range(1, case.n + 2)]
    return [*chunked, resolve(form="recurrent", spec=impl.spec)]


@pytest.mark.check("associativity")
@PROPERTY
@given(data=st.data())
def test_associativity(impl, device, data):
    assert_passes(run_check("associativity", impl, device, data, others=_other_forms))
