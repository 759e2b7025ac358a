"""Certified gradients of softmax (families/softmax/certified_gradients.py) against the exact
ones of reference/grad.py: every element within its bound, the bound below CERTIFIED_SHARE
of grad.py's magnitude M on typical inputs and M equal to grad.py's, across row blocks
(shrunk), causal or not, eps and scales, more keys than queries; logits large enough that
most weights underflow; the causal certificate fails against the non-causal gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.families.dispatch import exact_gradients_and_magnitudes
from linattn_verify.families.softmax import certified_gradients as certified_grad_softmax
from linattn_verify.families.softmax.certified_gradients import certified_gradients
from linattn_verify.reference.certified import CERTIFIED_SHARE
from linattn_verify.specs import RSQRT_D, Spec
from tests.test_certified_grad import certified_against_exact

B, H, D, DV = 1, 2, 4, 3


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 8 query rows: 21 rows cross three, the last ragged."""
    monkeypatch.setattr(certified_grad_softmax, "ROWS", 8)


def _case(spec: Spec, n=21, keys=None, seed=0, qk=1.0):
    """(inputs, g_out): q, k ~ N(0, 1) times qk, v, g_out ~ N(0, 1); `keys` keys (n if None)."""
    rng = np.random.default_rng(seed)
    keys = n if keys is None else keys
    q = rng.normal(size=(B, H, n, D)) * qk
    k = rng.normal(size=(B, H, keys, D)) * qk
    v, g_out = rng.normal(size=(B, H, keys, DV)), rng.normal(size=(B, H, n, DV))
    return validate(*(torch.tensor(t) for t in (q, k, v)), spec, None, None), g_out


def _check(x, spec, g_out, tight=True):
    """certified_against_exact (q, k, v), every bound finite (a row in units of its largest
    logit or eps has a denominator of about 1 at least); `tight`: bound <= CERTIFIED_SHARE
    M (what gradient-length judges) and M equal to grad.py's (the module computes it dense)."""
    _, bounds, mags, _, exact_mags, _ = certified_against_exact(x, spec, g_out)
    assert set(bounds) == {"q", "k", "v"}
    for name, bound in bounds.items():
        assert np.all(np.isfinite(bound)), name
        if tight:
            assert np.all(bound <= CERTIFIED_SHARE * exact_mags[name]), name
            np.testing.assert_allclose(mags[name], exact_mags[name], rtol=1e-12, atol=0)


SPECS = [
    Spec("softmax", causal=True),
    Spec("softmax"),
    Spec("softmax", causal=True, eps=1e-3, scale=0.3),
    Spec("softmax", eps=0.5, scale=RSQRT_D),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_within_the_bound_certified_and_magnitudes_as_grad_py(small_blocks, spec):
    x, g_out = _case(spec)
    _check(x, spec, g_out)


def test_more_keys_than_queries(small_blocks):
    spec = Spec("softmax")
    x, g_out = _case(spec, n=9, keys=30, seed=1)
    _check(x, spec, g_out)


@pytest.mark.parametrize("qk", [6.0, 1e-150])
def test_large_and_tiny_logits_within_the_bound(small_blocks, qk):
    """qk 6: logits to +-150, most weights of a row underflow; 1e-150: every weight 1."""
    spec = Spec("softmax", causal=True, eps=1e-6)
    x, g_out = _case(spec, seed=2, qk=qk)
    _check(x, spec, g_out, tight=False)


def test_one_token():
    spec = Spec("softmax", causal=True)
    x, g_out = _case(spec, n=1)
    _check(x, spec, g_out)


def test_the_causal_certificate_breaks_the_bound(small_blocks):
    """The bound tells the causal sums from the non-causal ones in every tensor."""
    spec = Spec("softmax")
    x, g_out = _case(spec, n=12)
    exact, _ = exact_gradients_and_magnitudes(x, spec, g_out)
    causal = Spec("softmax", causal=True)
    grads, bounds, _ = certified_gradients(validate(x.q, x.k, x.v, causal), causal, g_out)
    assert all(np.any(np.abs(grads[n] - exact[n]) > bounds[n]) for n in "qkv")


@pytest.mark.parametrize("eps", [0.0, 1.0])
def test_rows_whose_logits_are_all_below_exp_range(eps):
    """Every logit below -709 (exp(-max) overflows): the row in units of the larger of its
    largest logit and ln eps stays resolved (a review's counterexample, once silently 0)."""
    spec = Spec("softmax", causal=True, eps=eps)
    q = torch.tensor([[[[1.0], [1.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[-800.0], [-801.0]]]], dtype=torch.float64)
    v = torch.tensor([[[[1e3], [-1e3]]]], dtype=torch.float64)
    _check(validate(q, k, v, spec), spec, np.full((1, 1, 2, 1), 1e3), tight=False)


def test_products_that_underflow_are_bounded():
    """Tiny q, k and a cotangent of 1e-300: dq's and dk's products fall below 2^-1022."""
    spec = Spec("softmax")
    x, g_out = _case(spec, seed=1, qk=2.0**-60)
    _check(x, spec, g_out * 1e-300, tight=False)
