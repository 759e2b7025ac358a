"""The backward pass of a carried state (checks/state_gradient.py): the exact gradients
against autograd through a float64 closed form, the bound, and the check on built-ins and
broken kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from linattn_verify.accuracy.state_bounds import state_gradient_bound
from linattn_verify.cases import Case
from linattn_verify.checks import GRAD_CHECKS, not_applicable
from linattn_verify.families import attention_with_state, exact_state, family_of, validate
from linattn_verify.families.kernelised.reference import KERNELISED
from linattn_verify.reference.state import exact_state_gradients
from linattn_verify.specs import Spec, SpecError
from linattn_verify.under_test import DECLARED, resolve

B, H, N, D, DV = 1, 2, 7, 3, 2
# The float64 closed forms' own error: a few hundred roundings (n u ~ 2^-45) on sums of
# seven O(1) terms (conditioning O(1) at these sizes), so 2^-40 leaves a factor of 30.
CLOSED_FORM_RTOL = 2.0**-40
# A float64 bound that is not vacuous: n u M with n in the hundreds and M a few |value|
# stays below it.
NOT_VACUOUS = 2.0**-40


def _closed_form(q, k, v, g, s0, g_out, g_state, scale):
    """dL/dS_0 and dL_S/dv of identity features with gates, written from the definition in
    float64 numpy: out_i = c q_i^T (e^(G_i) S_0 + sum_(j<=i) e^(G_i - G_j) k_j v_j^T)."""
    prefix = np.cumsum(g, axis=-1)  # G_i
    ds0 = np.einsum("bhi,bhid,bhic->bhdc", scale * np.exp(prefix), q, g_out)
    ds0 += np.exp(prefix[..., -1])[..., None, None] * g_state
    to_end = np.exp(prefix[..., -1:] - prefix)  # w_(N-1, j)
    dv = np.einsum("bhj,bhjd,bhdc->bhjc", to_end, k, g_state)
    return ds0, dv


def test_exact_state_gradients_match_the_closed_form():
    gen = np.random.default_rng(5)
    q, k = gen.standard_normal((2, B, H, N, D))
    v, g_out = gen.standard_normal((2, B, H, N, DV))
    g = -gen.random((B, H, N)) * 2
    s0, g_state = gen.standard_normal((2, B, H, D, DV))
    spec = Spec("identity", True, normalize=False, scale=0.5, decay="gates")
    x = validate(q, k, v, spec, None, g)
    ds0, _, dv, _, _ = exact_state_gradients(
        x, spec, g_out, g_state, similarity=family_of(spec).similarity
    )
    want_s, want_v = _closed_form(q, k, v, g, s0, g_out, g_state, 0.5)
    np.testing.assert_allclose(ds0, want_s, rtol=CLOSED_FORM_RTOL)
    np.testing.assert_allclose(dv, want_v, rtol=CLOSED_FORM_RTOL)


def _normalised_closed_form(q, k, v, g, s0, z0, g_out, g_state, g_z, scale):
    """dL/dS_0 and dL/dz_0 of normalised identity features with gates, from the definition
    in float64 numpy: out_i = n_i / D_i, n_i = c q_i^T (e^(G_i) S_0 + sum_(j<=i)
    e^(G_i - G_j) k_j v_j^T), D_i = c q_i^T (e^(G_i) z_0 + sum_(j<=i) e^(G_i - G_j) k_j)."""
    prefix = np.cumsum(g, axis=-1)
    n = q.shape[2]
    weights = np.exp(prefix[..., :, None] - prefix[..., None, :]) * np.tri(n)
    sims = scale * np.einsum("bhid,bhjd->bhij", q, k) * weights
    start = scale * np.exp(prefix)
    num = sims @ v + start[..., None] * np.einsum("bhid,bhdc->bhic", q, s0)
    den = sims.sum(-1) + start * np.einsum("bhid,bhd->bhi", q, z0)
    out = num / den[..., None]
    ds0 = np.einsum("bhi,bhid,bhic->bhdc", start / den, q, g_out)
    ds0 += np.exp(prefix[..., -1])[..., None, None] * g_state
    dz0 = -np.einsum("bhi,bhid->bhd", start * (g_out * out).sum(-1) / den, q)
    dz0 += np.exp(prefix[..., -1])[..., None] * g_z
    return ds0, dz0, den, out


def test_normalised_exact_state_gradients_match_the_closed_form():
    gen = np.random.default_rng(6)
    q, k = 1 + gen.random((2, B, H, N, D))  # positive: the normaliser stays away from 0
    v, g_out = gen.standard_normal((2, B, H, N, DV))
    g = -gen.random((B, H, N)) * 2
    s0, g_state = gen.standard_normal((2, B, H, D, DV))
    z0, g_z = 1 + gen.random((B, H, D)), gen.standard_normal((B, H, D))
    spec = Spec("identity", True, scale=0.5, decay="gates")
    x = validate(q, k, v, spec, None, g)
    got = exact_state_gradients(
        x, spec, g_out, g_state, g_z, (s0, z0), similarity=family_of(spec).similarity
    )
    want_s, want_z, den, out = _normalised_closed_form(q, k, v, g, s0, z0, g_out, g_state, g_z, 0.5)
    for have, want in ((got.s0, want_s), (got.z0, want_z), (got.den, den), (got.out, out)):
        np.testing.assert_allclose(have, want, rtol=CLOSED_FORM_RTOL)


def test_a_normalised_spec_needs_its_initial_state():
    x = validate(*np.ones((3, 1, 1, 2, 2)), Spec("elu", True))
    with pytest.raises(SpecError, match="initial"):
        exact_state_gradients(
            x,
            Spec("elu", True),
            np.ones((1, 1, 2, 2)),
            np.ones((1, 1, 2, 2)),
            similarity=KERNELISED,
        )


@pytest.mark.parametrize("decay", [None, "constant", "gates"])
def test_float64_autograd_of_the_built_in_is_within_the_bound(decay):
    case = Case(B, H, N, D, DV, "float64", seed=4)
    q, k, v, _ = case.tensors()
    values = case.decay(decay)
    spec = Spec("elu", True, normalize=False, decay=decay)
    keyword = {"constant": "gamma", "gates": "g"}.get(decay)
    gen = torch.Generator().manual_seed(1)
    s0 = torch.randn(B, H, D, DV, generator=gen, dtype=torch.float64, requires_grad=True)
    g_out = torch.randn(B, H, N, DV, generator=gen, dtype=torch.float64)
    g_state = torch.randn(B, H, D, DV, generator=gen, dtype=torch.float64)
    kwargs = {keyword: values} if keyword else {}
    out, s = attention_with_state(q, k, v, "elu", initial_state=s0, chunk_size=3,
                                  normalize=False, decay=decay, **kwargs)  # fmt: skip
    ((out * g_out).sum() + (s * g_state).sum()).backward()
    x = validate(q, k, v, spec, None, values)
    ds0 = exact_state_gradients(
        x, spec, g_out.numpy(), g_state.numpy(), similarity=family_of(spec).similarity
    ).s0
    bound = state_gradient_bound(x, spec, g_out.numpy(), g_state.numpy(), 2.0**-53)[0]
    error = np.abs(s0.grad.numpy() - ds0)
    assert np.all(error <= bound) and np.all(np.isfinite(bound))
    assert np.all(bound < NOT_VACUOUS * (1 + np.abs(ds0)))


@pytest.mark.parametrize(("feature_map", "decay"), [("elu", None), ("elu", "gates"),
                                                  ("relu", "constant")])  # fmt: skip
def test_normalised_float64_autograd_of_the_built_in_is_within_the_bound(feature_map, decay):
    case = Case(B, H, N, D, DV, "float64", seed=4)
    q, k, v, _ = case.tensors()
    values = case.decay(decay)
    spec = Spec(feature_map, True, decay=decay, scale="d^-0.5")
    keyword = {"constant": "gamma", "gates": "g"}.get(decay)
    kwargs = {keyword: values} if keyword else {}
    x = validate(q, k, v, spec, None, values)
    exact_s, exact_z = (torch.tensor(t) for t in exact_state(x, spec))
    s0, z0 = (t.clone().requires_grad_(True) for t in (exact_s, exact_z))
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(B, H, N, DV, generator=gen, dtype=torch.float64)
    g_state = torch.randn(B, H, D, DV, generator=gen, dtype=torch.float64)
    g_z = torch.randn(B, H, D, generator=gen, dtype=torch.float64)
    out, (s, z) = attention_with_state(q, k, v, feature_map, initial_state=(s0, z0), chunk_size=3,
                                       decay=decay, scale="d^-0.5", **kwargs)  # fmt: skip
    ((out * g_out).sum() + (s * g_state).sum() + (z * g_z).sum()).backward()
    given = (exact_s.numpy(), exact_z.numpy())
    exact = exact_state_gradients(
        x,
        spec,
        g_out.numpy(),
        g_state.numpy(),
        g_z.numpy(),
        given,
        similarity=family_of(spec).similarity,
    )
    bounds = state_gradient_bound(x, spec, g_out.numpy(), g_state.numpy(), 2.0**-53, 0.0,
                                  (g_z.numpy(), given, exact))  # fmt: skip
    for got, want, bound in ((s0.grad, exact.s0, bounds[0]), (z0.grad, exact.z0, bounds[1])):
        assert np.all(np.abs(got.numpy() - want) <= bound) and np.all(np.isfinite(bound))
        assert np.all(bound < NOT_VACUOUS * (1 + np.abs(want)))


@pytest.mark.parametrize("decay", [None, "gates"])
def test_a_normalised_built_in_passes(decay):
    impl = resolve(form="chunked", feature_map="elu", causal=True, decay=decay, state=DECLARED)
    result = GRAD_CHECKS["state-gradient"](impl, Case(1, 2, 40, 4, 3, "float32", seed=3))
    assert result.passed and "dL/dz_0" in result.message, result.message


def _z0_detached(q, k, v, initial_state=None):
    """The built-in, whose backward never reaches the initial normaliser z_0."""
    if initial_state is not None:
        initial_state = (initial_state[0], initial_state[1].detach())
    return attention_with_state(q, k, v, "elu", initial_state=initial_state)


def test_a_backward_ignoring_z0_fails():
    impl = resolve(_z0_detached, feature_map="elu", causal=True, state="Sz")
    result = GRAD_CHECKS["state-gradient"](impl, Case(1, 2, 20, 4, 3, "float32", seed=3))
    assert not result.passed and "dL/dz_0" in result.message, result.message


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_the_built_in_forms_pass(form, dtype):
    impl = resolve(form=form, feature_map="identity", causal=True, normalize=False,
                   scale="d^-0.5", decay="gates", state=DECLARED)  # fmt: skip
    result = GRAD_CHECKS["state-gradient"](impl, Case(1, 2, 40, 4, 3, dtype, seed=3))
    assert result.passed, result.message


def _dropping_dht(q, k, v, g=None, initial_state=None):
    """The built-in, with the final state's dependence on the initial state detached."""
    options = {"normalize": False, "decay": "gates", "g": g}
    out, s = attention_with_state(q, k, v, "identity", initial_state=initial_state, **options)
    if initial_state is None:
        return out, s
    _, fresh = attention_with_state(q, k, v, "identity", **options)
    return out, fresh + (s - fresh).detach()


def _queries_in_the_state(q, k, v, g=None, initial_state=None):
    """The built-in, whose final state picks up a multiple of sum(q) (a wrong graph)."""
    options = {"normalize": False, "decay": "gates", "g": g}
    out, s = attention_with_state(q, k, v, "identity", initial_state=initial_state, **options)
    return out, s + 0.0 * q.sum() + (q - q.detach()).sum()


@pytest.mark.parametrize(
    ("fn", "words"),
    [(_dropping_dht, "dL/dS_0"), (_queries_in_the_state, "moves the queries")],
)
def test_broken_backward_passes_fail(fn, words):
    impl = resolve(fn, feature_map="identity", causal=True, normalize=False, decay="gates",
                   state="S")  # fmt: skip
    result = GRAD_CHECKS["state-gradient"](impl, Case(1, 2, 20, 4, 3, "float32", seed=3))
    assert not result.passed and words in result.message, result.message


def test_not_applicable_without_a_state():
    plain = resolve(form="chunked", feature_map="elu", causal=True, normalize=False)
    assert not_applicable("state-gradient", plain) == "no --state declared"
