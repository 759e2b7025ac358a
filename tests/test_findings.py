"""Findings a kernel author can act on: failures of one feature-level cause, across checks and
dtypes, are one finding that names the cause and where it starts (vet/causes.py), derived
from the dtype's unit roundoff or range and the failing rows, not a picked number; a cost, a
sampler and the rate are findings of their own words, each with a command that reproduces
it; what no namer can show stays grouped by its inputs."""

from __future__ import annotations

import math
import shlex

import torch

from linattn_verify.cases import Case
from linattn_verify.checks import CHECKS
from linattn_verify.cli import main
from linattn_verify.regimes import ELU_ROW_FLOOR, REGIMES
from linattn_verify.under_test import resolve
from linattn_verify.vet import tasks
from linattn_verify.vet.findings import Finding, findings
from tests import vet_targets
from tests.zoo import broken, correct, delta, textbook


def _rows(impl, checks, *cases):
    return [CHECKS[name](impl, case).to_dict() for case in cases for name in checks]


def _case(dtype, kind="normal", magnitude=10.0, d=3, m=None):
    return Case(2, 2, 9, d, 2, dtype, kind, magnitude, 1, m)


def test_elu_cancellation_in_every_dtype_and_check_is_one_finding_naming_where_it_starts():
    impl = resolve(textbook.elu_cumsum, feature_map="elu", causal=True)
    rows = _rows(impl, ("reference", "positivity", "associativity"), _case("float16"))
    rows += _rows(impl, ("reference",), _case("float32"), _case("float64"))
    (finding,) = findings(rows, impl.spec)
    assert finding.cause == "elu-expm1" and finding.regime == "extreme"
    assert set(finding.checks) == {"reference", "positivity", "associativity"}
    nan, inaccurate = finding.effects
    # the features of float16 inputs are computed in float32 (as for float32 inputs): the
    # cancellation starts at ln u of float32, where e^x drops below its unit roundoff
    assert nan.cause.compute == "float32" and nan.dtypes == ("float16", "float32")
    assert nan.cause.figures["threshold"] == math.log(2**-24)
    assert "elu(x) + 1 cancels for rows below x = -16.6 in float32: NaN where" in nan.cause.short
    assert "q[0, 0, 7] = [-37, -18.1, -18.4]" in nan.cause.detail
    # in float64 the same rows are within the bound, over the budget
    assert inaccurate.cause.effect == "inaccurate" and inaccurate.dtypes == ("float64",)
    assert inaccurate.severity == "inaccurate" and inaccurate.cause.compute == "float64"
    assert f"rows below x = {ELU_ROW_FLOOR:.3g} in float64" in inaccurate.cause.short
    assert finding.headline().startswith("wrong on extreme inputs: elu(x) + 1 cancels")


def test_a_cause_spanning_regimes_fails_a_verdict_where_its_rows_do():
    impl = resolve(textbook.elu_cumsum, feature_map="elu", causal=True)
    rows = _rows(impl, ("reference", "positivity"), _case("float16"))
    rows[0] = {**rows[0], "regime": "typical"}  # as if the reference check had failed there
    (finding,) = findings(rows, impl.spec)
    assert finding.regime == "typical" and finding.checks == ("reference", "positivity")
    assert finding.failing(("typical",)) == {"reference"}
    assert finding.failing(REGIMES) == {"reference", "positivity"}


def test_the_cancellation_is_named_in_the_precision_the_kernel_computes_in():
    impl = resolve(broken.elu_input_dtype, feature_map="elu")  # F.elu(x) + 1 in float16
    rows = _rows(impl, ("reference",), _case("float16", "dominant", 10**0.5))
    (finding,) = findings(rows, impl.spec)
    (effect,) = finding.effects
    assert effect.cause.compute == "float16" and effect.cause.effect == "inaccurate"
    assert finding.headline().startswith(
        f"inaccurate on stress inputs: elu(x) + 1 is inaccurate for rows below x = "
        f"{ELU_ROW_FLOOR:.3g} in float16"
    )


