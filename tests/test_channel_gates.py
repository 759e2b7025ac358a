"""Channel gates (--decay channel-gates, GLA): the exact engines against an independent
float64 recurrence written here, the exact state, the golden and built-in forms, the
a-priori bound against arb's exact output, and bad inputs.

Definition (families/channel_gates/fields.py; GLA, sec. 4.1): S_t = diag(exp g_t) S_(t-1)
+ phi(k_t) v_t^T, z_t likewise with phi(k_t); out_t = c phi(q_t)^T S_t, divided when
normalised by eps + c phi(q_t) . z_t.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.bound import scale_and_bound
from linattn_verify.accuracy.state_bounds import state_bound, state_gradient_bound
from linattn_verify.accuracy.verdict import error_units
from linattn_verify.cases import Case
from linattn_verify.checks import GRAD_CHECKS
from linattn_verify.families import (
    attention,
    attention_varlen,
    exact_state,
    golden_attention,
    validate,
)
from linattn_verify.families.channel_gates.forms import gated_attention
from linattn_verify.families.channel_gates.reference import CHANNEL_GATES
from linattn_verify.inputs import SMALLEST_SUBNORMAL, UNIT_ROUNDOFF
from linattn_verify.reference.arb import arb_attention
from linattn_verify.reference.mp import mp_attention
from linattn_verify.reference.state import exact_state_gradients
from linattn_verify.specs import RSQRT_D, Spec, SpecError
from linattn_verify.under_test import resolve
from tests.zoo import gla

SPECS = [
    Spec("identity", causal=True, normalize=False, scale=RSQRT_D, decay="channel-gates"),
    Spec("elu", causal=True, decay="channel-gates"),
    Spec("relu", causal=True, eps=1e-3, decay="channel-gates"),
]
PHI = {
    "identity": lambda x: x,
    "elu": lambda x: torch.nn.functional.elu(x) + 1,
    "relu": torch.relu,
}
RATES = (0.05, 3.0)  # gates that keep most of the state, and ones that erase it in a token


def _case(dtype: str, rate: float, n: int = 13, seed: int = 3) -> tuple:
    case = Case(2, 2, n, 4, 3, dtype, "normal", 1.0, seed, None, "cpu", decay_rate=rate)
    q, k, v, _ = case.tensors()
    return q, k, v, case.decay("channel-gates")


def _recurrence(q, k, v, g, spec: Spec, s0=None, z0=None) -> tuple[torch.Tensor, ...]:
    """(out, S, z) of float64 tensors (autograd through them), one token at a time from
    (S_0, z_0) (None: zero)."""
    q, k, v, g = (t.double() for t in (q, k, v, g))
    phi, c = PHI[spec.feature_map], spec.scale_for(q.shape[-1])
    s = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if s0 is None else s0
    z = q.new_zeros(*q.shape[:2], q.shape[-1]) if z0 is None else z0
    outs = []
    for t in range(q.shape[2]):
        decay, fk, fq = torch.exp(g[:, :, t]), phi(k[:, :, t]), phi(q[:, :, t])
        s = decay[..., None] * s + fk[..., None] * v[:, :, t, None, :]
        z = decay * z + fk
        num = c * torch.einsum("bhm,bhmv->bhv", fq, s)
        den = spec.eps + c * (fq * z).sum(-1, keepdim=True)
        outs.append(num / den if spec.normalize else num)
    return torch.stack(outs, 2), s, z


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.feature_map)
def test_exact_engines_and_state_match_a_float64_recurrence(spec: Spec, rate: float):
    """The float64 recurrence (any evaluation in float64) within the a-priori bound of
    both engines' output, and its state within state_bound of the exact state."""
    q, k, v, g = _case("float64", rate)
    x = validate(q, k, v, spec, None, g)
    out, s, z = (t.numpy() for t in _recurrence(q, k, v, g, spec))
    exact_mp, exact_arb = (
        mp_attention(x, spec, CHANNEL_GATES),
        arb_attention(x, spec, CHANNEL_GATES),
    )
    np.testing.assert_array_equal(exact_arb, exact_mp)  # both faithfully rounded: equal
    u = UNIT_ROUNDOFF["float64"]
    scale, bound = scale_and_bound(x, spec, exact_mp, u)
    assert np.all(error_units(out, exact_mp, scale, u) <= bound)
    exact_s, exact_z = exact_state(x, spec)
    s_bound, z_bound = state_bound(x, spec, u)
    assert np.all(np.abs(exact_s - s) <= s_bound) and np.all(np.abs(exact_z - z) <= z_bound)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.feature_map)
def test_golden_and_built_in_forms_within_the_bound(spec: Spec):
    """float16 and float32 outputs of the golden quadratic form and the recurrent and chunked
    forms (chunks of 4: ragged, a state carried) within the a-priori bound of arb's exact
    output, and so are the forms' final states within state_bound."""
    for dtype in ("float16", "float32"):
        for rate in RATES:
            q, k, v, g = _case(dtype, rate)
            x = validate(q, k, v, spec, None, g)
            u = UNIT_ROUNDOFF[dtype]
            scale, bound = scale_and_bound(x, spec, arb_attention(x, spec, CHANNEL_GATES), u)
            s_bound, z_bound = state_bound(x, spec, u)
            exact_s, exact_z = exact_state(x, spec)
            outs = {"golden": golden_attention(q, k, v, spec, None, "quadratic", g)}
            for form in ("recurrent", "chunked"):
                out, (s, z) = gated_attention(q, k, v, spec, form, None, 4, g)
                outs[form] = out
                assert np.all(np.abs(s.double().numpy() - exact_s) <= s_bound), form
                if spec.normalize:
                    assert np.all(np.abs(z.double().numpy() - exact_z) <= z_bound), form
            exact = arb_attention(x, spec, CHANNEL_GATES)
            for form, out in outs.items():
                err = error_units(out.double().numpy(), exact, scale, u)
                assert np.all(err <= bound), (form, dtype, rate, np.max(err / bound))


