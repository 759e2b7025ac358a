"""The delta rule's gradient model (families/delta/gradient_bound.py) against the exact gradients
(families/delta/gradients.py): the built-in forms' backward, on typical and adversarial inputs,
stays within gamma_n M; M bounds each exact element itself; a backward bug leaves it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import allowance, judge_gradients
from linattn_verify.cases import Case
from linattn_verify.checks import GRAD_CHECKS
from linattn_verify.checks.core import as_array, inputs_of
from linattn_verify.checks.gradients import autograd_gradients, loss_weights
from linattn_verify.families import attention_with_state
from linattn_verify.families.delta.fields import QK_L2NORM_EPS
from linattn_verify.families.delta.gradient_bound import (
    _evaluation,
    delta_cancelled_terms,
    delta_gradient_magnitudes,
    delta_roundings,
)
from linattn_verify.families.delta.gradients import exact_delta_gradients
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.under_test import DECLARED, resolve

FORMS = (("recurrent", None), ("chunked", 16), ("chunked", 64))
DECAYS = (None, "gates", "channel-gates")
KINDS = ("normal", "beta-near-two", "long-keys", "parallel-keys")


def _impl(form: str, chunk: int | None, decay: str | None, l2: bool):
    return resolve(None, form=form, chunk_size=chunk, feature_map="identity", causal=True,
                   normalize=False, scale="d^-0.5", delta_rule=True, decay=decay,
                   qk_l2norm=l2)  # fmt: skip


def _judged(impl, case: Case):
    """The backward of impl on the case's loss, judged against the exact gradients."""
    (q, k, v, w, decay), x = inputs_of(case, impl.spec)
    g = loss_weights(case, q, v)
    grads = autograd_gradients(impl, q, k, v, w, g, decay, impl.spec)
    exact = exact_delta_gradients(x, impl.spec, as_array(g))
    mags = delta_gradient_magnitudes(x, impl.spec, as_array(g))
    n, u = delta_roundings(x, impl.spec), UNIT_ROUNDOFF[case.dtype]
    return judge_gradients(grads, exact, mags, case.dtype, u, n), exact, mags


CASES = (
    [
        (form, chunk, decay, l2, kind, "float32")
        for form, chunk in FORMS
        for decay in DECAYS
        for l2 in (False, True)
        for kind in KINDS
        if not (l2 and kind == "long-keys")  # normalised keys: the kind is moot
    ]
    + [
        (form, chunk, decay, False, "normal", dtype)
        for form, chunk in FORMS[1:]
        for decay in DECAYS
        for dtype in ("float16", "bfloat16")
    ]
)


@pytest.mark.parametrize(("form", "chunk", "decay", "l2", "kind", "dtype"), CASES)
def test_the_backward_stays_within_the_bound(form, chunk, decay, l2, kind, dtype):
    impl = _impl(form, chunk, decay, l2)
    verdict, exact, mags = _judged(impl, Case(1, 2, 33, 8, 8, dtype, kind=kind, seed=7))
    assert verdict.violations == 0, verdict.message
    if kind == "normal" and dtype == "float32":  # not vacuous on typical inputs
        assert np.isfinite(verdict.bound), verdict.message
    for name in exact:  # M holds the exact products: it bounds the element itself
        assert np.all(np.abs(exact[name]) <= mags[name]), name


def _with_state(impl, case: Case):
    """(x, G, G_S, S_0) of the case: G its loss weights, G_S and S_0 ~ N(0, 1) from its seed."""
    (q, _, v, _, _), x = inputs_of(case, impl.spec)
    rng = np.random.default_rng(case.seed)
    shape = (case.b, case.h, case.d, case.dv)
    return (
        x,
        as_array(loss_weights(case, q, v)),
        rng.standard_normal(shape),
        rng.standard_normal(shape),
    )


def test_the_state_terms_are_bounded_too():
    """With S_0 and the final state's cotangent G_S: every gradient, dS_0 included."""
    impl = _impl("chunked", 16, "channel-gates", False)
    x, g, g_state, s0 = _with_state(impl, Case(1, 2, 33, 8, 8, "float32", seed=3))
    exact = exact_delta_gradients(x, impl.spec, g, g_state, s0)
    mags = delta_gradient_magnitudes(x, impl.spec, g, g_state, s0)
    assert set(exact) == set(mags) == {"q", "k", "v", "beta", "g", "S0"}
    for name in exact:
        assert np.all(np.abs(exact[name]) <= mags[name]), name
    # dS_0 of the first token's gate wrong by its own factor exp(g_0) leaves the bound
    factor = np.exp(x.decay[:, :, 0])[..., None]
    wrong = {name: exact[name] for name in exact} | {"S0": exact["S0"] / factor}
    n = delta_roundings(x, impl.spec)
    verdict = judge_gradients(wrong, exact, mags, "float32", UNIT_ROUNDOFF["float32"], n)
    assert verdict.violations > 0 and verdict.worst[0] == "S0", verdict.message


# the largest relative error the bound lets through at the element where it is tightest,
# per tensor, float32, N = 33 (measured 0.0017, 0.11, 0.0017, 0.12 and 0.18 at most over the
# decays): the bound is loose (M holds the local errors summed over the sequence, every key
# channel's dk the column norms'), the budget judges what it lets through
LOOSEST = {"q": 0.01, "k": 0.2, "v": 0.01, "beta": 0.2, "g": 0.5}


