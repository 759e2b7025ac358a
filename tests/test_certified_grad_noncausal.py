"""Certified gradients of the non-causal specs (reference/certified_grad.py's and
families/kernelised/certified_gradients.py's "Non-causal") against the exact ones of
reference/grad.py: every element within its bound (NaN where grad.py's is), the bound below
2^-30 of grad.py's magnitude M on typical inputs, M equal to grad.py's (unnormalised, and dv
normalised) or M <= M' <= 2 M (normalised dq, dk: 1 + M(D) / D <= 2 without a decay), across
sub-chunks, chunks and steps of the padded 2N-token chain (shrunk); adversarial magnitudes
and denominators; the causal certificate fails against the non-causal gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.families.dispatch import exact_gradients_and_magnitudes
from linattn_verify.families.kernelised.certified_gradients import certified_gradients
from linattn_verify.specs import RSQRT_D, Spec
from tests.test_certified_grad_normalised import ADVERSARIAL, _check

B, H, D, DV = 1, 2, 4, 3


def _case(spec: Spec, n: int, seed=0, shift=0.0, qk=1.0, values=1.0, keys=None):
    """(inputs, g_out) from float64 tensors: n queries and `keys` keys (n if None), q, k ~
    N(shift, 1) times qk, v times values."""
    rng = np.random.default_rng(seed)
    keys = n if keys is None else keys
    q = (rng.normal(size=(B, H, n, D)) + shift) * qk
    k = (rng.normal(size=(B, H, keys, D)) + shift) * qk
    v, g_out = rng.normal(size=(B, H, keys, DV)), rng.normal(size=(B, H, n, DV))
    x = validate(*(torch.tensor(t) for t in (q, k, v * values)), spec, None, None)
    return x, g_out


@pytest.mark.parametrize(("scale", "n", "seed"), [(1.0, 5, 0), (RSQRT_D, 23, 1), (0.3, 40, 2)])
def test_unnormalised_identity_within_the_bound_and_magnitudes_as_grad_py(
    small_chunks, scale, n, seed
):
    spec = Spec("identity", normalize=False, scale=scale)
    x, g_out = _case(spec, n, seed)
    exact, mags_exact = exact_gradients_and_magnitudes(x, spec, g_out)
    grads, bounds, mags = certified_gradients(x, spec, g_out)
    assert set(grads) == set(bounds) == set(mags) == set(exact) == set("qkv")
    for name, want in exact.items():
        assert grads[name].shape == bounds[name].shape == mags[name].shape == want.shape
        assert np.all(np.abs(grads[name] - want) <= bounds[name]), name
        assert np.all(bounds[name] <= 2.0**-30 * mags_exact[name]), name
        np.testing.assert_allclose(mags[name], mags_exact[name], rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize(("queries", "keys"), [(7, 19), (19, 6)])
@pytest.mark.parametrize(
    "spec", [Spec("identity", normalize=False, scale=0.3), Spec("elu"), Spec("relu", eps=0.1)]
)
def test_as_many_queries_as_keys_or_not(small_chunks, spec, queries, keys):
    x, g_out = _case(spec, queries, seed=6, shift=0.5, keys=keys)
    _check(x, spec, g_out, spread=1.0)


@pytest.mark.parametrize(
    ("fm", "eps", "scale", "n", "seed"),
    [
        ("elu", 0.0, 1.0, 21, 0),
        ("elu", 0.5, RSQRT_D, 37, 1),
        ("relu", 0.0, 0.3, 21, 2),
        ("relu", 1e-3, RSQRT_D, 30, 3),
    ],
)
def test_normalised_within_the_bound_and_magnitudes_bound_grad_pys(
    small_chunks, fm, eps, scale, n, seed
):
    spec = Spec(fm, eps=eps, scale=scale)
    # relu with q, k ~ N(0.5, 1): few rows without a shared positive feature (0/0)
    x, g_out = _case(spec, n, seed, shift=0.5 * (fm == "relu"))
    _check(x, spec, g_out, spread=1.0)  # sigma = 1: M' <= (1 + M(D) / D) M <= 2 M


@pytest.mark.parametrize(("fm", "qk", "values"), ADVERSARIAL)
def test_adversarial_magnitudes_within_the_bound(small_chunks, fm, qk, values):
    """As the causal ones; an infinite feature now reaches every row (infinite bounds)."""
    for eps in (0.0, 1e-3):
        spec = Spec(fm, eps=eps)
        x, g_out = _case(spec, 17, shift=0.3, qk=qk, values=values)
        with np.errstate(all="ignore"):
            _check(x, spec, g_out)


def test_unnormalised_adversarial_magnitudes_within_the_bound(small_chunks):
    """Identity features of 1e-160 (products underflowing) and 1e150 (near overflow)."""
    for qk, values in ((1e-160, 1.0), (1e150, 1e-200)):
        spec = Spec("identity", normalize=False)
        x, g_out = _case(spec, 11, qk=qk, values=values)
        exact, _ = exact_gradients_and_magnitudes(x, spec, g_out)
        grads, bounds, _ = certified_gradients(x, spec, g_out)
        for name, want in exact.items():
            assert np.all(np.abs(grads[name] - want) <= bounds[name]), name


def test_relu_zero_denominator_makes_every_key_nan():
    """relu, eps = 0: a query with no positive feature is 0/0, and non-causal it uses every
    key: dk and dv NaN everywhere (grad.py's), dq NaN in that row, the rest within bound."""
    spec = Spec("relu")
    x, g_out = _case(spec, 9, seed=5, shift=0.5)
    q = x.q.copy()
    q[0, 0, 4] = -1.0
    x = validate(q, x.k, x.v, spec, None, None)
    with np.errstate(all="ignore"):
        grads, _ = _check(x, spec, g_out)
    assert np.isnan(grads["k"][0, 0]).all() and np.isnan(grads["v"][0, 0]).all()
    assert np.isnan(grads["q"][0, 0, 4]).all() and not np.isnan(grads["q"][0, 1]).any()


def test_near_zero_denominator_row(small_chunks):
    """A query whose only positive feature meets keys' tiny ones: D_i near 0 (eps = 0)."""
    spec = Spec("relu")
    x, g_out = _case(spec, 13, seed=4, shift=0.5)
    q = x.q.copy()
    q[0, 0, 5] = [1e-200, -1.0, -1.0, -1.0]
    x = validate(q, x.k, x.v, spec, None, None)
    with np.errstate(all="ignore"):
        _check(x, spec, g_out)


@pytest.mark.parametrize(
    "spec", [Spec("identity", normalize=False), Spec("elu", eps=0.1), Spec("relu")], ids=str
)
def test_one_token(spec):
    x, g_out = _case(spec, 1, shift=1.0)
    _check(x, spec, g_out)


@pytest.mark.parametrize("spec", [Spec("identity", normalize=False), Spec("elu")], ids=str)
def test_the_causal_certificate_breaks_the_bound(small_chunks, spec):
    """The bound is tight enough to tell the causal sums from the non-causal ones: the
    causal spec's certificate fails against the non-causal gradients in every tensor."""
    x, g_out = _case(spec, 12)
    exact, _ = exact_gradients_and_magnitudes(x, spec, g_out)
    causal = Spec(spec.feature_map, causal=True, normalize=spec.normalize)
    grads, bounds, _ = certified_gradients(validate(x.q, x.k, x.v, causal), causal, g_out)
    assert all(np.any(np.abs(grads[n] - exact[n]) > bounds[n]) for n in "qkv")
