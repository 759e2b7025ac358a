"""The gradient checks themselves (checks/gradients.py, accuracy/gradient.py): the judgement
in units of u M, a hand-written backward and its three bugs (tests/zoo/backward.py), the
failures the checks must name, and vet --grad."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import NAMES, gradient_bound, judge_gradients
from linattn_verify.cases import Case
from linattn_verify.checks import GRAD_CHECKS, not_applicable
from linattn_verify.checks.gradients import golden_samples
from linattn_verify.cli import main
from linattn_verify.specs import Spec
from linattn_verify.under_test import Implementation, resolve
from tests.zoo import backward

TARGETS = "tests/vet_targets.py"


def _impl(fn, causal: bool) -> Implementation:
    return resolve(fn, feature_map="elu", causal=causal)


def _case(dtype: str, seed: int = 5) -> Case:
    return Case(2, 2, 9, 3, 2, dtype, "normal", 1.0, seed, None, "cpu")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_bug_free_hand_written_backward_passes(dtype, causal):
    impl = _impl(lambda q, k, v: backward.hand_written(q, k, v, causal), causal)
    for name, check in GRAD_CHECKS.items():
        if not_applicable(name, impl):  # gradient-causality when not causal; state-gradient
            continue
        result = check(impl, _case(dtype))
        assert result.passed, result.report()
    assert GRAD_CHECKS["gradient"](impl, _case(dtype)).figures["max_error"] < 4


@pytest.mark.parametrize(
    "fn, causal, wrong, right",
    [
        (backward.dk_transposed, False, ("k",), ("q", "v")),
        (backward.no_normaliser_derivative, True, ("q", "k"), ("v",)),
        (backward.backward_ignores_mask, True, ("q", "k"), ("v",)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_each_backward_bug_shows_in_the_gradients_it_breaks(fn, causal, wrong, right, dtype):
    result = GRAD_CHECKS["gradient"](_impl(fn, causal), _case(dtype))
    assert not result.passed and "FAIL" in result.message
    bound = result.figures["bound"]
    for name in wrong:  # O(1) relative errors: beyond any rounding
        assert result.figures[f"max_error_d{name}"] > 1e3 * bound, result.message
    for name in right:
        assert result.figures[f"max_error_d{name}"] < 4, result.message


def test_a_backward_that_ignores_the_mask_breaks_gradient_causality():
    impl = _impl(backward.backward_ignores_mask, causal=True)
    result = GRAD_CHECKS["gradient-causality"](impl, _case("float64"))
    assert not result.passed
    assert result.message.startswith("after G of rows 0..") and "dk:" in result.message
    correct = resolve(form="chunked", feature_map="elu", causal=True)
    assert GRAD_CHECKS["gradient-causality"](correct, _case("float64")).passed


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gradient_causality_bites_where_the_bound_is_vacuous(dtype):
    impl = _impl(backward.backward_ignores_mask, causal=True)
    case = Case(1, 2, 16, 8, 4, dtype, "normal", 1.0, 3, None, "cpu")  # n u >= 1 in bfloat16
    assert not GRAD_CHECKS["gradient-causality"](impl, case).passed
    correct = resolve(form="chunked", feature_map="elu", causal=True)
    assert GRAD_CHECKS["gradient-causality"](correct, case).passed


# ---------------------------------------------------------------- the judgement


def _exact(seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    exact = {n: rng.standard_normal((1, 2, 4, 3)) for n in NAMES}
    return exact, {n: np.abs(e) + 1.0 for n, e in exact.items()}


def test_errors_are_measured_in_units_of_u_m():
    exact, m = _exact()
    u, n = 2.0**-24, 50
    off = {name: exact[name] + 3 * u * m[name] for name in NAMES}
    golden = {name: exact[name] + 1 * u * m[name] for name in NAMES}
    verdict = judge_gradients(off, exact, m, "float32", u, n, [golden])
    assert all(e == pytest.approx(3, rel=1e-6) for e in verdict.max_error.values())
    typical = math.sqrt(n)  # float32 computed in float32: sqrt(n) roundings (Higham & Mary)
    for name in NAMES:
        assert verdict.golden_max_error[name] == pytest.approx(1, rel=1e-6)
        floor = np.max(np.abs(exact[name]) / m[name]) * typical
        assert verdict.rounding_floor[name] == pytest.approx(floor)
        assert verdict.budget[name] == pytest.approx(4 * max(1, floor), rel=1e-6)
    assert verdict.passed and verdict.bound == pytest.approx(n / (1 - n * u))
    worse = {name: exact[name] + 30 * u * m[name] for name in NAMES}
    assert not judge_gradients(worse, exact, m, "float32", u, n, [golden]).passed


def test_beyond_the_bound_or_non_finite_is_a_violation_and_0_over_0_is_not_judged():
    exact, m = _exact()
    u, n = 2.0**-53, 40
    grads = {name: e.copy() for name, e in exact.items()}
    grads["k"][0, 1, 2, 0] += 2 * gradient_bound(n, u) * u * m["k"][0, 1, 2, 0]
    grads["v"][0, 0, 0, 0] = np.nan
    verdict = judge_gradients(grads, exact, m, "float64", u, n)
    assert verdict.violations == 2 and not verdict.passed
    exact["v"][0, 0, 0, 0] = np.nan  # a 0/0 row: nothing to judge there
    grads["k"] = exact["k"]
    assert judge_gradients(grads, exact, m, "float64", u, n).passed


def test_an_infinity_within_the_budget_of_the_range_is_its_rounding_and_counted():
    """float16 with a vacuous bound (n u >= 1): an exact 65,487 computed as inf is within
    the budget of the range (|exact| + budget u M > 65,504), so it is taken as its rounding
    and counted; where the budget does not reach the range it is an error."""
    exact, m = _exact()
    u, n = 2.0**-11, 4096
    exact["q"][0, 0, 0, 0], m["q"][0, 0, 0, 0] = 65487.0, 1e9
    grads = {name: e.copy() for name, e in exact.items()}
    grads["q"][0, 0, 0, 0] = np.inf
    golden = {name: e.copy() for name, e in exact.items()}
    golden["q"][0, 0, 0, 0] += 100 * u * 1e9  # the budget: 400 u M of it, past the range
    verdict = judge_gradients(grads, exact, m, "float16", u, n, [golden])
    assert verdict.passed and verdict.rounded_to_inf == 1
    # an exact 30,000 (M the same): the budget, 4 x 64 roundings (the floor), reaches 33,750
    exact["q"][0, 0, 0, 0] = m["q"][0, 0, 0, 0] = 30000.0
    golden["q"][0, 0, 0, 0] = 30000.0 * (1 + u)
    verdict = judge_gradients(grads, exact, m, "float16", u, n, [golden])
    assert not verdict.passed and verdict.rounded_to_inf == 0


def test_a_magnitude_below_the_subnormal_range_is_floored():
    exact, m = _exact()
    m["q"][0, 0, 0, 0] = 0.0  # e.g. a weight e^-2000, whose magnitude underflows float64
    exact["q"][0, 0, 0, 0] = 0.0
    grads = {name: e.copy() for name, e in exact.items()}
    grads["q"][0, 0, 0, 0] = 5e-324  # the smallest subnormal: a rounding, not an error
    verdict = judge_gradients(grads, exact, m, "float64", 2.0**-53, 40)
    assert verdict.passed and verdict.max_error["q"] == pytest.approx(1.0)


def test_a_vacuous_bound_leaves_the_budget_to_judge():
    exact, m = _exact()
    u = 2.0**-8
    grads = {name: exact[name] + 0.5 * u * m[name] for name in NAMES}
    verdict = judge_gradients(grads, exact, m, "bfloat16", u, 300, [exact])
    assert verdict.bound == float("inf") and verdict.violations == 0
    for n in NAMES:  # one rounding of each exact tensor
        assert verdict.rounding_floor[n] == pytest.approx(np.max(np.abs(exact[n]) / m[n]))
        assert verdict.budget[n] == pytest.approx(4 * verdict.rounding_floor[n])
    assert verdict.passed
    assert "vacuous" in verdict.message


def test_the_budget_floor_is_one_rounding_of_the_gradient_not_one_unit_of_u_m():
    exact, m = _exact()
    m = {n: 1000 * np.abs(e) for n, e in exact.items()}  # M >> |g|, as for the Performer maps
    u = 2.0**-24
    grads = {name: exact[name] * (1 + 100 * u) for name in NAMES}  # 100 roundings off
    verdict = judge_gradients(grads, exact, m, "float32", u, 50, [exact])
    assert max(verdict.max_error.values()) == pytest.approx(0.1, rel=1e-3)
    assert verdict.budget == pytest.approx(dict.fromkeys(NAMES, 4 / 1000 * math.sqrt(50)))
    assert not verdict.passed


def test_each_gradient_has_its_own_budget():
    """dq with M = 1e6 |dq| next to dv with M = |dv| (the Performer maps): dq off by 100
    roundings is 1e-4 units, far below dv's budget, and must still fail."""
    exact, _ = _exact()
    m = {"q": 1e6 * np.abs(exact["q"]), "k": np.abs(exact["k"]), "v": np.abs(exact["v"])}
    u = 2.0**-24
    golden = {n: exact[n] * (1 + (n == "v") * u) for n in NAMES}  # one rounding in dv
    grads = {n: exact[n] * (1 + 100 * u * (n == "q")) for n in NAMES}
    verdict = judge_gradients(grads, exact, m, "float32", u, 50, [golden])
    assert verdict.max_error["q"] == pytest.approx(1e-4, rel=1e-3)
    typical = math.sqrt(50)
    assert verdict.budget["v"] == pytest.approx(4 * typical)
    assert verdict.budget["q"] == pytest.approx(4e-6 * typical)
    assert verdict.over_budget == ["q"] and not verdict.passed


