"""Verdicts a kernel author can act on: the regimes, the bound's feature models, the budget's
floor, findings and their ranking, the exit policy and the envelope."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn_verify.accuracy import BUDGET_FLOOR, Judgement, attainable_floor
from linattn_verify.accuracy.bound import feature_model
from linattn_verify.cases import Case
from linattn_verify.families import golden_attention, validate
from linattn_verify.families.kernelised import features
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.regimes import ELU_ROW_FLOOR, REGIMES, regime_of
from linattn_verify.specs import Spec
from linattn_verify.strategies import cases, corner_cases
from linattn_verify.under_test import resolve
from linattn_verify.vet import VetOptions, VetReport, vet_in_process
from linattn_verify.vet.envelope import envelope
from linattn_verify.vet.findings import findings
from tests.zoo import delta as zoo_delta
from tests.zoo import textbook

ELU = Spec("elu")


@pytest.mark.parametrize(
    ("case", "regime"),
    [
        (Case(1, 2, 9, 16, 2, "float32", "normal", 1.0, 3), "typical"),
        (Case(1, 2, 9, 16, 2, "float32", "mean-values", 3.0, 3), "typical"),
        (Case(1, 2, 9, 16, 2, "float32", "outlier-channels", 0.5, 3), "typical"),
        (Case(1, 2, 9, 16, 2, "float32", "identical", 1.0, 3), "stress"),
        (Case(1, 2, 9, 16, 2, "float32", "normal", 5.0, 3), "stress"),  # beyond a few units
        (Case(1, 2, 9, 16, 2, "float32", "normal", 10.0, 3), "extreme"),  # elu's range edge
        (Case(1, 2, 9, 16, 2, "float16", "normal", 1e-3, 3), "extreme"),  # products underflow
        (Case(1, 2, 9, 16, 2, "float32", "negative-rows", 1e6, 3), "extreme"),
    ],
)
def test_each_case_is_in_the_regime_its_values_say(case, regime):
    assert regime_of(case, ELU) == regime


def test_an_elu_row_whose_every_feature_is_small_is_stress():
    case = Case(1, 1, 40, 1, 1, "float64", "normal", 1.0, 0)  # d = 1: rows of one coordinate
    q, k, _, _ = case.tensors()
    assert float(torch.cat([q, k], -2).min()) < ELU_ROW_FLOOR
    assert regime_of(case, ELU) == "stress" and regime_of(case, Spec("relu")) == "typical"


@settings(max_examples=30)
@given(data=st.data(), regime=st.sampled_from(REGIMES), name=st.sampled_from(["elu", "softmax"]))
def test_a_regime_s_strategy_draws_its_regime_only(data, regime, name):
    spec = Spec(name)
    case = data.draw(cases(spec, regimes=(regime,)))
    assert regime_of(case, spec) == regime


def test_every_regime_has_corner_cases_and_each_corner_one_regime():
    for spec in (ELU, Spec("performer-positive"), Spec("softmax", causal=True)):
        corners = corner_cases(spec)
        split = [corner_cases(spec, regimes=(r,)) for r in REGIMES]
        assert all(split) and sum(map(len, split)) == len(corners)


def _all_negative_rows():
    """float32 inputs whose query and key rows are entirely negative (-10 ... -8)."""
    g = torch.Generator().manual_seed(5)
    q, k = (-8 - 2 * torch.rand(1, 1, 8, 3, generator=g) for _ in range(2))
    return q, k, torch.randn(1, 1, 8, 2, generator=g)


def test_the_standard_bound_admits_textbook_elu_and_the_relative_one_does_not():
    """F.elu(x) + 1 = (exp(x) - 1) + 1 has an absolute feature error (accuracy/bound.py)."""
    q, k, v = _all_negative_rows()
    x = validate(q, k, v, ELU)
    out = textbook.elu_einsum(q, k, v)
    standard = Judgement.of(q, k, v, None, ELU)(out)
    with feature_model("relative"):
        relative = Judgement.of(q, k, v, None, ELU)(out)
    assert standard.within_bound and not relative.within_bound, (standard.message, relative.message)
    assert relative.max_error == standard.max_error and x.shape[2] == 8


def _draws(*shape: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(*shape, generator=torch.Generator().manual_seed(i)) for i in range(3))


def test_the_budget_floor_is_the_typical_error_of_sqrt_n_roundings():
    q, k, v = (
        torch.randn(1, 1, 24, 7, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    x = validate(q, k, v, ELU)
    assert attainable_floor(ELU, x, UNIT_ROUNDOFF["float32"]) == pytest.approx(
        math.sqrt(7 + 24 + 1)
    )
    assert attainable_floor(ELU, x, UNIT_ROUNDOFF["float16"]) == BUDGET_FLOOR  # float32 compute


def test_a_fault_in_the_fast_path_cannot_move_the_budget(monkeypatch):
    q, k, v = (
        torch.randn(1, 2, 9, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    before = golden_attention(q, k, v, ELU, form="linear")
    monkeypatch.setattr(features, "exp", lambda t: torch.exp(t) * 1.5)  # the fast forms' exp
    assert torch.equal(golden_attention(q, k, v, ELU, form="linear"), before)


def _row(name, regime, severity="wrong", case="normal", share=None):
    c = Case(1, 1, 4, 2, 2, "float32", case, 1.0, 0).to_json() if case else None
    figures = {} if share is None else {"relative_error": share}
    return {"name": name, "status": "fail", "detail": name, "case": c, "regime": regime,
            "severity": severity, "figures": figures}  # fmt: skip


def test_findings_group_a_shared_cause_and_rank_what_matters_first():
    rows = [
        _row("positivity", "extreme", case="negative-rows"),
        _row("accuracy float32", "typical", "inaccurate", share=1e-5),
        _row("reference", "typical", "inaccurate", share=2e-5),
        _row("associativity", "typical"),  # same case: the finding is wrong
        _row("scaling", None, case=None),
        {"name": "layout", "status": "pass", "detail": ""},
    ]
    found = findings(rows)
    assert [f.checks for f in found] == [
        ("accuracy float32", "reference", "associativity"),
        ("scaling",),
        ("positivity",),
    ]
    assert found[0].severity == "wrong" and found[0].largest_error == 2e-5
    assert found[0].relative_error == 1e-5  # the shown row's, the one its body gives
    assert [f.regime for f in found] == ["typical", "typical", "extreme"]


def test_the_policy_fails_typical_findings_and_warns_about_the_others():
    assert VetOptions().failing_regimes == ("typical",)
    assert VetOptions(fail_on="stress").failing_regimes == ("typical", "stress")
    assert VetOptions(strict=True).failing_regimes == REGIMES
    impl = resolve(textbook.elu_einsum, feature_map="elu")
    report = vet_in_process(impl, VetOptions(dtypes=("float32",), envelope=False, longest=0))
    assert report.verdict == "pass" and report.findings, report.summary()
    assert "robustness warning" in report.summary()
    strict = vet_in_process(
        impl, VetOptions(dtypes=("float32",), envelope=False, strict=True, longest=0)
    )
    assert strict.verdict == "fail"


def test_the_envelope_brackets_where_a_kernel_stops_holding():
    def holds_below_ten(q, k, v):
        out = textbook.elu_einsum(q, k, v)
        return out if float(q.abs().max()) < 10 else torch.zeros_like(out)

    (row,) = envelope(resolve(holds_below_ten, feature_map="elu"), "cpu", ("float64",))
    low, high = row["figures"]["low"], row["figures"]["high"]
    # sigma is the scale of N(0, sigma^2) draws whose largest of 2 x 17 x 8 entries is ~3 sigma
    assert low <= 1e-3 and 10 / 5 < high < 10, row["detail"]
    assert "above" in row["detail"] and np.isfinite(high)


def test_the_envelope_says_what_sigma_scales_for_the_spec():
    """Issue 51, item 9: "envelope: does not hold at sigma = 1" said nothing of what sigma
    is. For the delta rule it scales q alone: its keys are unit vectors and beta is drawn in
    (0, 1) whatever sigma; a kernel that breaks on large keys or beta therefore holds over
    the whole span, one that breaks on large queries stops below them, and the line says so.
    For elu it scales q and k."""
    spec = Spec("identity", causal=True, normalize=False, delta_rule=True)

    def breaks_above(limit_q: float, limit_k: float, limit_beta: float):
        def kernel(q, k, v, beta):
            large = q.abs().max() > limit_q or k.abs().max() > limit_k or beta.max() > limit_beta
            out = zoo_delta.delta_recurrent(q, k, v, beta)
            return torch.zeros_like(out) if large else out

        return envelope(resolve(kernel, spec=spec), "cpu", ("float64",))[0]

    unscaled = breaks_above(math.inf, 1.5, 1.5)  # a unit key has no coordinate above 1
    assert unscaled["figures"]["high"] == pytest.approx(1e4), unscaled["detail"]
    scaled = breaks_above(10, math.inf, math.inf)
    assert scaled["figures"]["high"] < 10, scaled["detail"]
    line = summary_line(VetReport("t", "i", str(spec), [scaled]))
    said = line.split("(sigma: ", 1)[1]
    assert said.startswith("the standard deviation of q's coordinates;"), line
    assert "k, v and beta not scaled" in said, line

    (elu,) = envelope(resolve(textbook.elu_einsum, feature_map="elu"), "cpu", ("float32",))
    line = summary_line(VetReport("t", "i", "elu", [elu]))
    assert "(sigma: the standard deviation of q's and k's coordinates; v not scaled): " in line
    assert "holds for sigma in float32 " in line, line


def summary_line(report: VetReport) -> str:
    (line,) = [x for x in report.summary().splitlines() if x.startswith("envelope")]
    return line