def test_an_unshifted_exponent_leaves_the_dtypes_range_where_its_limits_say():
    # FAVOR+ unstabilised in float16 on typical inputs: every weight e^(a_q + a_k) is below
    # float16's smallest subnormal (-|x'|^2/2 ~ -11 per feature), so 0/0
    impl = resolve(broken.performer_unstabilised, feature_map="performer-positive")
    case = Case(2, 2, 9, 8, 2, "float16", "normal", 2.8183829312644537, 1, 8)
    (finding,) = findings(_rows(impl, ("reference", "positivity"), case), impl.spec)
    (effect,) = finding.effects
    assert finding.cause == "exp-underflow" and effect.cause.compute == "float16"
    assert effect.cause.figures["threshold"] == math.log(2**-24)
    assert effect.cause.figures["largest"] < math.log(2**-24)
    assert finding.headline().startswith(
        "wrong on typical inputs: exp(W x' - |x'|^2/2) underflows float16 for weights below "
        "e^-16.64: NaN where the exact value is -1.03"
    )
    # softmax without its row maximum subtracted, computed in float32 for float16 inputs: a
    # logit of 97 (an outlier channel of 14) beyond ln of float32's largest value
    impl = resolve(broken.softmax_no_max_subtraction, feature_map="softmax")
    case = Case(2, 2, 9, 8, 2, "float16", "outlier-channels", 1.0, 1)
    (finding,) = findings(_rows(impl, ("reference",), case), impl.spec)
    (effect,) = finding.effects
    assert finding.cause == "exp-overflow" and effect.cause.compute == "float32"
    assert effect.cause.figures["threshold"] == math.log(torch.finfo(torch.float32).max)
    assert "exp(q.k / sqrt(d)) overflows float32 for exponents above 88.72" in finding.headline()
    assert "the largest exponent of q[1, 0, 5] = [" in effect.cause.detail


def test_a_relu_denominator_of_zero_wants_nan():
    impl = resolve(vet_targets.relu_zero_for_nan, feature_map="relu")
    case = Case(2, 2, 1, 4, 3, "float32", "normal", 1.0, 7)  # a query row with no positive share
    (finding,) = findings(_rows(impl, ("reference",), case), impl.spec)
    assert finding.cause == "relu-zero" and finding.regime == "typical"
    assert "the exact value is 0/0, the output 0, not NaN" in finding.headline()
    assert "--eps" in finding.effects[0].cause.detail


def test_what_no_namer_shows_stays_grouped_by_its_inputs():
    impl = resolve(vet_targets.ten_percent_high, feature_map="elu")
    rows = _rows(impl, ("reference", "associativity"), _case("float32", magnitude=1.0, d=16))
    (finding,) = findings(rows, impl.spec)
    assert finding.cause is None and finding.effects == ()
    assert finding.checks == ("reference", "associativity") and finding.kind == "wrong"
    assert finding.headline().startswith("wrong on typical inputs, error ")


def test_a_cost_growing_faster_than_claimed_is_a_cost_finding_with_its_command(capsys):
    impl = resolve(correct.elu_masked_quadratic, feature_map="elu", causal=True, cost="linear")
    rows = tasks.scaling(impl, "cpu", "linear")
    (finding,) = findings(rows, impl.spec)
    assert finding.kind == "cost" and finding.severity == "wrong"
    assert finding.headline().startswith("cost: claims linear cost; FLOPs grow as N^2.0")
    assert "(over N=1024..2048)" in finding.headline()
    command = shlex.split(finding.reproduce)
    assert command[:4] == ["python", "-m", "linattn_verify", "scaling"]
    assert main([*command[3:], "--quiet"]) == 1  # it counts the same growth again
    assert "FLOPs ~ N^2.0" in capsys.readouterr().out
    # a long-context check stopped by memory that grows faster than claimed: the same cost
    memory = "stopped before N = 65536: peak memory grows as N^2.00"
    rows.append({"name": "long-context", "status": "fail", "detail": memory, "cause": "cost"})
    (finding,) = findings(rows, impl.spec)
    assert finding.kind == "cost" and finding.checks == ("scaling", "long-context")
    assert finding.headline().endswith(f"(over N=1024..2048); long-context: {memory}")


