"""The carried state: the exact state (ball arithmetic against mpmath, closed forms), its
a-priori bound, the built-in forms that carry one, and the --state contract (declaring,
calling, bad input). The checks that use them are judged by the zoo (tests/zoo/state.py)."""

from __future__ import annotations

import re
import shlex

import mpmath
import numpy as np
import pytest
import torch

from linattn_verify.accuracy.state_bounds import state_bound
from linattn_verify.cases import Case
from linattn_verify.cli import main
from linattn_verify.families import attention_with_state, exact_state, validate
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.reference.mp import features as mp_features
from linattn_verify.reference.mp import nearest
from linattn_verify.specs import Spec, SpecError
from linattn_verify.under_test import ImplementationFailure, resolve

MAPS = ("elu", "relu", "performer-positive", "performer-hyperbolic", "performer-trig", "taylor")


def _case(name: str, n: int = 7, dtype: str = "float64", magnitude: float = 1.0) -> Case:
    m = 4 if name.startswith("performer") else None
    return Case(1, 2, n, 3, 2, dtype, "normal", magnitude, 5, m)


def _mp_phi(x: list, w, name: str) -> list:
    """phi(x) in mpmath: mp.features, and [1, x', vec(x' x'^T) / sqrt(2)] for taylor."""
    if name != "taylor":
        return mp_features(x, w, name)
    xs = [t / mpmath.root(len(x), 4) for t in x]
    return [mpmath.mpf(1), *xs] + [a * b / mpmath.sqrt(2) for a in xs for b in xs]


def _mp_state(x, name: str) -> tuple[np.ndarray, np.ndarray]:
    """S and z by their definition at 300 bits, rounded to the nearest float64."""
    w = None if x.projection is None else [[mpmath.mpf(t) for t in r] for r in x.projection]
    b_, h_, n, _ = x.k.shape
    s_out, z_out = [], []
    with mpmath.workprec(300):
        for b in range(b_):
            for h in range(h_):
                phis = [_mp_phi([mpmath.mpf(t) for t in x.k[b, h, j]], w, name) for j in range(n)]
                z_out.append(
                    [nearest(mpmath.fsum(p[f] for p in phis)) for f in range(len(phis[0]))]
                )
                s_out.append(
                    [
                        [nearest(mpmath.fsum(phis[j][f] * x.v[b, h, j, c] for j in range(n)))
                         for c in range(x.v.shape[3])]
                        for f in range(len(phis[0]))
                    ]
                )  # fmt: skip
    f = len(z_out[0])
    return np.array(s_out).reshape(b_, h_, f, -1), np.array(z_out).reshape(b_, h_, f)


@pytest.mark.parametrize("name", MAPS)
def test_the_exact_state_agrees_with_mpmath(name):
    spec = Spec(name, causal=True)
    q, k, v, w = _case(name).tensors()
    x = validate(q, k, v, spec, w)
    s, z = exact_state(x, spec)
    s_mp, z_mp = _mp_state(x, name)
    for got, want in ((s, s_mp), (z, z_mp)):  # faithful rounding: within one ulp
        assert np.all(np.abs(got - want) <= np.spacing(np.abs(want))), (got, want)


def test_one_token_state_is_phi_k_times_v_and_negative_relu_keys_give_zero():
    spec = Spec("elu", causal=True)
    k = torch.tensor([[[[0.5, -1.0]]]], dtype=torch.float64)
    v = torch.tensor([[[[2.0, -3.0]]]], dtype=torch.float64)
    s, z = exact_state(validate(k, k, v, spec), spec)
    phi = np.array([1.5, np.exp(-1.0)])
    np.testing.assert_array_equal(z[0, 0], phi)
    np.testing.assert_allclose(s[0, 0], np.outer(phi, [2.0, -3.0]), rtol=2**-52)
    relu = Spec("relu", causal=True)
    s, z = exact_state(validate(-k.abs(), -k.abs(), v, relu), relu)
    assert not s.any() and not z.any()


@pytest.mark.parametrize("name", ["cosformer", "softmax"])
def test_cosformer_and_softmax_carry_no_state(name):
    q, k, v, w = _case("elu").tensors()
    with pytest.raises(SpecError, match="no state"):
        exact_state(validate(q, k, v, Spec(name, causal=True), w), Spec(name, causal=True))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("name", ["elu", "performer-positive"])
