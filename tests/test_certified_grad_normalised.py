"""Certified gradients of the normalised elu and relu specs
(families/kernelised/certified_gradients.py) against the exact ones of reference/grad.py: every
element within its bound (NaN where grad.py's is), the bound below 2^-30 of grad.py's
magnitude M on typical inputs, dv's M equal to grad.py's and dq's,
dk's, dg's M' between M and (1 + max sigma) M (the upper bound the module states), across
sub-chunks, chunks and steps (shrunk), every decay, scale and eps; adversarial magnitudes
and denominators."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.specs import RSQRT_D, Spec
from tests.test_certified_grad import (
    assert_shifted_gates_break_the_bound,
    certified_against_exact,
)

B, H, D, DV = 1, 2, 4, 3
# (decay, scale, log-gates per token (gamma for constant)), as test_certified_grad.py's
DECAYS = [
    (None, 1.0, None),
    ("constant", RSQRT_D, 0.8),
    ("gates", 0.3, "random"),
    ("gates", RSQRT_D, -50.0),
    ("channel-gates", RSQRT_D, "random"),
    ("channel-gates", 1.0, -1e-6),
]


def _case(fm, decay, scale, gates, eps, n=21, seed=0, shift=0.0, qk=1.0, values=1.0):
    """(inputs, spec, g_out, the largest spread 1 + M(ln w)) from float64 tensors; q and k
    are N(shift, 1) times qk, v times `values`."""
    rng = np.random.default_rng(seed)
    spec = Spec(fm, causal=True, eps=eps, scale=scale, decay=decay)
    q, k = (rng.normal(size=(2, B, H, n, D)) + shift) * qk
    v, g_out = rng.normal(size=(2, B, H, n, DV))
    v *= values
    shape = {"constant": (H,), "gates": (B, H, n), "channel-gates": (B, H, n, D)}.get(decay)
    spread = 1.0
    if decay is None:
        given = None
    elif decay == "constant":
        given = np.full(shape, gates) * np.linspace(1, 0.9, H)
        spread = 1 + (n - 1) * float(np.max(-np.log(given)))
    else:
        given = -rng.exponential(0.2, shape) if gates == "random" else np.full(shape, gates)
        spread = 1 + 2 * float(np.max(np.sum(-given, axis=2)))
    given = None if given is None else torch.tensor(given)
    x = validate(*(torch.tensor(t) for t in (q, k, v)), spec, None, given)
    return x, spec, g_out, spread


def _check(x, spec, g_out, spread=None, tight=True):
    """certified_against_exact, M NaN where grad.py's is; with spread, where certified: M <=
    M' <= (1 + spread) M, dv's M' = M (it differs by |D| taken as its certified lower bound
    D^ - e_D, whose share of D these inputs keep negligible), and bound <= 2^-30 M; not
    `tight`: M <= M' only (a denominator's certificate too loose for either)."""
    grads, bounds, mags, _, exact_mags, undefined = certified_against_exact(x, spec, g_out)
    for name, nan in undefined.items():
        assert np.all(np.isnan(mags[name][nan])), name
        if spread is None:
            continue
        # M' where certified: an infinite bound (a denominator not resolved) leaves M' out
        certified = ~nan & (bounds[name] < np.inf)
        m, mine = exact_mags[name][certified], mags[name][certified]
        assert np.all(mine >= m * (1 - 1e-12)), name
        if not tight:
            continue
        assert np.all(bounds[name][certified] <= 2.0**-30 * m), name
        if name == "v":
            np.testing.assert_allclose(mine, m, rtol=1e-12, atol=0, err_msg=name)
        else:
            assert np.all(mine <= (1 + spread) * m * (1 + 1e-12)), name
    return grads, bounds


@pytest.mark.parametrize("eps", [0.0, 0.5])
@pytest.mark.parametrize(("decay", "scale", "gates"), DECAYS)
@pytest.mark.parametrize("fm", ["elu", "relu"])
def test_within_the_bound_certified_for_float32_and_magnitudes_bound_grad_pys(
    small_chunks, fm, decay, scale, gates, eps
):
    # relu with q, k ~ N(0.5, 1): few rows without a shared positive feature (0/0)
    x, spec, g_out, spread = _case(fm, decay, scale, gates, eps, shift=0.5 * (fm == "relu"))
    # relu's zero features with gates of -50: a column of dphi, and a denominator, fed only
    # by keys decayed by e^-50 and more, whose bound is decayed_sums' exponent term c_h
    # sqrt(w) H (certified_decay.py): not below 2^-30 M, and dv's M' up to 2.5e-4 above M
    strong = fm == "relu" and gates == -50.0
    _check(x, spec, g_out, spread, tight=not strong)


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("fm", ["elu", "relu"])
def test_other_seeds_and_length(small_chunks, fm, seed):
    x, spec, g_out, spread = _case(fm, "gates", RSQRT_D, "random", 1e-3, n=37, seed=seed)
    _check(x, spec, g_out, spread)


# (feature map, q and k times, v times)
ADVERSARIAL = [
    ("elu", 1e-150, 1.0),  # features 1 + tiny: all similar
    ("elu", 1e100, 1e200),  # features overflowing to inf or underflowing to 0
    ("elu", 700.0, 1e-300),  # huge features (e^-700 .. 700), subnormal values
    ("relu", 1e-160, 1.0),  # similarities 1e-320: subnormal denominators
    ("relu", 1e150, 1e-200),  # similarities 1e300
]


@pytest.mark.parametrize(("fm", "qk", "values"), ADVERSARIAL)
def test_adversarial_magnitudes_within_the_bound(small_chunks, fm, qk, values):
    for eps in (0.0, 1e-3):
        x, spec, g_out, _ = _case(fm, "gates", 1.0, "random", eps, shift=0.3, qk=qk, values=values)
        with np.errstate(all="ignore"):
            _check(x, spec, g_out)


def test_relu_zero_denominators_are_nan_where_grad_pys_are(small_chunks):
    """relu with eps = 0 and q, k ~ N(0, 1): rows without a shared positive feature are
    0/0; the keys they use and dL/dg up to them are NaN, the rest within the bound."""
    x, spec, g_out, _ = _case("relu", "gates", 1.0, "random", 0.0, shift=-0.3, seed=3)
    grads, _ = _check(x, spec, g_out)
    assert np.isnan(grads["q"]).any()


def test_near_zero_denominator_rows(small_chunks):
    """A query whose only positive feature meets keys' tiny ones: D_i near 0 (eps = 0)."""
    x, spec, g_out, _ = _case("relu", None, 1.0, None, 0.0, shift=0.5, seed=4)
    q = x.q.copy()
    q[0, 0, 5] = [1e-200, -1.0, -1.0, -1.0]
    x = validate(q, x.k, x.v, spec, None, None)
    with np.errstate(all="ignore"):
        _check(x, spec, g_out)


@pytest.mark.parametrize("decay", [None, "constant", "gates", "channel-gates"])
@pytest.mark.parametrize("fm", ["elu", "relu"])
def test_one_token(fm, decay):
    gates = {"constant": 0.5}.get(decay, -0.5)
    x, spec, g_out, _ = _case(fm, decay, 1.0, gates, 0.1, n=1, shift=1.0)
    _check(x, spec, g_out)


def test_gates_one_token_off_break_the_bound(small_chunks):
    """The bound catches a gate applied one token off (the reversed sequence's shift)."""
    x, spec, g_out, _ = _case("elu", "gates", 1.0, "random", 0.0)
    assert_shifted_gates_break_the_bound(x, spec, g_out)
