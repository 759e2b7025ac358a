"""Certified gradients of the normalised Performer specs
(families/kernelised/certified_gradients.py with certified_gradient_maps.py's J^T:
performer-positive, -hyperbolic and -trig) against the exact ones of reference/grad.py:
every element within its bound (infinite only where a denominator is not resolved), the
bound below 2^-30 of grad.py's magnitude M on typical inputs, and M <= M' (the upper bound
the module states), across sub-chunks, chunks and steps (shrunk), decays None, constant and
gates, scales and eps; large and tiny q, k (features underflowing or, trig's, overflowing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.specs import RSQRT_D, Spec
from tests.test_certified_grad import certified_against_exact

B, H, D, DV = 1, 2, 4, 3
MAPS = ["performer-positive", "performer-hyperbolic", "performer-trig"]


def _case(fm, n=21, m=8, seed=0, eps=0.0, decay=None, scale=1.0, qk=1.0, values=1.0, big_w=1.0):
    """(inputs, spec, g_out): q, k ~ N(0, 1) times qk, v ~ N(0, 1) times `values`, W ~ N(0,
    1) (m, D) times big_w; a constant decay of 0.8 .. 0.72 per head, or random log-gates."""
    rng = np.random.default_rng(seed)
    spec = Spec(fm, causal=True, eps=eps, scale=scale, decay=decay)
    q, k = rng.normal(size=(2, B, H, n, D)) * qk
    v, g_out = rng.normal(size=(2, B, H, n, DV))
    w = rng.normal(size=(m, D)) * big_w
    given = None
    if decay == "constant":
        given = torch.tensor(0.8 * np.linspace(1, 0.9, H))
    elif decay == "gates":
        given = torch.tensor(-rng.exponential(0.2, (B, H, n)))
    x = validate(*(torch.tensor(t) for t in (q, k, v * values)), spec, torch.tensor(w), given)
    return x, spec, g_out


def _check(x, spec, g_out, share=2.0**-30):
    """certified_against_exact; with share, where certified, M <= M' and bound <= share M;
    the medians of bound / M."""
    grads, bounds, mags, _, exact_mags, undefined = certified_against_exact(x, spec, g_out)
    ratios = []
    for name, nan in undefined.items():
        if share is None:
            continue
        certified = ~nan & (bounds[name] < np.inf)
        m, mine = exact_mags[name][certified], mags[name][certified]
        assert np.all(mine >= m * (1 - 1e-12)), name
        assert np.all(bounds[name][certified] <= share * m), name
        ratios.append(np.median(bounds[name][certified] / m))
    return grads, bounds, ratios


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize(("decay", "scale"), [(None, 1.0), ("constant", RSQRT_D), ("gates", 0.3)])
@pytest.mark.parametrize("fm", MAPS)
def test_within_the_bound_certified_for_float32_and_above_grad_pys_magnitude(
    small_chunks, fm, decay, scale, eps
):
    x, spec, g_out = _case(fm, eps=eps, decay=decay, scale=scale)
    _, bounds, _ = _check(x, spec, g_out)
    assert all(np.isfinite(b).all() for b in bounds.values())


@pytest.mark.parametrize(
    ("fm", "n", "m", "seed"),
    [(MAPS[0], 5, 4, 1), (MAPS[0], 40, 16, 2), (MAPS[1], 33, 5, 3), (MAPS[1], 17, 8, 4)],
)
def test_lengths_features_and_seeds(small_chunks, fm, n, m, seed):
    x, spec, g_out = _case(fm, n=n, m=m, seed=seed, eps=1e-6 * (seed % 2))
    _check(x, spec, g_out)


# M' is left out here: its own chain sums of such products underflow (M' is an upper
# bound on M where they do not)
@pytest.mark.parametrize(
    ("qk", "values", "big_w"),
    [
        (1e-150, 1.0, 1.0),  # x' tiny: every feature 1 / sqrt(m) (to the last bits)
        (6.0, 1.0, 1.0),  # arguments down to about -100: features spread over e^+-50
        (40.0, 1e-300, 1.0),  # arguments near -1000: features underflowing, tiny v
        (1e3, 1.0, 1.0),  # arguments near -1e6: every feature 0 (rows not resolved)
        (8.0, 1.0, 12.0),  # arguments up to about +-700: features near overflow and 0
    ],
)
@pytest.mark.parametrize("fm", MAPS)
def test_adversarial_magnitudes_within_the_bound(small_chunks, fm, qk, values, big_w):
    eps = 1e-6 * (fm == MAPS[1])
    x, spec, g_out = _case(fm, n=13, eps=eps, decay="gates", qk=qk, values=values, big_w=big_w)
    with np.errstate(all="ignore"):
        _check(x, spec, g_out, share=None)


def test_typical_bound_is_far_below_float32(small_chunks):
    x, spec, g_out = _case("performer-positive", n=24, m=12, seed=5)
    _, _, ratios = _check(x, spec, g_out)
    assert max(ratios) < 2.0**-40


def test_one_token():
    x, spec, g_out = _case("performer-positive", n=1, eps=0.1)
    _check(x, spec, g_out)