@pytest.mark.parametrize("form", ["recurrent", "chunked"])
def test_the_state_bound_holds_for_the_built_in_forms_and_bites(dtype, name, form):
    case = _case(name, n=65, dtype=dtype, magnitude=2.0)
    spec = Spec(name, causal=True)
    q, k, v, w = case.tensors()
    x = validate(q, k, v, spec, w)
    _, (s, z) = attention_with_state(q, k, v, name, w, form=form, chunk_size=16)
    exact_s, exact_z = exact_state(x, spec)
    bound_s, bound_z = state_bound(x, spec, UNIT_ROUNDOFF[dtype])
    assert np.all(np.abs(s.double().numpy() - exact_s) <= bound_s)
    assert np.all(np.abs(z.double().numpy() - exact_z) <= bound_z)
    # a state stored two precisions below the inputs' is outside it
    coarse = {"float32": torch.bfloat16, "bfloat16": None, "float16": None}[dtype]
    if coarse is not None:
        rounded = s.to(coarse).double().numpy()
        assert np.any(np.abs(rounded - exact_s) > bound_s)


def test_the_built_in_state_continues_a_sequence_and_rejects_a_bad_one():
    q, k, v, _ = _case("elu", n=20, dtype="float32").tensors()
    whole, (s, z) = attention_with_state(q, k, v, form="recurrent")
    head, state = attention_with_state(q[..., :9, :], k[..., :9, :], v[..., :9, :])
    rest, (s2, z2) = attention_with_state(q[..., 9:, :], k[..., 9:, :], v[..., 9:, :],
                                          initial_state=state)  # fmt: skip
    torch.testing.assert_close(torch.cat([head, rest], -2), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s2, s, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(z2, z, rtol=1e-5, atol=1e-6)
    with pytest.raises(SpecError, match=r"S \(B, H, F, dv\) and z \(B, H, F\)"):
        attention_with_state(q, k, v, initial_state=(s, z[..., :2]))
    with pytest.raises(SpecError, match="a pair"):
        attention_with_state(q, k, v, initial_state=s)
    with pytest.raises(SpecError, match="cosformer"):
        attention_with_state(q, k, v, "cosformer", initial_state=(s, z))


@pytest.mark.parametrize(
    ("target", "options", "message"),
    [
        ("tests.vet_targets:elu_linear", {"feature_map": "elu", "state": "declared"}, "Sz"),
        ("fla.based-naive", {"state": "declared"}, "takes no state"),
        (None, {"feature_map": "elu", "state": "declared"}, "carries no state"),
        (None, {"feature_map": "cosformer", "causal": True, "form": "chunked",
                "state": "declared"}, "cosformer"),
    ],
)  # fmt: skip
def test_declaring_a_state_that_cannot_be_is_a_spec_error(target, options, message):
    with pytest.raises(SpecError, match=message):
        resolve(target, load=False, **options)


def test_a_state_of_the_wrong_shape_or_kind_is_an_implementation_failure():
    q, k, v, _ = _case("elu", dtype="float32").tensors()

    def no_pair(q, k, v, initial_state=None):
        return q

    def short_s(q, k, v, initial_state=None):
        out, (s, z) = attention_with_state(q, k, v)
        return out, (s[..., :1], z)

    for fn, message in ((no_pair, "not the pair (out, final_state)"), (short_s, "not (B, H, F")):
        impl = resolve(fn, feature_map="elu", causal=True, state="Sz")
        with pytest.raises(ImplementationFailure, match=re.escape(message)):
            impl.call_state(q, k, v)


def test_the_reproduce_command_names_the_state(capsys):
    impl = resolve(None, feature_map="elu", causal=True, form="chunked", state="declared")
    case = _case("elu", n=9, dtype="float32")
    words = shlex.split(impl.reproduce("final-state", case))
    assert "--state" in words
    assert main(words[3:]) == 0
    assert "final-state: pass" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["state-split", "initial-state", "final-state"])
def test_the_fla_naive_adapter_carries_its_state_in_float32(name, capsys):
    pytest.importorskip("einops")
    case = Case(2, 2, 40, 8, 4, "float32", "normal", 1.0, 3).to_json()
    code = main(["check", name, "--impl", "fla.linear-attn-naive", "--state", "--case", case])
    out = capsys.readouterr().out
    assert code == 0 and f"{name}: pass" in out, out