def test_a_samplers_statistics_and_the_rate_on_its_draws_are_one_sampler_finding():
    sampler = {"target": "pkg:draw", "claim": "iid", "seed": 3, "draws": 4096, "shape": [64, 16]}
    rate_draws = {"target": "pkg:draw", "seed": 3, "draws": 500, "shape": ["m", 4], "m": [32, 1024]}
    rows = [
        {"name": "sampler unbiasedness", "status": "fail", "detail": "6 of 6 failed; ...",
         "sampler": sampler, "reproduce": "python -m linattn_verify random-features ..."},
        {"name": "sampler mse-formula", "status": "fail", "detail": "6 of 6 failed; ...",
         "sampler": sampler, "reproduce": "python -m linattn_verify random-features ..."},
        {"name": "rate", "status": "fail", "detail": "RMSE ... falls as m^-0.015",
         "sampler": rate_draws, "reproduce": "python -m linattn_verify vet ..."},
    ]  # fmt: skip
    (finding,) = findings(rows)
    assert finding.kind == "sampler" and finding.checks[-1] == "rate"
    assert finding.headline() == (
        "sampler: pkg:draw (claims iid rows; 4096 draws of W (64, 16) from seed 3) fails "
        "unbiasedness and mse-formula; the rate check, which drew W from it, fails too"
    )
    assert finding.reproduces == (
        "python -m linattn_verify random-features ...",
        "python -m linattn_verify vet ...",
    )
    # with the project's sampler (or one that passes), the rate is a finding of its own
    (alone,) = findings([{**rows[2], "sampler": {**rate_draws, "target": None}}])
    assert alone.kind == "rate" and alone.reproduce == "python -m linattn_verify vet ..."
    assert alone.headline().startswith(
        "rate: with W from the project's iid sampler (500 draws of (m, 4) per m, m = 32 to 1024"
    )


def test_a_hang_is_worded_as_such():
    row = {"name": "contract", "status": "fail", "detail": "hung: contract took longer than 5 s",
           "severity": "wrong", "stopped": True}  # fmt: skip
    (finding,) = findings([row])
    assert finding.kind == "hung" and finding.headline() == "hung: contract took longer than 5 s"


def test_the_known_answer_vectors_finding_has_a_command_that_runs_them_again(capsys):
    impl = resolve(vet_targets.ten_percent_high, feature_map="elu")
    (finding,) = findings(tasks.known_answers(impl, "cpu", ("float64",)), impl.spec)
    assert finding.checks == ("known-answers",) and finding.kind == "wrong"
    command = shlex.split(finding.reproduce)
    assert command[3:5] == ["known-answers", "run"]
    assert main([*command[3:], "--quiet"]) == 0  # it reports the errors; vet judges them
    assert "| elu-full-float64 | float64 | 4.07e+14 |" in capsys.readouterr().out


def test_a_defect_of_exact_arithmetic_is_put_in_the_decay_only_where_no_decay_cures_it():
    """Issue 51's newcomer case, a gate applied after the update: wrong in float64, and right
    on the same inputs with every gate 1, so its first line says the defect is in how the
    decay is applied; a kernel wrong whatever the decay (v doubled) is not said to be."""
    claim = {"feature_map": "identity", "causal": True, "normalize": False,
             "decay": "channel-gates", "delta_rule": True}  # fmt: skip
    case = Case(1, 2, 5, 4, 3, "float64", "normal", 1.0, 7)

    def v_doubled(q, k, v, beta, g):
        return delta.kda_recurrent(q, k, 2 * v, beta, g)[0]

    after = resolve(delta.kda_gate_after, **claim)
    (finding,) = findings(_rows(after, ("reference",), case), after.spec)
    assert finding.in_decay and "in how the decay is applied" in finding.headline()
    doubled = resolve(v_doubled, **claim)
    (finding,) = findings(_rows(doubled, ("reference",), case), doubled.spec)
    assert not finding.in_decay and "decay" not in finding.headline()


def test_a_defect_in_float64_too_names_no_dtype_list_and_a_contract_headline_keeps_every_line():
    """The headline of one defect of every precision says "in float64 too" once (its dtypes
    are in its body); a contract finding's headline carries its whole detail, the lines of a
    multi-line message and the hint after them."""
    exact = Finding("wrong", "typical", ("reference",), "", dtypes=("float16", "float64"),
                    exact=True)  # fmt: skip
    assert exact.headline() == "wrong on typical inputs in float64 too: reference"
    raised = Finding("wrong", "typical", ("contract",), "raised TypeError: no float64.\nUse "
                     "float32. (declare the dtypes it takes, --dtypes float32)")  # fmt: skip
    assert raised.headline().endswith("no float64. Use float32. (declare the dtypes it takes, "
                                      "--dtypes float32)")  # fmt: skip