def test_varlen_packs_gates_with_their_tokens():
    q, k, v, g = (t[:1] for t in _case("float32", 0.5, n=11))
    cu = torch.tensor([0, 4, 4, 11], dtype=torch.int32)
    options = {"feature_map": "elu", "causal": True, "decay": "channel-gates", "form": "chunked"}
    packed = attention_varlen(q, k, v, cu, **options, chunk_size=4, g=g)
    for a, b in ((0, 4), (4, 11)):
        piece = (t[:, :, a:b] for t in (q, k, v))
        own = attention(*piece, **options, chunk_size=4, g=g[:, :, a:b])
        torch.testing.assert_close(packed[:, :, a:b], own, rtol=0, atol=0)


def test_bad_specs_and_gates_are_named():
    with pytest.raises(SpecError, match="channel gates need a feature map"):
        Spec("taylor", causal=True, decay="channel-gates")
    q, k, v, g = _case("float32", 0.5)
    spec = SPECS[1]
    spec = SPECS[1]
    with pytest.raises(SpecError, match=r"g must have shape \(2, 2, 13, 4\)"):
        validate(q, k, v, spec, None, g[..., 0])
    with pytest.raises(SpecError, match="g must be <= 0"):
        validate(q, k, v, spec, None, -g)


@pytest.mark.parametrize("spec", SPECS[:2], ids=lambda s: s.feature_map)
def test_state_gradients_match_autograd_of_the_recurrence(spec: Spec):
    """dL/dS_0, dL/dz_0 and dL_S/dv of exact_state_gradients against float64 autograd of the
    recurrence continuing (S_0, z_0), for L = sum(out g_out) + sum(S_N g_S) (+ sum(z_N g_z))."""
    q, k, v, g = _case("float64", 0.5)
    gen = torch.Generator().manual_seed(5)
    s0 = torch.rand(2, 2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    z0 = torch.rand(2, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    g_out, g_s = (torch.randn(*shape, generator=gen, dtype=torch.float64)
                  for shape in ((2, 2, 13, 3), (2, 2, 4, 3)))  # fmt: skip
    g_z = torch.randn(2, 2, 4, generator=gen, dtype=torch.float64)
    v = v.clone().requires_grad_(True)
    out, s, z = _recurrence(q, k, v, g, spec, s0, z0)
    state_loss = (s * g_s).sum() + spec.normalize * (z * g_z).sum()
    (dv,) = torch.autograd.grad(state_loss, v, retain_graph=True)
    ds0, dz0 = torch.autograd.grad((out * g_out).sum() + state_loss, (s0, z0), allow_unused=True)
    x = validate(q, k, v.detach(), spec, None, g)
    initial = (s0.detach().numpy(), z0.detach().numpy()) if spec.normalize else None
    g_z_given = g_z.numpy() if spec.normalize else None
    exact = exact_state_gradients(
        x, spec, g_out.numpy(), g_s.numpy(), g_z_given, initial, similarity=CHANNEL_GATES
    )
    normalised = (g_z_given, initial, exact) if spec.normalize else None
    u, tiny = UNIT_ROUNDOFF["float64"], SMALLEST_SUBNORMAL["float64"]
    bounds = state_gradient_bound(x, spec, g_out.numpy(), g_s.numpy(), u, tiny, normalised)
    pairs = [(exact.s0, ds0, bounds[0]), (exact.v, dv, bounds[2])]
    pairs += [(exact.z0, dz0, bounds[1])] * spec.normalize
    for want, got, bound in pairs:  # autograd's float64 backward within the bound
        assert np.all(np.abs(got.numpy() - want) <= bound)


class _ShiftedGateGradient(torch.autograd.Function):
    """The zoo's chunked GLA, its backward through autograd but dL/dg_t replaced by
    dL/dg_(t+1) (an exclusive reverse cumsum: backward only)."""

    @staticmethod
    def forward(ctx, q, k, v, g):
        ctx.save_for_backward(q, k, v, g)
        return gla.gla_chunked(q, k, v, g)[0]

    @staticmethod
    def backward(ctx, grad):
        leaves = [t.detach().requires_grad_(True) for t in ctx.saved_tensors]
        with torch.enable_grad():
            dq, dk, dv, dg = torch.autograd.grad(gla.gla_chunked(*leaves)[0], leaves, grad)
        return dq, dk, dv, torch.cat([dg[:, :, 1:], torch.zeros_like(dg[:, :, :1])], 2)


def _shifted_dg(q, k, v, g):
    return _ShiftedGateGradient.apply(q, k, v, g)


def test_gradient_checks_judge_dg_of_channel_gates():
    """The gradient checks pass the zoo's correct chunked GLA kernel (dq, dk, dv, dg and the
    carried state's gradients within their bounds) and reject a dg one token off."""
    case = Case(1, 2, 33, 4, 3, "float32", "normal", 1.0, 7, None, "cpu")
    claim = {"feature_map": "identity", "causal": True, "normalize": False}
    claim["decay"] = "channel-gates"
    correct = resolve(gla.gla_chunked, state="S", **claim)
    for name in ("gradient", "state-gradient"):
        assert GRAD_CHECKS[name](correct, case).passed, name
    found = GRAD_CHECKS["gradient"](resolve(_shifted_dg, **claim), case)
    assert not found.passed and "dg" in found.message, found.message
