"""The gradient check at length (checks/gradient_length.py): its lengths, what it covers,
and a correct built-in form passing it (the zoo's long_backward.py holds a broken one)."""

from __future__ import annotations

from linattn_verify.checks.gradient_length import gradient_length, lengths, not_applicable
from linattn_verify.under_test import resolve


def test_lengths_are_powers_of_four_from_256_and_the_longest():
    assert lengths() == (256, 1024, 4096)
    assert lengths(1024) == (256, 1024)
    assert lengths(5000) == (256, 1024, 4096, 5000)


def test_it_covers_the_unnormalised_identity_specs():
    gla = resolve(form="chunked", feature_map="identity", causal=True, normalize=False,
                  decay="channel-gates")  # fmt: skip
    assert not_applicable(gla, ("float32",)) is None
    assert "float64 only" in not_applicable(gla, ("float64",))
    elu = resolve(form="chunked", feature_map="elu", causal=True)
    assert "unnormalised identity" in not_applicable(elu, ("float32",))


def test_the_built_in_chunked_form_passes_at_length():
    impl = resolve(form="chunked", feature_map="identity", causal=True, normalize=False,
                   scale="d^-0.5", decay="gates")  # fmt: skip
    result = gradient_length(impl, ("float32",), longest=1024)
    assert result.passed, result.message
    # dg's computed sums reach M(dg) (the sum of what dg is computed from) by far: one
    # rounding of M is more than a careful float32 evaluation errs
    assert result.figures["max_error_dg float32 N=1024"] < 1.0
