"""The gradient check at length (checks/gradient_length.py): its lengths, what it covers,
correct forms passing it, and the normalised backward with its normaliser squared in the
input dtype failing it at its first N (the zoo's long_backward.py holds both, and a broken
state gradient that vet's zoo run rejects)."""

from __future__ import annotations

from linattn_verify.checks.gradient_length import (
    default_longest,
    gradient_length,
    lengths,
    not_applicable,
)
from linattn_verify.under_test import resolve
from tests.zoo.delta_backward import SEGMENT, adjoint_reset, hand_backward
from tests.zoo.long_backward import plain_hand_backward, plain_square_narrow
from tests.zoo.taylor_backward import SEGMENT as TAYLOR_SEGMENT
from tests.zoo.taylor_backward import taylor_backward, taylor_segment_reset


def test_lengths_are_powers_of_four_from_256_and_the_longest():
    assert lengths() == (256, 1024, 4096)
    assert lengths(1024) == (256, 1024)
    assert lengths(5000) == (256, 1024, 4096, 5000)


def test_it_covers_every_spec_and_says_why_not_for_float64_alone():
    gla = resolve(form="chunked", feature_map="identity", causal=True, normalize=False,
                  decay="channel-gates")  # fmt: skip
    deltanet = dict(feature_map="identity", causal=True, normalize=False, delta_rule=True)
    covered = (
        gla,
        resolve(form="chunked", feature_map="elu", causal=True),
        resolve(form="recurrent", feature_map="relu", causal=True, decay="constant"),
        resolve(form="recurrent", decay="gates", **deltanet),
        resolve(form="chunked", feature_map="performer-positive", causal=True),
        resolve(form="linear", feature_map="elu"),
        resolve(form="chunked", feature_map="performer-trig", causal=True),
        resolve(form="linear", feature_map="performer-hyperbolic"),
        resolve(form="recurrent", feature_map="cosformer", causal=True),
        resolve(form="chunked", feature_map="taylor", causal=True, normalize=False),
        resolve(form="chunked", feature_map="identity", causal=True),
        resolve(form="quadratic", feature_map="softmax", causal=True),
    )
    assert all(not_applicable(impl, ("float32",)) is None for impl in covered)
    assert "float64 only" in not_applicable(gla, ("float64",))
    # shorter by default where its backwards are token loops or quadratic
    assert default_longest(False, gla.spec) == 4096
    assert default_longest(False, resolve(form="recurrent", decay="gates", **deltanet).spec) == 1024
    assert default_longest(False, covered[-1].spec) == 1024


def test_the_built_in_chunked_form_passes_at_length():
    impl = resolve(form="chunked", feature_map="identity", causal=True, normalize=False,
                   scale="d^-0.5", decay="gates")  # fmt: skip
    result = gradient_length(impl, ("float32",), longest=1024)
    assert result.passed, result.message
    # dg's computed sums reach M(dg) (the sum of what dg is computed from) by far: one
    # rounding of M is more than a careful float32 evaluation errs
    assert result.figures["max_error_dg float32 N=1024"] < 1.0


def test_a_normalised_backward_by_hand_passes_and_its_narrow_square_fails_at_256():
    """The quotient rule by hand (tests/zoo/long_backward.py): right with D^2 in float32;
    D^2 in float16 overflows once D passes 256, some 12 tokens into the long draw."""
    right = resolve(plain_hand_backward, feature_map="elu", causal=True)
    result = gradient_length(right, ("float16", "float32"), longest=1024)
    assert result.passed, result.message
    narrow = resolve(plain_square_narrow, feature_map="elu", causal=True)
    result = gradient_length(narrow, ("float16",), longest=1024)
    assert not result.passed and "float16: fails from N = 256" in result.message


def test_a_delta_rule_adjoint_dropped_every_512_tokens_fails_past_them():
    """The zoo's hand-written delta-rule backward with its adjoint dropped every SEGMENT
    tokens: exact to SEGMENT, so gradient-length passes it to 256 and fails it at 1024; its
    correct twin passes at 1024."""
    claim = dict(feature_map="identity", causal=True, normalize=False, delta_rule=True,
                 decay="gates")  # fmt: skip
    right = resolve(hand_backward, **claim)
    assert gradient_length(right, ("float32",), longest=1024).passed
    impl = resolve(adjoint_reset, **claim)
    assert gradient_length(impl, ("float32",), longest=SEGMENT // 2).passed
    result = gradient_length(impl, ("float32",), longest=1024)
    assert not result.passed and "float32: fails from N = 1024" in result.message


def test_a_taylor_backward_whose_key_sums_reset_every_512_tokens_fails_past_them():
    """The zoo's Taylor (Based) kernel with dk and dv from the queries of their own
    SEGMENT tokens alone (tests/zoo/taylor_backward.py): exact to SEGMENT, so gradient-
    length passes it to 256 and fails it at 1024 (dk, dv far above the bound); its correct
    twin passes at 1024: the newly certified maps' backward at length bites."""
    right = resolve(taylor_backward, feature_map="taylor", causal=True)
    assert gradient_length(right, ("float16", "float32"), longest=1024).passed
    impl = resolve(taylor_segment_reset, feature_map="taylor", causal=True)
    assert gradient_length(impl, ("float32",), longest=TAYLOR_SEGMENT // 2).passed
    result = gradient_length(impl, ("float32",), longest=1024)
    assert not result.passed and "float32: fails from N = 1024" in result.message
    assert "EXCEEDED by dk, dv" in result.message