@pytest.mark.parametrize("decay", DECAYS)
def test_the_bound_is_loose_but_judges(decay):
    impl = _impl("recurrent", None, decay, False)
    case = Case(1, 2, 33, 8, 8, "float32", seed=7)
    (q, _, v, _, _), x = inputs_of(case, impl.spec)
    g = as_array(loss_weights(case, q, v))
    exact = exact_delta_gradients(x, impl.spec, g)
    mags = delta_gradient_magnitudes(x, impl.spec, g)
    n, u = delta_roundings(x, impl.spec), UNIT_ROUNDOFF["float32"]
    for name, loosest in LOOSEST.items():
        if name in exact:
            with np.errstate(divide="ignore"):
                relative = allowance(mags[name], "float32", u, n) / np.abs(exact[name])
            assert np.min(relative) < loosest, name


# B = H = N = d = dv = 1 in float16 with q and k normalised (issue 51, item 10): the exact dk
# (and dq) through x / r is (1 - xh^2) dxh / r, about 1e-6 of its terms, and a computed one
# the difference of two terms of size |dxh| / r that agree to rounding. Before the budget
# held that rounding (gradient_bound.py, delta_cancelled_terms) these seeds failed: the
# built-in forms' dk 5.9e-6 u M against a budget of 1.67e-6 (state-gradient, seed 0)
UNIT_CASES = [
    ("state-gradient", form, seed) for form in ("recurrent", "chunked") for seed in (0, 4)
] + [("gradient", form, seed) for form in ("recurrent", "chunked") for seed in (2, 8)]


def _unit_l2norm(form: str, state: bool):
    return resolve(None, form=form, feature_map="identity", causal=True, normalize=False,
                   delta_rule=True, qk_l2norm=True,
                   **({"state": DECLARED} if state else {}))  # fmt: skip


@pytest.mark.parametrize(("check", "form", "seed"), UNIT_CASES)
def test_the_built_in_l2norm_backward_passes_where_its_terms_cancel(check, form, seed):
    impl = _unit_l2norm(form, check == "state-gradient")
    result = GRAD_CHECKS[check](impl, Case(1, 1, 1, 1, 1, "float16", seed=seed))
    assert result.passed, result.message


class _NoProjection(torch.autograd.Function):
    """x / r, r = sqrt(|x|^2 + QK_L2NORM_EPS), in float32 (float64 for float64), whose
    backward forgets the projection: dx = dxh / r, not (I - xh xh^T) dxh / r."""

    @staticmethod
    def forward(ctx, x):
        wide = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        r = torch.sqrt((wide * wide).sum(-1, keepdim=True) + QK_L2NORM_EPS)
        ctx.save_for_backward(r)
        return wide / r

    @staticmethod
    def backward(ctx, g):
        (r,) = ctx.saved_tensors
        return g / r


def _l2norm_without_projection(q, k, v, beta, initial_state=None):
    """The built-in recurrent delta rule on q and k normalised by _NoProjection, computed in
    q^'s dtype, the output rounded to q's."""
    qn, kn = _NoProjection.apply(q), _NoProjection.apply(k)
    out, state = attention_with_state(
        qn, kn, v.to(qn.dtype), "identity", form="recurrent", initial_state=initial_state,
        normalize=False, delta_rule=True, beta=beta.to(qn.dtype),
    )  # fmt: skip
    return out.to(q.dtype), state


@pytest.mark.parametrize(
    ("check", "case"),
    [
        ("gradient", Case(1, 1, 1, 1, 1, "float16", seed=2)),
        ("gradient", Case(1, 1, 3, 2, 2, "float32", seed=1)),
        ("state-gradient", Case(1, 1, 1, 1, 1, "float16", seed=0)),
        ("state-gradient", Case(1, 2, 4, 3, 2, "bfloat16", seed=1)),
    ],
)
def test_an_l2norm_backward_without_its_projection_fails(check, case):
    impl = resolve(_l2norm_without_projection, feature_map="identity", causal=True,
                   normalize=False, delta_rule=True, qk_l2norm=True,
                   state="S")  # fmt: skip
    result = GRAD_CHECKS[check](impl, case)
    assert not result.passed and "dk" in result.message.split("EXCEEDED by")[-1], result.message


def test_the_cancelled_terms_are_those_of_the_exact_projection():
    """The float64 dxh behind A projects to the exact gradient, (dxh - xh (xh . dxh)) / r,
    and A / r bounds it; c is the docstring's count."""
    impl = _impl("chunked", 16, "gates", True)
    x, g, g_state, s0 = _with_state(impl, Case(1, 2, 9, 3, 2, "float32", seed=5))
    exact = exact_delta_gradients(x, impl.spec, g, g_state, s0)
    cancelled = delta_cancelled_terms(x, impl.spec, g, g_state, s0)
    normalised = _evaluation(x, impl.spec, g, g_state, s0)[1]
    for name, raw in (("q", x.q), ("k", x.k)):
        c, sizes = cancelled[name]
        assert c == 3 + 3 + 4 * (1 + 3)
        r = np.sqrt(np.sum(raw * raw, -1, keepdims=True) + QK_L2NORM_EPS)
        xh, dxh = raw / r, normalised[name]
        projected = (dxh - xh * np.sum(xh * dxh, -1, keepdims=True)) / r
        np.testing.assert_allclose(projected, exact[name], rtol=0, atol=1e-13 * sizes.max())
        assert np.all(np.abs(exact[name]) <= sizes), name
    assert delta_cancelled_terms(x, _impl("chunked", 16, "gates", False).spec, g) == {}