# ------------------------------------------------------------- failures by name


def test_an_output_without_a_backward_fails_by_name():
    impl = _impl(lambda q, k, v: backward.hand_written(q, k, v).detach(), False)
    result = GRAD_CHECKS["gradient"](impl, _case("float32"))
    assert not result.passed and "no backward" in result.message


class _Raising(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return v.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("not implemented for this shape")


def test_a_backward_that_raises_fails_by_name():
    result = GRAD_CHECKS["gradient-finite"](_impl(_Raising.apply, False), _case("float32"))
    assert not result.passed
    assert "backward raised RuntimeError: not implemented for this shape" in result.message


def test_a_loss_with_a_0_over_0_row_is_not_judged():
    spec = Spec("relu", causal=True)
    case = Case(1, 1, 4, 2, 2, "float32", "negative-rows", 1.0, 0, None, "cpu")
    result = GRAD_CHECKS["gradient"](resolve(form="chunked", spec=spec), case)
    assert result.passed and result.message.startswith("not judged: the exact denominator")


# ------------------------------------------------------------ the command line


def test_check_runs_a_gradient_check_and_vet_grad_runs_them_all(tmp_path, capsys):
    code = main(["check", "gradient", "--form", "chunked", "--feature-map", "elu", "--causal",
                 "--examples", "3", "--quiet"])  # fmt: skip
    assert code == 0 and "gradient: pass" in capsys.readouterr().out
    out = tmp_path / "vet.json"
    code = main(["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--grad",
                 "--dtypes", "float32", "--long", "0", "--no-envelope", "--quiet", "--json",
                 str(out)])  # fmt: skip
    rows = {r["name"]: r for r in json.loads(out.read_text())["checks"]}
    assert code == 0
    for name in ("gradient", "gradient-associativity", "gradient-finite"):
        assert rows[name]["status"] == "pass"
    assert rows["gradient-causality"]["status"] == "not applicable"


@pytest.mark.parametrize("feature_map", ["elu", "cosformer", "performer-trig"])
def test_golden_samples_are_the_same_gradients_with_other_roundings(feature_map):
    """Each split sample (its keys reordered where Spec.ordered allows, then put back) is
    the unsplit golden gradient to within float64 roundings: a key order not undone, or
    one applied to cosFormer (whose weights depend on positions), differs by 10% or more."""
    spec = Spec(feature_map, eps=0.1)  # no 0/0 row (cosFormer's relu features)
    rng = np.random.default_rng(3)
    q, k, v, g = (torch.tensor(rng.normal(size=(1, 2, 9, 4))) for _ in range(4))
    w = torch.tensor(rng.normal(size=(8, 4))) if spec.info.needs_projection else None
    first, *splits = golden_samples(q, k, v, w, g, spec, forms=("linear",))
    assert len(splits) == 2
    for sample in splits:
        for name in NAMES:
            scale = np.max(np.abs(first[name]))
            assert np.max(np.abs(sample[name] - first[name])) <= 1e-12 * scale, name
