"""The final state's gradients in the keys and the log-gates (reference/final_state.py)
against float64 autograd of the built-in recurrent form continuing an initial state, for
every map with a state, every decay, normalised and not; and their magnitudes bound them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.gradient import allowance
from linattn_verify.cases import Case
from linattn_verify.families import family_of, validate
from linattn_verify.families.channel_gates.forms import gated_attention
from linattn_verify.families.decayed.forms import decayed_attention
from linattn_verify.families.dispatch import roundings
from linattn_verify.reference.final_state import final_state_gradients
from linattn_verify.specs import Spec

MAPS = ["elu", "relu", "identity", "performer-positive", "performer-trig", "taylor"]
DECAYS = [None, "constant", "gates", "channel-gates"]


def _specs():
    for name in MAPS:
        for decay in DECAYS:
            if decay == "channel-gates" and name not in ("identity", "elu", "relu"):
                continue
            for normalize in (True, False):
                yield Spec(name, causal=True, normalize=normalize, decay=decay)


@pytest.mark.parametrize("spec", list(_specs()), ids=str)
def test_final_state_gradients_match_autograd(spec: Spec):
    m = 3 if spec.info.needs_projection else None
    case = Case(1, 2, 9, 3, 2, "float64", "normal", 1.0, 5, m, "cpu", decay_rate=0.4)
    q, k, v, w = case.tensors()
    decay = case.decay(spec.decay)
    f = spec.info.feature_dim(3, m)
    gen = torch.Generator().manual_seed(9)
    s0 = torch.rand(1, 2, f, 2, generator=gen, dtype=torch.float64)
    z0 = torch.rand(1, 2, f, generator=gen, dtype=torch.float64) + 0.5
    g_s = torch.randn(1, 2, f, 2, generator=gen, dtype=torch.float64)
    g_z = torch.randn(1, 2, f, generator=gen, dtype=torch.float64)
    k_leaf = k.clone().requires_grad_(True)
    leaves = [k_leaf]
    if spec.gated:
        decay = decay.clone().requires_grad_(True)
        leaves.append(decay)
    state = (s0, z0 if spec.normalize else None)
    attend = gated_attention if spec.decay == "channel-gates" else decayed_attention
    _, (s, z) = attend(q, k_leaf, v, spec, "recurrent", w, 4, decay, state)
    loss = (s * g_s).sum() + (spec.normalize and (z * g_z).sum())
    autograd = [t.numpy() for t in torch.autograd.grad(loss, leaves)]
    x = validate(q, k, v, spec, w, None if decay is None else decay.detach())
    exact, mags = final_state_gradients(
        x, spec, g_s.numpy(), g_z.numpy() if spec.normalize else None,
        (s0.numpy(), z0.numpy() if spec.normalize else None),
        similarity=family_of(spec).similarity,
    )  # fmt: skip
    assert set(exact) == ({"k", "g"} if spec.gated else {"k"})
    # autograd's float64 backward within the gradient bound gamma_n M (accuracy/gradient.py)
    allowed = {n: allowance(mags[n], "float64", 2.0**-53, roundings(x, spec)) for n in exact}
    for got, name in zip(autograd, ("k", "g"), strict=False):
        assert exact[name].shape == got.shape, name
        assert np.all(mags[name] >= np.abs(exact[name])), name
        assert np.all(np.abs(got - exact[name]) <= allowed[name]), name
