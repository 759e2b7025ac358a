"""The check machinery itself: cases, strategies, comparisons within the bound, the
`check` command and `pytest properties/ --impl`. Whether the checks catch real bugs is
tests/test_zoo.py's question."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from linattn_verify.cases import KINDS, Case
from linattn_verify.checks import CHECKS, not_applicable
from linattn_verify.checks.compare import Tolerance, mismatch
from linattn_verify.regimes import ADVERSARIAL_KINDS, RANDOM_SIGN_TOP
from linattn_verify.specs import FEATURE_MAPS, Spec, SpecError
from linattn_verify.strategies import cases
from linattn_verify.under_test import resolve

ROOT = Path(__file__).resolve().parents[1]


def test_a_case_is_rebuilt_from_its_json():
    case = Case(2, 3, 7, 4, 5, "bfloat16", "cancel", 3.0, seed=11, m=6)
    again = Case.from_json(case.to_json())
    assert again == case
    for a, b in zip(case.tensors(), again.tensors()):
        assert torch.equal(a, b) and a.dtype == torch.bfloat16
    q, _, v, w = case.tensors()
    assert q.shape == (2, 3, 7, 4) and v.shape == (2, 3, 7, 5) and w.shape == (6, 4)


@pytest.mark.parametrize(
    "bad",
    ['{"b": 0, "h": 1, "n": 1, "d": 1, "dv": 1, "dtype": "float32"}', "{not json", '{"x": 1}'],
)
def test_a_bad_case_is_a_spec_error(bad):
    with pytest.raises(SpecError):
        Case.from_json(bad)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_builds_what_it_says(kind):
    q, k, v, _ = Case(1, 2, 9, 3, 2, "float64", kind, 100.0, seed=3).tensors()
    if kind == "identical":
        assert torch.equal(q, q[..., :1, :].expand_as(q))
    if kind == "zero-rows":
        assert (q.abs().sum(-1) == 0).any() and (k.abs().sum(-1) == 0).any()
    if kind == "cancel":
        assert v.abs().min() > 900
    if kind == "negative-rows":
        assert (q.amax(-1) <= -100).any() and (k.amax(-1) <= -100).any()
    if kind == "large-norm":
        assert torch.isclose(q.norm(dim=-1), torch.tensor(100.0, dtype=q.dtype)).any()


def test_float16_cases_clip_to_the_dtype_range():
    q, _, _, _ = Case(1, 1, 5, 3, 2, "float16", "negative-rows", 1e30, seed=1).tensors()
    assert torch.isfinite(q).all() and q.min() == -torch.finfo(torch.float16).max


@settings(max_examples=30)
@given(data=st.data(), name=st.sampled_from(sorted(FEATURE_MAPS)), causal=st.booleans())
def test_strategies_draw_valid_cases_in_the_regime(data, name, causal):
    spec = Spec(name, causal=causal)
    case = data.draw(cases(spec))
    assert (case.m is not None) == spec.info.needs_projection
    if case.kind not in ADVERSARIAL_KINDS:
        assert case.magnitude <= 10 ** RANDOM_SIGN_TOP[name] * (1 + 1e-12)
    tensors = [t for t in case.tensors() if t is not None]
    assert all(torch.isfinite(t).all() for t in tensors)


def test_mismatch_allows_the_bound_and_no_more():
    tol = Tolerance(np.ones((1, 1, 2, 1)), np.full((1, 1, 2, 1), 10.0), 2.0**-24)
    a = np.zeros((1, 1, 2, 1))
    inside = a + 19.9 * 2.0**-24  # the allowance is 2 x 10 u s
    assert mismatch(a, inside, tol, tol.allowance()) is None
    found = mismatch(a, a + 21 * 2.0**-24, tol, tol.allowance())
    assert found is not None and found.count == 2 and round(found.units) == 21
    # a NaN against a number is a disagreement; NaN against NaN and equal infinities are not
    b = a.copy()
    b[0, 0, 0, 0] = np.nan
    assert mismatch(a, b, tol, tol.allowance()).count == 1
    assert mismatch(b, b, tol, tol.allowance()) is None
    # undefined elements (scale NaN: exact 0/0) are not compared
    undefined = Tolerance(np.full((1, 1, 2, 1), np.nan), tol.bound, tol.u)
    assert mismatch(a, a + 1, undefined, undefined.allowance()) is None


def test_applicability_follows_the_spec():
    full = resolve(form="linear", feature_map="cosformer")
    causal = resolve(form="chunked", feature_map="elu", causal=True)
    assert not_applicable("permutation", full) and not_applicable("causality", full)
    assert not_applicable("permutation", causal) is not None
    assert not_applicable("causality", causal) is None
    assert not_applicable("split-resume", causal) is None
    assert not_applicable("convex-hull", resolve(form="linear", feature_map="performer-trig"))


def test_positivity_names_a_counterexample_of_relu_by_nature():
    case_json = {"b": 1, "h": 1, "n": 2, "d": 3, "dv": 1, "dtype": "float32", "kind": "zero-rows"}
    case = Case(**case_json, seed=0)
    result = CHECKS["positivity"](resolve(form="linear", feature_map="relu"), case)
    assert not result.passed and result.by_nature and "zero" in result.message
    assert "expected failure" in result.report()


def test_an_exception_in_the_implementation_is_a_failed_check():
    def broken(q, k, v):
        raise RuntimeError("kernel exploded")

    impl = resolve(broken, feature_map="elu")
    result = CHECKS["contract"](impl, Case(1, 1, 3, 2, 2, "float32"))
    assert not result.passed and "kernel exploded" in result.message
    assert result.repro.startswith("python -m linattn_verify check contract --impl ")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "linattn_verify", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )


def test_check_command_reproduces_a_case_and_writes_json(tmp_path):
    case = Case(1, 2, 5, 3, 2, "float16", "dominant", 2.0, seed=4).to_json()
    out = tmp_path / "r.json"
    run = _cli("check", "causality", "--form", "chunked", "--feature-map", "elu", "--causal",
               "--case", case, "--json", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "causality: pass" in run.stdout
    payload = json.loads(out.read_text())
    assert payload["checks"][0]["status"] == "pass" and payload["checks"][0]["case"] == case


def test_check_command_fails_a_broken_implementation_with_a_reproduction():
    run = _cli("check", "causality", "--impl", "tests.zoo.broken:causal_mask_off_by_one",
               "--feature-map", "elu", "--causal", "--examples", "10", "--quiet")  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "causality: FAIL" in run.stdout and "reproduce: python -m linattn_verify" in run.stdout


def _pytest_impl(target: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "properties/test_causality.py", "--impl", target, *args],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip


def test_pytest_properties_with_impl_fails_a_broken_one_readably():
    run = _pytest_impl("tests.zoo.broken:causal_mask_off_by_one", "--feature-map", "elu",
                       "--causal")  # fmt: skip
    assert run.returncode == 1, run.stdout[-2000:]
    assert "rows 0.." in run.stdout and "reproduce: python -m linattn_verify check" in run.stdout


def test_pytest_properties_with_impl_passes_a_correct_one():
    run = _pytest_impl("tests.zoo.correct:elu_masked_quadratic", "--feature-map", "elu",
                       "--causal")  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    assert " passed" in run.stdout


def test_an_infinite_difference_is_a_mismatch_even_where_the_bound_is_vacuous():
    vacuous = Tolerance(np.ones((1, 1, 1, 1)), np.full((1, 1, 1, 1), np.inf), 2.0**-24)
    a, b = np.full((1, 1, 1, 1), np.inf), np.ones((1, 1, 1, 1))
    assert mismatch(a, b, vacuous, vacuous.allowance()) is not None
    assert mismatch(b, b + 1e30, vacuous, vacuous.allowance()) is None  # finite: allowed


def _impl(fn, name="elu", causal=False, layout="bhnd"):
    return resolve(fn, feature_map=name, causal=causal, layout=layout)


def test_a_wrong_output_shape_fails_every_check_instead_of_crashing():
    def wrong_dv(q, k, v):
        return torch.zeros(*q.shape, dtype=q.dtype)  # (B, H, N, d), not dv

    case = Case(1, 2, 5, 3, 1, "float32", seed=2)  # dv = 1 would broadcast silently
    for name in ("v-affine", "permutation", "convex-hull", "positivity", "layout"):
        result = CHECKS[name](_impl(wrong_dv), case)
        assert not result.passed and "shape" in result.message, (name, result.message)


def test_contract_sees_in_place_writes_in_the_implementations_own_layout():
    def zeroes_v(q, k, v):  # bnhd layout
        out = q.new_zeros(*q.shape[:3], v.shape[-1])
        v.zero_()
        return out

    result = CHECKS["contract"](_impl(zeroes_v, layout="bnhd"), Case(1, 2, 4, 3, 2, "float32"))
    assert not result.passed and "input v was modified in place" in result.message


def test_split_resume_splits_even_two_tokens():
    from dataclasses import replace

    real = resolve(form="recurrent", feature_map="elu", causal=True)
    pieces = []

    def stream(max_len, w):
        carried = real.stream(max_len, w)

        def piece(q, k, v):
            pieces.append(q.shape[-2])
            return carried(q, k, v)

        return piece

    for seed in range(10):
        pieces.clear()
        case = Case(1, 1, 2, 2, 2, "float64", seed=seed)
        assert CHECKS["split-resume"](replace(real, stream=stream), case).passed
        assert pieces == [1, 1]


def test_positivity_checks_outputs_before_naming_the_spec():
    def infinite(q, k, v):
        return torch.full((*q.shape[:3], v.shape[-1]), float("inf"), dtype=q.dtype)

    result = CHECKS["positivity"](_impl(infinite, "relu"), Case(1, 1, 5, 2, 2, "float32"))
    assert not result.passed and not result.by_nature and "non-finite" in result.message


def test_a_signed_kernel_may_overflow_where_its_exact_output_does():
    # performer-trig, float16: a denominator near zero makes the exact output -82976, beyond
    # float16's 65504, so -inf is the right rounding (found by the thorough profile)
    case = Case.from_json(
        '{"b":1,"h":3,"n":33,"d":4,"dv":3,"dtype":"float16","kind":"cancel",'
        '"magnitude":3.1622776601683795,"seed":1106,"m":1}'
    )
    result = CHECKS["positivity"](resolve(form="quadratic", feature_map="performer-trig"), case)
    assert result.by_nature, result.message  # fails only by nature: a negative denominator
