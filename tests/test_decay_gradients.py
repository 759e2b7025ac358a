"""Exact gradients and the gradient checks of the specs that are not plain (scaled,
unnormalised, decayed): closed forms of tiny cases, float64 autograd through the golden
quadratic form, the checks on a correct built-in form and on broken backward passes of the
log-gates, bad input."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import gradient_names, judge_gradients
from linattn_verify.accuracy.verdict import K_BUDGET
from linattn_verify.cases import Case
from linattn_verify.checks import GRAD_CHECKS, not_applicable
from linattn_verify.families import golden_attention, validate
from linattn_verify.families.dispatch import (
    gradient_magnitudes,
    reference_gradients,
    roundings,
)
from linattn_verify.reference.mp import nearest
from linattn_verify.specs import RSQRT_D, Spec, SpecError
from linattn_verify.under_test import resolve
from tests.zoo import decay as zoo

RNG = np.random.default_rng(2026)


def _draw(b: int, h: int, n: int, d: int, dv: int, seed: int):
    """q, k, v, the cotangent g_out, gamma (H,) and log-gates (B, H, N) in float64."""
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, b, h, n, d))
    v, g_out = rng.standard_normal((2, b, h, n, dv))
    gamma = rng.uniform(0.5, 1.0, h)
    gates = np.log(rng.uniform(0.3, 1.0, (b, h, n)))
    return q, k, v, g_out, gamma, gates


def _decay(spec: Spec, gamma, gates):
    return {"constant": gamma, "gates": gates}.get(spec.decay)


# ------------------------------------------------------------------ closed forms


def test_one_token_unnormalised_identity_by_hand():
    # out_0 = c (q.k) v: dv = c (q.k) g_out, dq = c (g_out.v) k, dk = c (g_out.v) q and
    # dg_0 = 0 (no key before token 0); dyadic inputs, so every value is exact.
    q, k = np.array([1.0, -0.5]), np.array([0.25, 2.0])
    v, g_out = np.array([3.0, -1.0]), np.array([0.5, 2.0])
    spec = Spec("identity", causal=True, normalize=False, scale=0.5, decay="gates")
    shaped = [t.reshape(1, 1, 1, 2) for t in (q, k, v, g_out)]
    ours = reference_gradients(*shaped, spec, decay=np.full((1, 1, 1), -0.75))
    want = {
        "v": 0.5 * (q @ k) * g_out,
        "q": 0.5 * (g_out @ v) * k,
        "k": 0.5 * (g_out @ v) * q,
        "g": np.zeros(1),
    }
    for name, value in want.items():
        np.testing.assert_array_equal(ours[name].reshape(-1), value, err_msg=f"d{name}")


def _faithful(ours: np.ndarray, exact: list) -> None:
    """ours within one ulp of the mpmath values `exact` (faithful rounding)."""
    want = np.array([nearest(t) for t in exact])
    assert np.all(np.abs(ours.reshape(-1) - want) <= np.spacing(np.abs(want))), (ours, want)


@pytest.mark.parametrize("kind", ["constant", "gates"])
def test_two_tokens_unnormalised_identity_by_hand(kind):
    # With w = w_10 (gamma or exp(g_1)), A_ij = c w_ij q_i.k_j and t_ij = G_i.v_j:
    # dv_0 = A_00 G_0 + A_10 G_1, dv_1 = A_11 G_1, dq_0 = c t_00 k_0,
    # dq_1 = c (w t_10 k_0 + t_11 k_1), dk_0 = c (t_00 q_0 + w t_10 q_1), dk_1 = c t_11 q_1,
    # dg_0 = 0, dg_1 = A_10 t_10 (dw_10/dg_1 = w_10).
    q, k, v, g_out, gamma, gates = _draw(1, 1, 2, 3, 2, seed=4)
    spec = Spec("identity", causal=True, normalize=False, scale=RSQRT_D, decay=kind)
    ours = reference_gradients(q, k, v, g_out, spec, decay=_decay(spec, gamma, gates))
    with mpmath.workprec(300):
        mp = mpmath.mp
        qs, ks, vs, gs = ([[mp.mpf(x) for x in row] for row in t[0, 0]] for t in (q, k, v, g_out))
        c = 1 / mp.sqrt(3)
        w = mp.mpf(gamma[0]) if kind == "constant" else mp.exp(mp.mpf(gates[0, 0, 1]))
        a = [[c * mp.fdot(qs[i], ks[j]) * (w if i > j else 1) for j in range(2)] for i in range(2)]
        t = [[mp.fdot(gs[i], vs[j]) for j in range(2)] for i in range(2)]

        def times(s, x):
            return [s * e for e in x]

        def plus(x, y):
            return [e + f for e, f in zip(x, y)]

        want = {
            "v": plus(times(a[0][0], gs[0]), times(a[1][0], gs[1])) + times(a[1][1], gs[1]),
            "q": times(c * t[0][0], ks[0])
            + plus(times(c * w * t[1][0], ks[0]), times(c * t[1][1], ks[1])),
            "k": plus(times(c * t[0][0], qs[0]), times(c * w * t[1][0], qs[1]))
            + times(c * t[1][1], qs[1]),
        }
        if kind == "gates":
            want["g"] = [mp.zero, a[1][0] * t[1][0]]
        for name, exact in want.items():
            _faithful(ours[name], exact)
    assert set(ours) == set(want) == set(gradient_names(spec))


def test_two_tokens_normalised_elu_gate_gradient_by_hand():
    # Row 1: D = A_10 + A_11, b_10 = G_1.(v_0 - out_1) / D, so dg_1 = b_10 A_10 =
    # A_10 A_11 G_1.(v_0 - v_1) / D^2 (eps = 0: the row's scale cancels); dg_0 = 0.
    q, k, v, g_out, _, gates = _draw(1, 1, 2, 3, 2, seed=5)
    spec = Spec("elu", causal=True, scale=RSQRT_D, decay="gates")
    ours = reference_gradients(q, k, v, g_out, spec, decay=gates)
    with mpmath.workprec(300):
        mp = mpmath.mp

        def phi(x):
            return [mp.mpf(t) + 1 if t > 0 else mp.exp(mp.mpf(t)) for t in x]

        c = 1 / mp.sqrt(3)
        a10 = c * mp.exp(mp.mpf(gates[0, 0, 1])) * mp.fdot(phi(q[0, 0, 1]), phi(k[0, 0, 0]))
        a11 = c * mp.fdot(phi(q[0, 0, 1]), phi(k[0, 0, 1]))
        diff = [mp.mpf(x) - mp.mpf(y) for x, y in zip(v[0, 0, 0], v[0, 0, 1])]
        dg1 = a10 * a11 * mp.fdot([mp.mpf(t) for t in g_out[0, 0, 1]], diff) / (a10 + a11) ** 2
        _faithful(ours["g"], [mp.zero, dg1])


@pytest.mark.parametrize("kind", ["constant", "gates"])
def test_a_decay_of_one_gives_the_undecayed_gradients(kind):
    q, k, v, g_out, _, _ = _draw(1, 2, 4, 3, 2, seed=6)
    ones = np.ones(2) if kind == "constant" else np.zeros((1, 2, 4))
    for normalize in (True, False):
        spec = Spec("elu", causal=True, normalize=normalize, scale=RSQRT_D)
        plain = reference_gradients(q, k, v, g_out, spec)
        decayed = Spec("elu", causal=True, normalize=normalize, scale=RSQRT_D, decay=kind)
        ours = reference_gradients(q, k, v, g_out, decayed, decay=ones)
        for name in plain:
            np.testing.assert_array_equal(ours[name], plain[name], err_msg=f"d{name}")


def test_the_scale_is_linear_unnormalised_and_cancels_normalised():
    q, k, v, g_out, _, gates = _draw(1, 1, 4, 2, 2, seed=7)
    for normalize, factor in ((False, 2.0), (True, 1.0)):
        one, two = (
            reference_gradients(
                q, k, v, g_out, Spec("relu", True, 0.0, normalize, c, "gates"), decay=gates
            )
            for c in (1.0, 2.0)
        )
        for name in one:
            np.testing.assert_array_equal(two[name], factor * one[name], err_msg=f"d{name}")


# ------------------------------------------------------- float64 autograd, golden form


@pytest.mark.parametrize("kind", ["constant", "gates"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("name", ["elu", "relu", "identity", "performer-positive"])
def test_golden_autograd_agrees_within_the_bound(name, normalize, kind):
    q, k, v, g_out, gamma, gates = _draw(1, 2, 5, 3, 2, seed=8)
    if name == "relu":  # no zero denominators
        q, k = np.abs(q) + 0.1, np.abs(k)
    w = RNG.standard_normal((4, 3)) if name == "performer-positive" else None
    spec = Spec(name, causal=True, normalize=normalize, scale=RSQRT_D, decay=kind)
    decay = torch.tensor(_decay(spec, gamma, gates))
    leaves = [torch.tensor(t, requires_grad=True) for t in (q, k, v)]
    if kind == "gates":
        decay.requires_grad_(True)
        leaves.append(decay)
    out = golden_attention(*leaves[:3], spec, w, decay=decay)
    grads = torch.autograd.grad(out, leaves, torch.tensor(g_out))
    grads = {n: t.numpy() for n, t in zip(gradient_names(spec), grads, strict=True)}
    x = validate(q, k, v, spec, w, decay.detach())
    exact = reference_gradients(q, k, v, g_out, spec, w, decay.detach())
    verdict = judge_gradients(
        grads, exact, gradient_magnitudes(x, spec, g_out), "float64", 2.0**-53, roundings(x, spec)
    )
    assert verdict.violations == 0, verdict.message
    # and as accurate as the budget's floor: K_BUDGET typical chains of one rounding each
    for n, error in verdict.max_error.items():
        assert error <= K_BUDGET * verdict.rounding_floor[n], (n, verdict.message)


# ------------------------------------------------------------------ the checks

CASE = Case(2, 2, 9, 3, 2, "float32", seed=3)
BUILT_IN = {
    "elu-chunked-gates": dict(form="chunked", feature_map="elu", decay="gates"),
    "identity-chunked-gates-unnormalised-scaled": dict(
        form="chunked", feature_map="identity", decay="gates", normalize=False, scale=RSQRT_D
    ),
    "elu-recurrent-constant-scaled": dict(
        form="recurrent", feature_map="elu", decay="constant", scale=RSQRT_D
    ),
}


@pytest.mark.parametrize("options", BUILT_IN.values(), ids=BUILT_IN.keys())
def test_the_gradient_checks_pass_the_built_in_decayed_forms(options):
    impl = resolve(causal=True, **options)
    for name in ("gradient", "gradient-causality", "gradient-associativity", "gradient-finite"):
        assert not_applicable(name, impl) is None, name
        result = GRAD_CHECKS[name](impl, CASE)
        assert result.passed, (name, result.message)
    if impl.spec.decay == "gates":
        assert "dg" in GRAD_CHECKS["gradient"](impl, CASE).message


def _gated(fn):
    return resolve(fn, feature_map="identity", causal=True, normalize=False, decay="gates")


def test_a_shifted_gate_gradient_fails_gradient_for_dg_alone():
    result = GRAD_CHECKS["gradient"](_gated(zoo.gates_dg_exclusive), CASE)
    assert not result.passed and "EXCEEDED by dg" in result.message, result.message
    assert result.figures["max_error_dg"] > 1e3 * result.figures["bound"], result.message
    for name in ("q", "k", "v"):  # within their budgets: dg alone is wrong
        assert result.figures[f"max_error_d{name}"] <= result.figures[f"budget_d{name}"]


def test_detached_gates_fail_gradient_and_say_dg_is_zero():
    result = GRAD_CHECKS["gradient"](
        _gated(lambda q, k, v, g: zoo.gates_segsum(q, k, v, g.detach())), CASE
    )
    assert not result.passed
    assert "dg is 0 everywhere: the output has no gradient in the log-gates" in result.message


def test_a_gate_gradient_reversed_in_time_fails_gradient_causality():
    def reversed_dg(q, k, v, g):
        return zoo.wrong_gate_gradient(q, k, v, g, lambda dg: dg.flip(-1))

    result = GRAD_CHECKS["gradient-causality"](_gated(reversed_dg), CASE)
    assert not result.passed and "dg:" in result.message, result.message
    correct = GRAD_CHECKS["gradient-causality"](_gated(zoo.gates_segsum), CASE)
    assert correct.passed and "dk, dv, dg of rows" in correct.message, correct.message


# ------------------------------------------------------------------ bad input


def test_a_cotangent_of_the_wrong_shape_is_a_one_line_spec_error():
    q, k, v, g_out, _, gates = _draw(1, 2, 4, 3, 2, seed=9)
    spec = Spec("identity", causal=True, normalize=False, decay="gates")
    with pytest.raises(SpecError, match=r"g must have the shape .*\(1, 2, 4, 2\)") as err:
        reference_gradients(q, k, v, g_out[..., :1], spec, decay=gates)
    assert "\n" not in str(err.value)
    with pytest.raises(SpecError, match="needs its decay: g"):
        reference_gradients(q, k, v, g_out, spec)


def test_an_exact_gradient_beyond_the_dtype_s_range_may_round_to_its_infinity():
    # unnormalised gradients grow with the inputs' squares: at float16's top, dv = A g_out
    # can exceed 65504, and inf of its sign is then its rounding, no error
    exact = {"v": np.array([[[[1e5, -2.0]]]])}
    scale = {"v": np.array([[[[1e5, 2.0]]]])}
    grads = {"v": np.array([[[[np.inf, -2.0]]]])}
    verdict = judge_gradients(grads, exact, scale, "float16", 2.0**-11, 40, [exact])
    assert verdict.passed and verdict.max_error["v"] == 0, verdict.message
    grads["v"][..., 0] = -np.inf
    assert not judge_gradients(grads, exact, scale, "float16", 2.0**-11, 40, [exact]).passed
