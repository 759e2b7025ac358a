"""Certified gradients (reference/certified_grad.py) against the exact ones of
reference/grad.py: every element within its bound, the bound below 2^-30 of the magnitude
M (useful for float32), M equal to gradient_magnitudes', across sub-chunks, chunks and
steps (shrunk), for every decay of the unnormalised identity specs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import family_of, validate
from linattn_verify.families.dispatch import exact_gradients_and_magnitudes
from linattn_verify.families.kernelised.certified_gradients import certified_gradients
from linattn_verify.reference.certified_grad import covered
from linattn_verify.specs import FEATURE_MAPS, RSQRT_D, Spec, SpecError

B, H, D, DV = 1, 2, 4, 3
# (decay, scale, log-gates per token (gamma for constant)): strong gates kill the state in
# a token (and underflow past 15), weak ones barely decay
CASES = [
    (None, 1.0, None),
    ("constant", RSQRT_D, 0.8),
    ("constant", 0.3, 0.05),
    ("gates", RSQRT_D, -50.0),
    ("gates", 1.0, -1e-6),
    ("gates", 0.3, "random"),
    ("channel-gates", RSQRT_D, "random"),
    ("channel-gates", 0.3, -50.0),
    ("channel-gates", 1.0, -1e-6),
]


def _case(decay, scale, gates, n: int = 45, seed: int = 0):
    """(inputs, spec, g_out) from float64 torch tensors."""
    rng = np.random.default_rng(seed)
    spec = Spec("identity", causal=True, normalize=False, scale=scale, decay=decay)
    q, k = rng.normal(size=(2, B, H, n, D))
    v, g_out = rng.normal(size=(2, B, H, n, DV))
    shape = {"constant": (H,), "gates": (B, H, n), "channel-gates": (B, H, n, D)}.get(decay)
    if decay is None:
        given = None
    elif decay == "constant":
        given = np.full(shape, gates) * np.linspace(1, 0.9, H)
    elif gates == "random":
        given = -rng.exponential(0.2, shape)
    else:
        given = np.full(shape, gates)
    given = None if given is None else torch.tensor(given)
    x = validate(*(torch.tensor(t) for t in (q, k, v)), spec, None, given)
    return x, spec, g_out


@pytest.mark.parametrize(("decay", "scale", "gates"), CASES)
def test_within_the_bound_certified_for_float32_and_magnitudes_as_grad_py(
    small_chunks, decay, scale, gates
):
    x, spec, g_out = _case(decay, scale, gates)
    exact, mags_exact = exact_gradients_and_magnitudes(x, spec, g_out)
    grads, bounds, mags = certified_gradients(x, spec, g_out)
    assert set(grads) == set(bounds) == set(mags) == set(exact)
    for name, want in exact.items():
        assert grads[name].shape == bounds[name].shape == mags[name].shape == want.shape
        assert np.all(np.abs(grads[name] - want) <= bounds[name]), name
        assert np.all(bounds[name] <= 2.0**-30 * mags_exact[name]), name
        np.testing.assert_allclose(mags[name], mags_exact[name], rtol=1e-12, atol=0, err_msg=name)


@pytest.mark.parametrize("decay", ["constant", "gates", "channel-gates"])
def test_one_token(decay):
    x, spec, g_out = _case(decay, 1.0, -0.5 if decay != "constant" else 0.5, n=1)
    exact, mags_exact = exact_gradients_and_magnitudes(x, spec, g_out)
    grads, bounds, mags = certified_gradients(x, spec, g_out)
    for name, want in exact.items():
        assert np.all(np.abs(grads[name] - want) <= bounds[name]), name
        np.testing.assert_allclose(mags[name], mags_exact[name], rtol=1e-12, atol=0)


def test_gates_one_token_off_break_the_bound(small_chunks):
    """The bound is tight enough to catch a gate applied one token off (the reversed
    sequence's shift): the certificate fails against the exact gradients then."""
    assert_shifted_gates_break_the_bound(*_case("gates", 1.0, "random"))


def assert_shifted_gates_break_the_bound(x, spec, g_out) -> None:
    """The certificate of the gates rolled by one token fails against the exact gradients
    in every tensor."""
    exact, _ = exact_gradients_and_magnitudes(x, spec, g_out)
    shifted = validate(x.q, x.k, x.v, spec, None, np.roll(x.decay, 1, axis=-1))
    grads, bounds, _ = certified_gradients(shifted, spec, g_out)
    assert all(np.any(np.abs(grads[n] - exact[n]) > bounds[n]) for n in "qkvg")


def certified_against_exact(x, spec, g_out) -> tuple[dict, ...]:
    """(grads, bounds, mags, exact, exact_mags, undefined) of certified_gradients and
    grad.py's exact_gradients_and_magnitudes, having asserted what every certified
    gradient owes: the same names and shapes, NaN where the exact one is (a 0/0 row) and
    nowhere else but under an infinite bound, and every other element within its bound (an
    infinite one: a denominator not resolved)."""
    exact, exact_mags = exact_gradients_and_magnitudes(x, spec, g_out)
    grads, bounds, mags, _ = family_of(spec).certified_gradients(x, spec, g_out)
    assert set(grads) == set(bounds) == set(mags) == set(exact)
    undefined = {}
    for name, want in exact.items():
        assert grads[name].shape == bounds[name].shape == mags[name].shape == want.shape
        nan = undefined[name] = np.isnan(want)
        assert np.all(np.isnan(grads[name][nan])), name
        assert not np.any(np.isnan(grads[name]) & ~nan & (bounds[name] < np.inf)), name
        ok = (np.abs(grads[name] - want) <= bounds[name]) | (bounds[name] == np.inf)
        assert np.all(ok[~nan]), (name, np.argwhere(~ok & ~nan)[:5])
    return grads, bounds, mags, exact, exact_mags, undefined


def test_the_delta_rule_is_refused_naming_its_module():
    spec = Spec("identity", causal=True, normalize=False, delta_rule=True)
    assert not covered(spec)
    beta = np.ones((1, 1, 2, 1))  # inputs.pack_delta's layout
    x = validate(*np.ones((3, 1, 1, 2, 2)), spec, None, beta)
    with pytest.raises(SpecError, match=r"Family\.certified_gradients"):
        certified_gradients(x, spec, np.ones((1, 1, 2, 2)))


@pytest.mark.parametrize("name", sorted(FEATURE_MAPS))
def test_every_map_is_covered(name):
    assert covered(Spec(name, causal=True))
