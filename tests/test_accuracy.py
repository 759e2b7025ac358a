"""The accuracy model: units, the a-priori bound, the budget and the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.accuracy import (
    BUDGET_FLOOR,
    K_BUDGET,
    attainable_floor,
    error_units,
    gamma,
    judge,
    scale_and_bound,
)
from linattn_verify.accuracy.verdict import AccuracyVerdict
from linattn_verify.families import case_arguments, exact, golden_attention, validate
from linattn_verify.inputs import UNIT_ROUNDOFF

ALL = list(lv.FEATURE_MAPS)


def _case(name: str, causal: bool, dtype: torch.dtype, n: int = 24, d: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 2, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    w = None
    if lv.FEATURE_MAPS[name].needs_projection:
        w = torch.tensor(lv.sample_projection(d, d, "orthogonal", seed)).to(dtype)
    spec = lv.Spec(name, causal=causal)
    tensors = {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), "projection": w}
    x = validate(tensors["q"], tensors["k"], tensors["v"], spec, w)
    return spec, tensors, x, exact(x, spec)


def test_gamma_is_higham_and_infinite_past_one():
    assert gamma(10, 2.0**-24) == pytest.approx(10 * 2.0**-24 / (1 - 10 * 2.0**-24), rel=1e-15)
    assert gamma(2048, 2.0**-11) == math.inf


def test_error_units_of_nan_output_are_infinite_and_of_equal_output_zero():
    ref = np.array([1.0, 2.0, np.nan])
    e = error_units(np.array([np.nan, 2.0, np.nan]), ref, np.ones(3), 2.0**-24)
    assert e[0] == math.inf and e[1] == 0.0


def test_scale_of_a_positive_kernel_is_the_weighted_mean_of_abs_v():
    spec, _, x, ref = _case("elu", False, torch.float64)
    scale, _ = scale_and_bound(x, spec, ref, UNIT_ROUNDOFF["float64"])
    phi = lambda t: np.where(t > 0, t + 1, np.exp(t))  # noqa: E731
    a = phi(x.q) @ np.swapaxes(phi(x.k), -1, -2)
    expected = (a @ np.abs(x.v)) / a.sum(-1, keepdims=True)
    np.testing.assert_allclose(scale, expected, rtol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_golden_is_within_the_bound_in_every_dtype(name, causal, dtype):
    spec, tensors, x, ref = _case(name, causal, dtype)
    forms = ("quadratic", "linear") if spec.info.kernelised else ("quadratic",)
    for form in forms:
        verdict = judge(golden_attention(**tensors, spec=spec, form=form), x, spec, ref)
        assert verdict.within_bound, f"{form}: {verdict.message}"


def test_perturbed_weights_exceed_the_bound():
    """A relative error of 2^-12 in every weight is far more than fp32 arithmetic allows."""
    spec, tensors, x, ref = _case("elu", False, torch.float32)
    g = torch.Generator().manual_seed(1)
    phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))  # noqa: E731
    a = phi(tensors["q"]) @ phi(tensors["k"]).transpose(-1, -2)
    a = a * (1 + 2.0**-12 * torch.randn(a.shape, generator=g))
    out = (a @ tensors["v"]) / a.sum(-1, keepdim=True)
    verdict = judge(out, x, spec, ref)
    assert not verdict.within_bound and verdict.bound_violations > 0
    assert "above the a-priori bound" in verdict.message and "FAIL" in verdict.message


def test_state_kept_in_float16_is_within_the_bound_but_over_the_budget():
    """Linear attention with everything in fp16 (state, sums) is 'sane' but not attainable
    accuracy: the golden form accumulates in fp32 and rounds once. Values of one sign make
    the state grow with N, so its rounding errors do too (about u sqrt(N) relative)."""
    spec, tensors, x, _ = _case("elu", False, torch.float16, n=512, d=16)
    tensors["v"] = tensors["v"].abs()
    x = validate(tensors["q"], tensors["k"], tensors["v"], spec)
    ref = exact(x, spec)
    phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))  # noqa: E731
    fq, fk, v = phi(tensors["q"]), phi(tensors["k"]), tensors["v"]
    state, z = torch.zeros(2, 2, 16, 16, dtype=torch.float16), torch.zeros(2, 2, 16, 1).half()
    for j in range(512):  # a running fp16 state, token by token
        state = state + fk[:, :, j, :, None] * v[:, :, j, None, :]
        z = z + fk[:, :, j, :, None]
    out = (fq @ state) / (fq @ z)
    golden = golden_attention(**tensors, spec=spec, form="linear")
    verdict = judge(out, x, spec, ref, golden=golden)
    assert verdict.within_bound, verdict.message
    assert verdict.within_budget is False, verdict.message
    floor = attainable_floor(spec, x, 2.0**-11)
    assert floor == BUDGET_FLOOR  # half precision: the golden forms compute in float32
    assert verdict.budget == K_BUDGET * max(verdict.golden_max_error, floor)
    assert judge(golden, x, spec, ref, golden=golden).passed


def test_where_the_denominator_cancels_the_budget_grows_with_its_error():
    """Normalised identity features with gates: row 64 of head (0, 2) has kappa 1.1e4 and
    an output 2000 times its values' size. Correct forms err there by 578 (recurrent) and
    2.4e3 u s (chunked), 6 and 24 x the golden's largest error elsewhere: both failed a
    budget of 4 x golden alone, and pass the sums' floor times kappa |out| / s
    (amplification) there."""
    from linattn_verify.accuracy.verdict import amplification
    from linattn_verify.cases import Case
    from linattn_verify.families.decayed.forms import decayed_attention

    spec = lv.Spec("identity", causal=True, decay="gates")
    case = Case(2, 3, 65, 5, 4, "float32", "normal", 1.0, 7)
    q, k, v, w, decay = case_arguments(case, spec)
    x = validate(q, k, v, spec, w, decay)
    ref = exact(x, spec)
    golden = golden_attention(q, k, v, spec, w, "quadratic", decay)
    for form in ("recurrent", "chunked"):
        out = decayed_attention(q, k, v, spec, form, w, decay=decay)[0]
        verdict = judge(out, x, spec, ref, golden=golden)
        assert verdict.passed, verdict.message
        assert verdict.worst_index[:3] == (0, 2, 64)
        assert verdict.max_error > verdict.budget  # 578 and 2.4e3 against 394
    scale = scale_and_bound(x, spec, ref, UNIT_ROUNDOFF["float32"])[0]
    assert amplification(x, spec, ref, scale)[0, 2, 64].max() > 1000

    def fourteen_bits(t: torch.Tensor) -> torch.Tensor:  # 2^-15 relative, to nearest
        i = t.contiguous().view(torch.int32)
        return (((i + 2**8) >> 9) << 9).view(torch.float32)

    # a kernel reading q, k and v at 14 bits (bfloat16's 8 leave the bound): over the
    # budget of an element whose denominator does not cancel as much, within the bound
    out = decayed_attention(*map(fourteen_bits, (q, k, v)), spec, "recurrent", w, decay=decay)[0]
    verdict = judge(out, x, spec, ref, golden=golden)
    assert verdict.within_bound and verdict.within_budget is False, verdict.message
    at, error, there = verdict.over_budget
    assert at != verdict.worst_index and error > there >= verdict.budget
    assert f"EXCEEDED at {at}: error {error:.3g} u s against {there:.3g} there" in verdict.message


@pytest.mark.parametrize("seed", range(4))
def test_a_float16_state_fails_the_budget_where_the_denominator_cancels(seed):
    """Normalised identity features in float16: a running state [S | z] kept in float16 is
    within the bound and over the budget, as with non-negative features; the same loop
    with a float32 state passes. (The amplified term multiplies the sums' error in the
    golden's float32, not the output's own rounding: a factor 1 there let it pass.)"""
    spec, tensors, x, ref = _case("identity", True, torch.float16, n=64, seed=seed)
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    golden = golden_attention(q, k, v, spec, form="quadratic")
    verdicts = {}
    for dtype in (torch.float16, torch.float32):
        state = torch.zeros(2, 2, 4, 5, dtype=dtype)
        rows = []
        for j in range(q.shape[2]):  # the recurrence, token by token, in `dtype`
            kv = torch.cat([v[:, :, j], torch.ones_like(v[:, :, j, :1])], -1).to(dtype)
            state = state + k[:, :, j, :, None].to(dtype) * kv[:, :, None, :]
            rows.append(q[:, :, j, None, :].to(dtype) @ state)
        num_den = torch.cat(rows, dim=2)
        out = (num_den[..., :-1] / num_den[..., -1:]).half()
        verdicts[dtype] = judge(out, x, spec, ref, golden=golden)
    low, high = verdicts[torch.float16], verdicts[torch.float32]
    assert low.within_bound and low.within_budget is False, low.message
    assert high.passed, high.message


def test_verdict_reports_its_figures():
    spec, tensors, x, ref = _case("softmax", True, torch.bfloat16)
    verdict = judge(golden_attention(**tensors, spec=spec), x, spec, ref)
    d = verdict.to_dict()
    assert d["dtype"] == "bfloat16" and d["unit_roundoff"] == 2.0**-8
    assert d["passed"] and "softmax (causal) bfloat16: max error" in d["message"]
    assert 0 < d["max_error"] <= d["bound_at_worst"]


def test_judge_rejects_a_wrong_shape():
    spec, _, x, ref = _case("elu", False, torch.float32)
    with pytest.raises(lv.SpecError, match="output has shape"):
        judge(torch.zeros(1, 2, 3, 4), x, spec, ref)


def test_an_output_that_underflows_to_zero_is_within_the_bound():
    """relu with q = k = 1e-30 and eps = 1: the exact output is about 4e-60, which float32
    can only round to 0; the bound admits half its smallest subnormal (2^-150)."""
    q = torch.full((1, 1, 3, 4), 1e-30)
    v = torch.ones(1, 1, 3, 2)
    spec = lv.Spec("relu", eps=1.0)
    x = validate(q, q, v, spec)
    ref = exact(x, spec)
    assert 0 < ref.max() < 2.0**-150
    assert judge(torch.zeros(1, 1, 3, 2), x, spec, ref).within_bound


def test_non_finite_outputs_and_numbers_for_0_over_0_are_violations():
    spec, tensors, x, ref = _case("elu", False, torch.bfloat16, n=300, d=8)  # vacuous bound
    nan = torch.full_like(tensors["v"], float("nan"))
    verdict = judge(nan, x, spec, ref)
    assert not verdict.within_bound and "vacuous" in verdict.message
    q = torch.tensor([[-1.0, -1.0], [1.0, 1.0]]).reshape(1, 1, 2, 2)
    v = torch.ones(1, 1, 2, 1)
    relu = lv.Spec("relu")
    x = validate(q, q.abs(), v, relu)
    ref = exact(x, relu)  # row 0: 0/0
    assert np.isnan(ref[0, 0, 0]).all()
    ok = torch.tensor([float("nan"), 1.0]).reshape(1, 1, 2, 1)
    assert judge(ok, x, relu, ref).passed
    assert not judge(torch.ones(1, 1, 2, 1), x, relu, ref).within_bound


def test_kept_ball_sums_follow_the_feature_model_and_the_inputs():
    """The bound's ball sums are kept per head (accuracy/bound.py, _head_sums): the same head
    under the other feature model, or with one value changed, is bounded afresh."""
    from linattn_verify.accuracy import bound

    spec, u = lv.Spec("elu", causal=True), UNIT_ROUNDOFF["float32"]
    k = torch.tensor([[[[0.1, 0.4], [-0.7, 0.2], [0.3, -1.0]]]])
    v = torch.tensor([[[[1.0], [2.0], [-1.0]]]])

    def bounded(q: torch.Tensor, model: str) -> np.ndarray:
        with bound.feature_model(model):
            return bound.scale_and_bound(validate(q, k, v, spec), spec, None, u)[1]

    q = torch.tensor([[[[0.5, -0.2], [-30.0, -25.0], [1.0, 0.3]]]])  # an all-negative row
    nearby = q.clone()
    nearby[0, 0, 1, 0] = -29.0
    got = [bounded(t, m) for t in (q, nearby) for m in ("standard", "relative")]
    bound._KEPT.clear()  # afresh, nothing kept
    fresh = [bounded(t, m) for t in (q, nearby) for m in ("standard", "relative")]
    for a, b in zip(got, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[1], got[3])


def test_an_error_of_the_outputs_scale_is_wrong_whatever_the_bound():
    """Issue 51, item 3: within a loose bound (float16's at long sums) and over the budget
    an error is inaccurate, unless it reaches the output's own scale: then it is wrong."""

    def verdict(share: float) -> AccuracyVerdict:
        u = 2.0**-11
        return AccuracyVerdict("elu", "float16", u, share / u, share / u, (0, 0, 0, 0),
                               1e9, 0, 0, 1.0, 4.0, True, False)  # fmt: skip

    assert verdict(0.5).severity == "inaccurate"
    assert verdict(1.9).severity == "wrong"


@pytest.mark.parametrize("sets", ["floor", "golden"])
def test_the_budget_in_words_adds_up_and_names_what_set_it(sets):
    """Issue 51, item 9: "budget 4 = 4 x golden 0.578" did not add up (4 x 0.578 = 2.31):
    the floor had raised it. The words name the floor when it sets the budget, and the
    golden when the golden does; either way the product they state is the budget."""
    dtype = torch.float16 if sets == "floor" else torch.float64
    spec, tensors, x, ref = _case("elu", False, dtype)
    golden = golden_attention(**tensors, spec=spec, form="linear")
    if sets == "golden":  # 1e6 units off in float64: a budget far above the floor
        noise = torch.randn(golden.shape, generator=torch.Generator().manual_seed(1))
        golden = golden + 1e-10 * noise.to(golden.dtype)
    verdict = judge(golden, x, spec, ref, golden=golden)
    floor = attainable_floor(spec, x, verdict.unit_roundoff)
    g, k = verdict.golden_max_error, K_BUDGET
    words = verdict.message.split("budget ", 1)[1]
    if sets == "floor":
        assert g < floor  # half precision: the golden errs below the 1 unit of the floor
        assert verdict.budget == k * floor
        assert words.startswith(f"{k * floor:.3g} = {k:g} x the floor {floor:.3g}"), words
        assert f"{k:g} x golden {g:.3g} = {k * g:.3g}" in words, words
    else:
        assert g > floor
        assert verdict.budget == k * g
        assert words.startswith(f"{k * g:.3g} = {k:g} x golden {g:.3g}"), words
        assert "floor" not in words, words
