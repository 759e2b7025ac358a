"""decayed.py's forms (the specs that are not plain) for every kernelised map, the Performer
maps included: against the golden quadratic form, their state in true units across calls,
extreme elu rows and large Performer norms without 0/0, and a gradcheck."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.accuracy import judge
from linattn_verify.accuracy.state_bounds import state_bound
from linattn_verify.families import (
    attention_with_state,
    exact,
    exact_state,
    forms_of,
    golden_attention,
    validate,
)
from linattn_verify.families.decayed.forms import decayed_attention
from linattn_verify.specs import RSQRT_D
from linattn_verify.stats import rate_not_applicable

KERNELISED = [n for n, fm in lv.FEATURE_MAPS.items() if fm.kernelised]
PERFORMER = [n for n in KERNELISED if lv.FEATURE_MAPS[n].needs_projection]
CHUNK = 4
N = 11  # two full chunks of 4 and a ragged tail


def _case(name, decay, n=N, seed=0, dtype=torch.float64, magnitude=1.0):
    """(q, k, v, projection, decay values) of shape B=2, H=3, d=4, dv=5, m=6."""
    g = torch.Generator().manual_seed(seed)
    q, k = (magnitude * torch.randn(2, 3, n, 4, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(2, 3, n, 5, generator=g, dtype=dtype)
    w = torch.randn(6, 4, generator=g, dtype=dtype) if name in PERFORMER else None
    values = None
    if decay == "constant":
        values = 0.5 + 0.5 * torch.rand(3, generator=g, dtype=dtype)
    elif decay == "gates":
        values = -torch.rand(2, 3, n, generator=g, dtype=dtype)
    return q, k, v, w, values


def _specs():
    for name in KERNELISED:
        for decay in (None, "constant", "gates"):
            if decay and name == "cosformer":
                continue  # cosformer takes no decay
            for normalize in (True, False):
                yield name, decay, normalize


def _forms(spec: lv.Spec) -> list[str]:
    return ["recurrent", "chunked"] if spec.causal else ["linear"]


@pytest.mark.parametrize(("name", "decay", "normalize"), list(_specs()))
def test_each_form_is_the_golden_quadratic_form(name, decay, normalize):
    eps = 0.25 if normalize else 0.0  # eps > 0: no 0/0 rows of relu, eps rescaled
    causal_specs = [lv.Spec(name, True, eps, normalize, RSQRT_D, decay)]
    if decay is None:
        causal_specs.append(lv.Spec(name, False, eps, normalize, 0.5))
    q, k, v, w, values = _case(name, decay)
    for spec in causal_specs:
        golden = golden_attention(q, k, v, spec, w, "quadratic", values)
        for form in _forms(spec):
            out, _ = decayed_attention(q, k, v, spec, form, w, CHUNK, values)
            _assert_within_the_accuracy_model(out, q, k, v, spec, w, values, golden)


@pytest.mark.parametrize("name", ["elu", "identity", *PERFORMER])
@pytest.mark.parametrize("normalize", [True, False])
def test_the_state_carried_across_two_calls_is_one_call_and_in_true_units(name, normalize):
    q, k, v, w, g = _case(name, "gates", seed=1)
    spec = lv.Spec(name, True, 0.0, normalize, RSQRT_D, "gates")
    x = validate(q, k, v, spec, w, g)
    exact = exact_state(x, spec)[: 1 + normalize]
    bounds = state_bound(x, spec, 2.0**-53)[: 1 + normalize]
    for form in ("recurrent", "chunked"):
        kw = dict(projection=w, form=form, chunk_size=CHUNK, normalize=normalize)
        kw.update(scale=RSQRT_D, decay="gates")
        whole, state = attention_with_state(q, k, v, name, g=g, **kw)
        cut = 6  # inside the second chunk
        head, tail = ([t[..., rows, :] for t in (q, k, v)] for rows in (slice(cut), slice(cut, N)))
        first, mid = attention_with_state(*head, name, g=g[..., :cut], **kw)
        second, end = attention_with_state(*tail, name, g=g[..., cut:], initial_state=mid, **kw)
        torch.testing.assert_close(torch.cat([first, second], dim=-2), whole)
        pair = (end, state) if normalize else ((end,), (state,))
        for got, one, want, allowed in zip(*pair, exact, bounds, strict=True):
            torch.testing.assert_close(got, one)
            assert np.all(np.abs(got.numpy() - want) <= allowed)  # state_bounds.state_bound


def _assert_within_the_accuracy_model(out, q, k, v, spec, w, g, golden=None):
    """out finite where the exact output is representable in out's dtype, and within the
    bound and budget (accuracy.judge, against the golden quadratic form)."""
    x = validate(q, k, v, spec, w, g)
    ref = exact(x, spec)
    representable = np.abs(ref) < torch.finfo(out.dtype).max
    assert np.isfinite(out.double().numpy()[representable]).all()
    if golden is None:
        golden = golden_attention(q, k, v, spec, w, "quadratic", g)
    verdict = judge(out, x, spec, ref, golden=golden)
    assert verdict.passed, f"{spec}: {verdict.message}"


@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_an_elu_row_far_below_zero_gives_no_0_over_0(form):
    q, k, v, _, g = _case("elu", "gates", n=9, seed=2, dtype=torch.float32)
    q[:, :, 0], k[:, :, 0] = -60000.0, -60000.0  # the first token's row alone: all underflow
    q, k, v = (t.to(torch.float16) for t in (q, k, v))  # computed in float32
    spec = lv.Spec("elu", True, decay="gates")
    out = lv.attention(q, k, v, "elu", True, form, chunk_size=CHUNK, decay="gates", g=g)
    _assert_within_the_accuracy_model(out, q, k, v, spec, None, g)
    # a query and a key below zero in different places: products e^-51, not 0
    q = torch.tensor([-29.0, -80.0]).expand(1, 1, 3, 2).clone()
    k = torch.tensor([-80.0, -29.0]).expand(1, 1, 3, 2).clone()
    v, g = torch.randn(1, 1, 3, 2), torch.full((1, 1, 3), -0.5)
    out = lv.attention(q, k, v, "elu", True, form, chunk_size=2, decay="gates", g=g)
    _assert_within_the_accuracy_model(out, q, k, v, spec, None, g)
    # rows of -1e6 - |N(0, 1)|: log-scales whose ulp (0.06) would swamp the decays added
    q, k, v, _, g = _case("elu", "gates", n=9, seed=5, dtype=torch.float32)
    q[..., ::2, :], k[..., :6, :] = -1e6 - q[..., ::2, :].abs(), -1e6 - k[..., :6, :].abs()
    out = lv.attention(q, k, v, "elu", True, form, chunk_size=CHUNK, decay="gates", g=g)
    _assert_within_the_accuracy_model(out, q, k, v, spec, None, g)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exact unnormalised trig: inf - inf
@pytest.mark.parametrize("name", PERFORMER)
@pytest.mark.parametrize("normalize", [True, False])
def test_a_performer_row_of_large_norm_is_finite_where_exact_is(name, normalize):
    q, k, v, w, g = _case(name, "gates", n=9, seed=3, dtype=torch.float32, magnitude=15.0)
    spec = lv.Spec(name, True, normalize=normalize, decay="gates")
    for form in ("recurrent", "chunked"):
        out = lv.attention(
            q, k, v, name, True, form, w, chunk_size=CHUNK, normalize=normalize, decay="gates", g=g
        )
        _assert_within_the_accuracy_model(out, q, k, v, spec, w, g)


def test_a_decayed_performer_chunked_form_passes_gradcheck():
    """Through q, k, v, the gates and (unnormalised) the initial state and the final one."""
    q, k, v, w, g = _case("performer-positive", "gates", n=4, seed=4)
    q, k, v, g = (t[:1, :1].clone().requires_grad_() for t in (q, k, v[..., :2], g))
    s0 = torch.randn(1, 1, 6, 2, dtype=torch.float64, requires_grad=True)
    options = dict(projection=w, chunk_size=2, decay="gates")

    def normalised(q, k, v, g):
        return lv.attention(q, k, v, "performer-positive", True, "chunked", g=g, **options)

    def unnormalised(q, k, v, g, s0):
        return attention_with_state(
            q, k, v, "performer-positive", g=g, initial_state=s0, normalize=False, **options
        )

    assert torch.autograd.gradcheck(normalised, (q, k, v, g))
    assert torch.autograd.gradcheck(unnormalised, (q, k, v, g, s0))


def test_gradients_where_the_values_and_the_initial_state_are_zero():
    """Zero values (so zero numerators) and a zero initial state in shifted units: the
    gradients of the recurrent and chunked forms are the golden quadratic form's."""
    q, k, _, w, g = _case("performer-positive", "gates", n=5, seed=2, magnitude=3.0)
    spec = lv.Spec("performer-positive", True, normalize=False, decay="gates")
    grads = {}
    for form in ("quadratic", "recurrent", "chunked"):
        v = torch.zeros(2, 3, 5, 2, dtype=torch.float64, requires_grad=True)
        s0 = torch.zeros(2, 3, 6, 2, dtype=torch.float64, requires_grad=True)
        out, s = decayed_attention(q, k, v, spec, form, w, 2, g, None if form == "quadratic"
                                   else (s0, None))  # fmt: skip
        (dv,) = torch.autograd.grad(out.sum(), v, retain_graph=s is not None)
        ds0 = None if s is None else torch.autograd.grad((out.sum() + s[0].sum()), s0)[0]
        grads[form] = dv, ds0
    for form in ("recurrent", "chunked"):
        torch.testing.assert_close(grads[form][0], grads["quadratic"][0], rtol=1e-12, atol=0)
    assert torch.isfinite(grads["chunked"][1]).all() and grads["chunked"][1].abs().sum() > 0
    torch.testing.assert_close(grads["chunked"][1], grads["recurrent"][1], rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", PERFORMER)
def test_the_performer_maps_have_every_decayed_form_and_no_rate_check(name):
    decayed, unnormalised = lv.Spec(name, True, decay="gates"), lv.Spec(name, normalize=False)
    assert forms_of(decayed) == ("quadratic", "recurrent", "chunked")
    assert forms_of(unnormalised) == ("quadratic", "linear")
    assert rate_not_applicable(decayed) and rate_not_applicable(unnormalised)
    assert rate_not_applicable(lv.Spec(name, True, scale=RSQRT_D)) is None
