"""Certified gradients of the maps with signed or position-dependent features (identity
normalised, cosFormer, Taylor, performer-trig), of the non-causal Performer maps and of the
unnormalised specs of every map (families/kernelised/certified_gradients.py and
certified_gradient_maps.py) against the exact ones of reference/grad.py: every element
within its bound (infinite only where a denominator is not resolved), the bound below
CERTIFIED_SHARE of grad.py's magnitude M on typical inputs and M <= M', across sub-chunks,
chunks and steps (shrunk), decays, scales and eps; a J^T taken one feature off breaks the
bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.families import validate
from linattn_verify.families.dispatch import exact_gradients_and_magnitudes
from linattn_verify.families.kernelised import certified_gradient_maps as certified_grad_maps
from linattn_verify.families.kernelised.certified_gradients import certified_gradients
from linattn_verify.reference.certified import CERTIFIED_SHARE
from linattn_verify.specs import RSQRT_D, Spec
from tests.test_certified_grad import certified_against_exact

B, H, D, DV, M = 1, 2, 4, 3, 16

SPECS = [
    # signed similarities: q, k ~ N(1, 0.3) keeps the denominators away from 0
    Spec("identity", causal=True),
    Spec("identity", causal=True, eps=0.5, scale=RSQRT_D, decay="gates"),
    Spec("identity", causal=True, decay="channel-gates"),
    Spec("identity"),
    Spec("cosformer", causal=True),
    Spec("cosformer", eps=1e-3, scale=RSQRT_D),
    Spec("taylor", causal=True),
    Spec("taylor", causal=True, scale=RSQRT_D, decay="constant"),
    Spec("taylor", eps=1e-6),
    Spec("performer-trig", causal=True),
    Spec("performer-trig", causal=True, decay="gates"),
    Spec("performer-trig"),
    Spec("performer-positive", eps=1e-6),
    Spec("performer-hyperbolic", scale=RSQRT_D),
    # unnormalised
    Spec("elu", causal=True, normalize=False, decay="channel-gates"),
    Spec("relu", normalize=False),
    Spec("cosformer", causal=True, normalize=False),
    Spec("taylor", causal=True, normalize=False, decay="gates"),
    Spec("performer-positive", causal=True, normalize=False, decay="constant"),
    Spec("performer-trig", normalize=False, scale=RSQRT_D),
]


def _case(spec: Spec, n=21, seed=0):
    """(inputs, g_out): q, k ~ N(1, 0.3) for the identity map (similarities > 0), N(0, 0.5)
    for the others; v, g_out ~ N(0, 1); W ~ N(0, 1) (M, D); log-gates ~ -Exp(0.2) (channel
    gates per channel), a constant decay of 0.8 .. 0.72 per head."""
    rng = np.random.default_rng(seed)
    shift, spread = (1.0, 0.3) if spec.feature_map == "identity" else (0.0, 0.5)
    q, k = rng.normal(shift, spread, size=(2, B, H, n, D))
    v, g_out = rng.normal(size=(2, B, H, n, DV))
    w = torch.tensor(rng.normal(size=(M, D))) if spec.info.needs_projection else None
    given = None
    if spec.decay == "constant":
        given = torch.tensor(0.8 * np.linspace(1, 0.9, H))
    elif spec.decay == "gates":
        given = torch.tensor(-rng.exponential(0.2, (B, H, n)))
    elif spec.decay == "channel-gates":
        given = torch.tensor(-rng.exponential(0.2, (B, H, n, D)))
    x = validate(*(torch.tensor(t) for t in (q, k, v)), spec, w, given)
    return x, g_out


def _check(x, spec: Spec, g_out) -> None:
    """certified_against_exact, every denominator resolved, bound <= CERTIFIED_SHARE M (what
    gradient-length judges) and M <= M' (families/kernelised/certified_gradients.py's upper
    bound)."""
    _, bounds, mags, _, exact_mags, undefined = certified_against_exact(x, spec, g_out)
    for name, nan in undefined.items():
        assert np.all(bounds[name][~nan] < np.inf), name
        m, mine = exact_mags[name][~nan], mags[name][~nan]
        assert np.all(mine >= m * (1 - 1e-12)), name
        assert np.all(bounds[name][~nan] <= CERTIFIED_SHARE * m), name


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_within_the_bound_certified_for_float32_and_above_grad_pys_magnitude(small_chunks, spec):
    x, g_out = _case(spec)
    _check(x, spec, g_out)


@pytest.mark.parametrize(
    "spec", [Spec("taylor", causal=True), Spec("performer-trig", causal=True, eps=0.1)], ids=str
)
def test_one_token_and_other_seeds(spec):
    for n, seed in ((1, 1), (9, 2)):
        x, g_out = _case(spec, n=n, seed=seed)
        _check(x, spec, g_out)


@pytest.mark.parametrize("name", ["cosformer", "taylor", "performer-trig"])
def test_a_jacobian_one_feature_off_breaks_the_bound(small_chunks, monkeypatch, name):
    """The bound is tight enough to see J^T read the features rolled by one (cosFormer's
    angles one position late, Taylor's and trig's features shifted): dq leaves it."""
    spec = Spec(name, causal=True)
    x, g_out = _case(spec)
    exact, _ = exact_gradients_and_magnitudes(x, spec, g_out)
    real = certified_grad_maps.MapRows.through

    def rolled(self, y, e_y):
        return real(self, np.roll(y, 1, axis=1), e_y)

    monkeypatch.setattr(certified_grad_maps.MapRows, "through", rolled)
    grads, bounds, _ = certified_gradients(x, spec, g_out)
    assert np.any(np.abs(grads["q"] - exact["q"]) > bounds["q"])
