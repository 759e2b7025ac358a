"""Exact gradients of channel-gated specs (GLA, Yang et al. 2024, sec. 4.1): dL/dq, dL/dk,
dL/dv and dL/dg of the log-gates g (B, H, N, d) against float64 autograd through an
independent recurrence written here, their magnitudes, the scalar gates as the special case
of equal channels, and zero denominators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import gradient_names
from linattn_verify.cases import Case
from linattn_verify.families import validate
from linattn_verify.families.dispatch import (
    exact_gradients,
    exact_gradients_and_magnitudes,
    gradient_magnitudes,
    reference_gradients,
    roundings,
)
from linattn_verify.specs import RSQRT_D, Spec

KIND = "channel-gates"
SPECS = {  # (feature map, normalize, eps, scale)
    "identity-unnormalised-scaled": ("identity", False, 0.0, RSQRT_D),
    "elu-normalised": ("elu", True, 0.0, 1.0),
    "relu-normalised-eps": ("relu", True, 1e-3, 1.0),
}
SHAPES = {  # (B, H, N, d, dv, decay rate, seed): weak (~0.05) and strong (~3) gates
    "one-token": (1, 1, 1, 3, 2, 0.05, 1),
    "b2-n7-strong": (2, 1, 7, 4, 3, 3.0, 2),
    "h2-n13-weak": (1, 2, 13, 3, 2, 0.05, 3),
    "h2-n13-strong": (1, 2, 13, 4, 3, 3.0, 4),
}
PHI = {
    "identity": lambda x: x,
    "elu": lambda x: torch.nn.functional.elu(x) + 1,
    "relu": torch.relu,
}


def _spec(name: str, normalize: bool, eps: float, scale, kind: str = KIND) -> Spec:
    return Spec(name, causal=True, eps=eps, normalize=normalize, scale=scale, decay=kind)


def _draw(b, h, n, d, dv, rate, seed):
    """q, k, v (B, H, N, .), channel log-gates g (B, H, N, d) <= 0, and a cotangent g_out."""
    case = Case(b, h, n, d, dv, "float64", "normal", 1.0, seed, None, "cpu", decay_rate=rate)
    q, k, v, _ = case.tensors()
    g = case.decay(KIND)
    g_out = np.random.default_rng(seed).standard_normal((b, h, n, dv))
    return q, k, v, g, g_out


def _recurrent(q, k, v, g, name: str, normalize: bool, eps: float, c: float) -> torch.Tensor:
    """GLA's recurrent form, token by token: S_t = diag(exp g_t) S_(t-1) + phi(k_t) v_t^T,
    z_t = exp(g_t) * z_(t-1) + phi(k_t), o_t = c phi(q_t)^T S_t, divided by
    eps + c phi(q_t) . z_t when normalised. Written from the definition, sharing nothing
    with the reference (no prefix sums, no quadratic form)."""
    fq, fk = PHI[name](q), PHI[name](k)
    b, h, n, d = q.shape
    state = torch.zeros(b, h, d, v.shape[-1], dtype=torch.float64)
    z = torch.zeros(b, h, d, dtype=torch.float64)
    outs = []
    for t in range(n):
        alpha = torch.exp(g[:, :, t])
        state = alpha[..., None] * state + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z = alpha * z + fk[:, :, t]
        out = c * torch.einsum("bhm,bhmc->bhc", fq[:, :, t], state)
        if normalize:
            out = out / (eps + c * (fq[:, :, t] * z).sum(-1, keepdim=True))
        outs.append(out)
    return torch.stack(outs, 2)


def _autograd(q, k, v, g, g_out, name, normalize, eps, c) -> dict[str, np.ndarray]:
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, g)]
    out = _recurrent(*leaves, name, normalize, eps, c)
    grads = torch.autograd.grad(out, leaves, torch.tensor(g_out))
    return {n: t.numpy() for n, t in zip("qkvg", grads, strict=True)}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("options", SPECS.values(), ids=SPECS.keys())
def test_exact_gradients_agree_with_autograd_of_the_recurrence(options, shape):
    name, normalize, eps, scale = options
    b, h, n, d, dv, _, _ = shape
    q, k, v, g, g_out = _draw(*shape)
    spec = _spec(name, normalize, eps, scale)
    x = validate(q, k, v, spec, None, g)
    exact, mags = exact_gradients_and_magnitudes(x, spec, g_out)
    assert gradient_names(spec) == ("q", "k", "v", "g") == tuple(exact) == tuple(mags)
    want = {"q": (n, d), "k": (n, d), "v": (n, dv), "g": (n, d)}
    for key, value in exact.items():
        assert value.shape == mags[key].shape == (b, h, *want[key]), key
    # dL/dg_0m is an empty sum: no key precedes token 0
    assert np.all(exact["g"][..., 0, :] == 0)
    # M is a finite sum of absolute values, so it bounds the exact value
    for key in exact:
        assert np.all(np.isfinite(exact[key])) and np.all(np.isfinite(mags[key])), key
        assert np.all(mags[key] >= np.abs(exact[key])), key
    grads = _autograd(q, k, v, g, g_out, name, normalize, eps, spec.scale_for(d))
    # The recurrence in float64 errs by at most about n u M to first order, n the number of
    # roundings on any path (`roundings` is a generous bound on it for any evaluation, a
    # recurrence included: a few hundred here) and M the magnitude, which bounds the sum of
    # the absolute values of what the recurrence's forward and backward combine (the same
    # products, grouped differently; exp g_t rounded once per step). The reference itself
    # is within half an ulp. M + |exact| keeps the bound meaningful where M rounds down.
    # Measured: below one ulp of M for all these cases.
    n_roundings = roundings(x, spec)
    assert 100 < n_roundings < 1000, n_roundings
    for key in exact:
        error = np.abs(grads[key] - exact[key])
        bound = n_roundings * 2.0**-53 * (mags[key] + np.abs(exact[key]))
        worst = np.unravel_index(np.argmax(error - bound), error.shape)
        assert np.all(error <= bound), (key, worst, grads[key][worst], exact[key][worst])


def test_the_comparison_tells_a_shifted_gate_gradient_apart():
    # The bound is not vacuous: the gate gradient of the neighbouring token (dg_(t+1) in
    # place of dg_t, an off-by-one in the prefix sums' backward) is far outside it.
    shape = SHAPES["h2-n13-weak"]
    q, k, v, g, g_out = _draw(*shape)
    spec = _spec("elu", True, 0.0, 1.0)
    x = validate(q, k, v, spec, None, g)
    exact, mags = exact_gradients_and_magnitudes(x, spec, g_out)
    grads = _autograd(q, k, v, g, g_out, "elu", True, 0.0, 1.0)
    bound = roundings(x, spec) * 2.0**-53 * (mags["g"] + np.abs(exact["g"]))
    assert np.all(np.abs(grads["g"] - exact["g"]) <= bound)
    shifted = np.roll(grads["g"], -1, axis=2)
    assert np.mean(np.abs(shifted - exact["g"]) > 1e6 * bound) > 0.5


def test_the_public_functions_agree_with_each_other():
    q, k, v, g, g_out = _draw(*SHAPES["b2-n7-strong"])
    spec = _spec("relu", True, 1e-3, 1.0)
    x = validate(q, k, v, spec, None, g)
    exact, mags = exact_gradients_and_magnitudes(x, spec, g_out)
    alone = exact_gradients(x, spec, g_out)
    through = reference_gradients(q, k, v, g_out, spec, decay=g)
    magnitudes = gradient_magnitudes(x, spec, g_out)
    for key in gradient_names(spec):
        np.testing.assert_array_equal(alone[key], exact[key], err_msg=key)
        np.testing.assert_array_equal(through[key], exact[key], err_msg=key)
        np.testing.assert_array_equal(magnitudes[key], mags[key], err_msg=key)


@pytest.mark.parametrize("options", SPECS.values(), ids=SPECS.keys())
def test_equal_channels_are_the_scalar_gates(options):
    # g_tm = g_t for every m: W_ijm = w_ij, so dq, dk, dv are the scalar gates' and
    # sum_m dL/dg_tm is their dL/dg_t (both faithful roundings: within an ulp or two)
    name, normalize, eps, scale = options
    q, k, v, _, g_out = _draw(*SHAPES["h2-n13-strong"])
    uniform = 1 - torch.rand(1, 2, 13, generator=torch.Generator().manual_seed(5), dtype=q.dtype)
    scalar = 3 * torch.log(uniform)  # (0, 1]: strong scalar gates, <= 0
    channels = scalar[..., None].expand(*q.shape).contiguous()
    spec = _spec(name, normalize, eps, scale)
    ours = reference_gradients(q, k, v, g_out, spec, decay=channels)
    theirs = reference_gradients(
        q, k, v, g_out, _spec(name, normalize, eps, scale, "gates"), decay=scalar
    )
    for key in ("q", "k", "v"):
        ulps = np.abs(ours[key] - theirs[key]) / np.spacing(np.abs(theirs[key]))
        assert np.all(ulps <= 1), (key, ulps.max())
    summed = ours["g"].sum(-1)  # d float64 additions of faithful roundings
    tolerance = 8 * 2.0**-52 * (np.abs(ours["g"]).sum(-1) + np.abs(theirs["g"]))
    assert np.all(np.abs(summed - theirs["g"]) <= tolerance)


def test_a_zero_denominator_makes_its_row_its_keys_and_earlier_gates_nan():
    # relu, normalised, eps = 0: q_3 <= 0 gives D_3 = 0, so out_3 = 0/0: dq_3, dk_j and
    # dv_j for j <= 3, and every channel of dg_t for t <= 3 are NaN; the rest is finite.
    q, k, v, g, g_out = _draw(1, 1, 6, 3, 2, 0.5, 6)
    q = q.abs()
    q[0, 0, 3] = -q[0, 0, 3]
    spec = _spec("relu", True, 0.0, 1.0)
    x = validate(q, k, v, spec, None, g)
    exact, mags = exact_gradients_and_magnitudes(x, spec, g_out)
    rows = {"q": [3], "k": [0, 1, 2, 3], "v": [0, 1, 2, 3], "g": [0, 1, 2, 3]}
    for key, nan_rows in rows.items():
        for values in (exact[key], mags[key]):
            nan = np.isnan(values[0, 0])
            assert np.all(nan[nan_rows]), key
            assert not np.any(np.delete(nan, nan_rows, axis=0)), key
