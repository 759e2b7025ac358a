"""Certified delta-rule gradients (families/delta/certified_gradients.py) against the exact ones
of families/delta/gradients.py (arb, correctly rounded): every element within its bound, for
every decay (none, gates, channel gates), qk_l2norm or not, beta near 0 and near 2, keys of
norm 3, nearly parallel keys, tiny (gradual underflow) and large magnitudes, scales, with
and without S_0 and G_S, across checkpoint blocks (shrunk to 4 tokens); the bound far below
2^-34 of the magnitudes M (delta_gradient_magnitudes) at length; names, shapes, bad input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.families.delta import certified_gradients as cdg
from linattn_verify.families.delta.certified_gradients import certified_delta_gradients
from linattn_verify.families.delta.gradient_bound import delta_gradient_magnitudes
from linattn_verify.families.delta.gradients import exact_delta_gradients
from linattn_verify.families.delta.inputs import pack_delta
from linattn_verify.specs import RSQRT_D, Spec, SpecError
from tests.test_delta_grad_reference import _spec, typical_draws

DECAYS = [None, "gates", "channel-gates"]
KINDS = [
    "typical",
    "beta-near-0",
    "beta-near-2",
    "keys-of-norm-3",
    "parallel-keys",
    "tiny",
    "large",
    "strong-gates",
]
# (initial_state given, G_S given)
STATES = [(False, False), (True, False), (False, True), (True, True)]
# bound / M of every element at length, far below the 2^-34 the caller leaves elements out
# at: measured 4e-16 at most (N = 256 to 4096, d = dv = 16), about (d + dv) u
LENGTH_RATIO = 2.0**-40


def _case(decay, l2, seed, kind="typical", n=17, d=4, dv=3, b=1, h=2, s0=False, gs=False,
          scale=RSQRT_D):  # fmt: skip
    """(x, spec, G, G_S or None, S_0 or None): typical inputs (unit keys unless normalised
    inside, beta in (0, 1), gates in [-1, -0.05]) or one of KINDS: beta in (0, 1e-3) or
    within 1e-3 of 2; keys of norm 3 with beta up to 2 (the state grows); nearly parallel
    keys and values with beta = 1; values, S_0 and G near 2^-520 (the gradients' products
    near 2^-1040: gradual underflow) and gates down to -800; values and S_0 near 2^300, G
    near 2^200; gates down to -50 (the state forgotten in a token)."""
    rng = np.random.default_rng(seed)
    q, k, v, beta, g, state = typical_draws(rng, decay, l2, (b, h, n, d, dv))
    g_out = rng.normal(size=v.shape)
    g_state = rng.normal(size=state.shape)
    if kind == "beta-near-0":
        beta = rng.uniform(0, 1e-3, beta.shape)
    elif kind == "beta-near-2":
        beta = 2 - rng.uniform(0, 1e-3, beta.shape)
    elif kind == "keys-of-norm-3":
        k *= 3 / np.linalg.norm(k, axis=-1, keepdims=True)
        beta = 2 * beta
    elif kind == "parallel-keys":
        k = k[:, :, :1] + 1e-7 * k
        v = v[:, :, :1] + 1e-9 * v
        beta[:] = 1.0
    elif kind == "tiny":
        v, state, g_out, g_state = (2.0**-520 * t for t in (v, state, g_out, g_state))
        g = 800 * g
    elif kind == "large":
        v, state = 2.0**300 * v, 2.0**300 * state
        g_out, g_state = 2.0**200 * g_out, 2.0**200 * g_state
    elif kind == "strong-gates":
        g = 50 * g
    spec = _spec(decay, l2, scale)
    packed = pack_delta(torch.tensor(beta), None if decay is None else torch.tensor(g))
    x = validate(q, k, v, spec, None, packed)
    return x, spec, g_out, g_state if gs else None, state if s0 else None


@pytest.fixture
def small_blocks(monkeypatch):
    """Checkpoints every 4 tokens: N = 17 crosses four blocks and ends ragged."""
    monkeypatch.setattr(cdg, "BLOCK", 4)


def _assert_within(x, spec, g_out, g_state, s0, label):
    grads, bounds = certified_delta_gradients(x, spec, g_out, g_state, s0)
    exact = exact_delta_gradients(x, spec, g_out, g_state, s0)
    assert set(grads) == set(bounds) == set(exact), label
    for name, want in exact.items():
        got, bound = grads[name], bounds[name]
        assert got.shape == bound.shape == want.shape, (label, name)
        assert np.all(np.isfinite(bound)) and np.all(bound >= 0), (label, name)
        err = np.abs(got - want)
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert np.all(err <= bound), (
            f"{label}: d{name}{worst} errs by {err[worst]:.3g}, bound {bound[worst]:.3g} "
            f"(exact {want[worst]:.17g})"
        )
    return grads, bounds


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("l2", [False, True])
@pytest.mark.parametrize("decay", DECAYS)
def test_within_bound_of_exact(decay, l2, kind):
    for seed in range(3):
        states = STATES[seed + (kind == "typical")]
        n = (5, 17, 40)[seed]
        x, spec, g_out, g_state, s0 = _case(decay, l2, 100 * seed + KINDS.index(kind), kind, n,
                                            s0=states[0], gs=states[1])  # fmt: skip
        _assert_within(x, spec, g_out, g_state, s0, f"{spec}, {kind}, seed {seed}, N {n}")


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("scale", [1e-3, 1.0, 37.0])
@pytest.mark.parametrize("decay", DECAYS)
def test_within_bound_at_any_scale(decay, scale):
    x, spec, g_out, g_state, s0 = _case(decay, True, 7, n=23, d=5, dv=2, b=2, scale=scale, s0=True)
    _assert_within(x, spec, g_out, g_state, s0, f"{spec}")


@pytest.mark.usefixtures("small_blocks")
def test_zero_cotangent_gives_exact_zeros():
    x, spec, g_out, _, s0 = _case("channel-gates", True, 3, s0=True)
    grads, _ = _assert_within(x, spec, 0 * g_out, None, s0, "G = 0")
    for name in grads:
        assert not grads[name].any(), name


@pytest.mark.parametrize("l2", [False, True])
@pytest.mark.parametrize("decay", DECAYS)
def test_bound_far_below_magnitude_at_length(decay, l2):
    """The caller judges float32 and half-precision gradients with elements whose bound is
    at most 2^-34 M: here every element is, by far, at N = 256 and d = dv = 16."""
    x, spec, g_out, _, _ = _case(decay, l2, 5, n=256, d=16, dv=16, b=1, h=1)
    _, bounds = certified_delta_gradients(x, spec, g_out)
    magnitudes = delta_gradient_magnitudes(x, spec, g_out)
    for name, bound in bounds.items():
        ratio = np.max(bound / magnitudes[name])
        assert ratio <= LENGTH_RATIO, (name, ratio)


def test_blocks_change_nothing_but_rounding(monkeypatch):
    """Checkpoints every 4 tokens or every 64: the same gradients within their bounds."""
    x, spec, g_out, g_state, s0 = _case("gates", True, 9, n=45, s0=True, gs=True)
    wide, wide_bounds = certified_delta_gradients(x, spec, g_out, g_state, s0)
    monkeypatch.setattr(cdg, "BLOCK", 4)
    narrow, narrow_bounds = certified_delta_gradients(x, spec, g_out, g_state, s0)
    for name, got in narrow.items():
        assert np.all(np.abs(got - wide[name]) <= narrow_bounds[name] + wide_bounds[name]), name


def test_bad_input():
    x, spec, g_out, _, _ = _case(None, False, 1)
    with pytest.raises(SpecError, match="g_out"):
        certified_delta_gradients(x, spec, g_out[..., :1])
    with pytest.raises(SpecError, match="initial_state"):
        certified_delta_gradients(x, spec, g_out, None, np.zeros((1, 2, 4, 4)))
    plain = Spec("identity", True, normalize=False)
    y = validate(x.q, x.k, x.v, plain, None, None)
    with pytest.raises(SpecError, match="delta"):
        certified_delta_gradients(y, plain, g_out)
