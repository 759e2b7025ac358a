"""The certified engine (reference/certified.py): its bound holds against arb, element by
element, for every spec on random and adversarial inputs, through several chunks and
streamed steps; it certifies typical inputs without falling back; its library assumption
holds; and the a-priori bound's float64 sums agree with its ball-arithmetic ones."""

from __future__ import annotations

import numpy as np
import pytest
from flint import arb

from linattn_verify.accuracy.bound import scale_and_bound
from linattn_verify.families import exact, family_of, validate
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.reference import CERTIFIED_SHARE, certified_attention, certified_engine
from linattn_verify.reference import certified as engine
from linattn_verify.specs import FEATURE_MAPS, Spec

SPECS = [(name, causal) for name in FEATURE_MAPS for causal in (False, True)]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 8 rows, 2 chunks per step: N = 37 crosses chunks, steps and a ragged end."""
    monkeypatch.setattr(engine, "CHUNK", 8)
    monkeypatch.setattr(engine, "GROUP", 2)
    monkeypatch.setattr(engine, "STEP", 16)


def _inputs(kind: str, name: str, causal: bool, seed: int, n: int = 37, d: int = 4):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 1, 2, n, d))
    v = rng.normal(1.0, 1.0, size=(1, 2, n, 3))
    if kind == "large":  # exponents of tens, features of e^10 and more
        q, k = 6 * q, 6 * k
    elif kind == "cancelling-v":  # values 1000 + tiny: the output's digits cancel in v
        v = 1000 + 1e-6 * v
    elif kind == "negative-rows":  # relu rows without a positive similarity, elu exp(-800)
        q[0, 0, :6] = -np.abs(q[0, 0, :6]) - (800 if name == "elu" else 1)
    elif kind == "one-key":  # a key far larger than the rest: weights of very mixed sizes
        k[0, 1, 3] *= 8
    w = rng.normal(size=(d, d)) if FEATURE_MAPS[name].needs_projection else None
    spec = Spec(name, causal=causal, eps=0.5 if kind == "eps" else 0.0)
    return validate(q, k, v, spec, w), spec


@pytest.mark.parametrize(
    "kind", ["normal", "large", "cancelling-v", "negative-rows", "one-key", "eps"]
)
@pytest.mark.parametrize(("name", "causal"), SPECS)
def test_the_certified_bound_holds_against_arb(small_chunks, kind, name, causal):
    x, spec = _inputs(kind, name, causal, seed=len(kind) + 3 * causal)
    got = certified_attention(x, spec, family_of(spec).similarity)
    ref = exact(x, spec, "arb")
    assert np.array_equal(np.isnan(got.values), np.isnan(ref))
    defined = ~np.isnan(ref)
    err = np.abs(got.values - ref)[defined]
    assert np.all(err <= got.bound[defined]), (np.max(err / got.bound[defined]), got.recomputed)
    # within the certified share of the scale (where the float64 sums give one), or of ulp
    share = np.nan_to_num(CERTIFIED_SHARE * got.scale[defined], nan=0.0)
    assert np.all(err <= share + 2 * 2.0**-53 * np.abs(ref[defined]))


@pytest.mark.parametrize(("name", "causal"), SPECS)
def test_typical_inputs_are_certified_without_arb(small_chunks, name, causal):
    x, spec = _inputs("normal", name, causal, seed=11, n=70)
    got = certified_attention(x, spec, family_of(spec).similarity)
    assert got.recomputed == 0
    assert np.nanmax(got.bound / got.scale) < CERTIFIED_SHARE


def test_rows_it_cannot_certify_are_settled_by_arb(monkeypatch):
    x, spec = _inputs("normal", "elu", True, seed=5)
    monkeypatch.setattr(certified_engine, "CERTIFIED_SHARE", 1e-300)  # nothing is certified
    got = certified_attention(x, spec, family_of(spec).similarity)
    assert got.recomputed == 37 * 2
    assert np.array_equal(got.values, exact(x, spec, "arb"))


def test_rows_not_named_keep_their_float64_values_within_their_bounds(monkeypatch):
    """settle=: the rows named go to arb; the others keep the float64 pass's values, within
    their (finite) bounds of the exact ones, but for a row whose bound is infinite."""
    x, spec = _inputs("normal", "elu", True, seed=5)
    monkeypatch.setattr(certified_engine, "CERTIFIED_SHARE", 1e-300)  # nothing is certified
    plain = certified_attention(
        x, spec, family_of(spec).similarity, settle=np.zeros(x.shape[:3], dtype=bool)
    )
    assert plain.recomputed == 0 and np.isfinite(plain.bound).all()
    ref = exact(x, spec, "arb")
    assert np.all(np.abs(plain.values - ref) <= plain.bound)
    named = np.zeros(x.shape[:3], dtype=bool)
    named[0, 1, [3, 30]] = True
    got = certified_attention(x, spec, family_of(spec).similarity, settle=named)
    assert got.recomputed == 2
    assert np.array_equal(got.values[named], ref[named])
    assert np.array_equal(got.values[~named], plain.values[~named])
    x, spec = _inputs("normal", "performer-trig", True, seed=5)
    x.k[0, 0, 7] *= 60  # e^(|k'|^2 / 2) overflows float64: head (0, 0) loses its bounds
    lost = certified_attention(
        x, spec, family_of(spec).similarity, settle=np.zeros(x.shape[:3], dtype=bool)
    )
    assert (
        lost.recomputed == x.shape[2]
    )  # every row of that head (its NaN products), none of the other's
    assert np.isfinite(lost.bound).all()
    assert np.all(np.abs(lost.values - exact(x, spec, "arb")) <= lost.bound)


@pytest.mark.parametrize("fn", ["exp", "sin", "cos"])
def test_numpy_elementary_functions_are_within_the_assumed_ulps(fn):
    """LIB_ULPS, the engine's one assumption, on arguments where the features take them."""
    rng = np.random.default_rng(0)
    args = np.concatenate([rng.uniform(-700, 30, 2000), rng.normal(0, 3, 2000)])
    if fn != "exp":
        args = rng.uniform(-8, 8, 4000)
    got = getattr(np, fn)(args)
    exact_values = np.array([float(getattr(arb(t), fn)()) for t in args.tolist()])
    ulps = np.abs(got - exact_values) / np.spacing(np.abs(exact_values))
    assert ulps.max() <= engine.LIB_ULPS, ulps.max()


@pytest.mark.parametrize(("name", "causal"), [s for s in SPECS if s[0] != "softmax"])
def test_the_fast_bound_agrees_with_the_ball_arithmetic_one(name, causal):
    x, spec = _inputs("normal", name, causal, seed=2)
    ref = exact(x, spec)
    for dtype in ("float32", "float16"):
        u = UNIT_ROUNDOFF[dtype]
        s_arb, b_arb = scale_and_bound(x, spec, ref, u, engine="arb")
        s_fast, b_fast = scale_and_bound(x, spec, ref, u, engine="fast")
        assert np.allclose(s_fast, s_arb, rtol=1e-5, equal_nan=True)
        ratio = b_fast / b_arb
        assert np.nanmin(ratio) > 1 - 1e-5 and np.nanmax(ratio) < 1 + 1e-3, (dtype, ratio)
