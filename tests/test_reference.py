"""The exact references: closed forms, engine agreement, precision control, hard cases."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import scipy.special
import torch
from hypothesis import given, note
from hypothesis import strategies as st

import linattn_verify as lv
from linattn_verify.families import exact, family_of, validate
from linattn_verify.families.kernelised.reference import KERNELISED
from linattn_verify.reference.arb import arb_attention
from linattn_verify.reference.mp import mp_attention

ALL = list(lv.FEATURE_MAPS)
PERFORMER = [n for n in ALL if lv.FEATURE_MAPS[n].needs_projection]
# Maps whose weights are all equal when q = k = 0 (relu and cosformer give 0 there).
EQUAL_AT_ZERO = ["softmax", "elu", "taylor", *PERFORMER]


def _w(name: str, d: int, m: int | None = None, seed: int = 0):
    return lv.sample_projection(m or d, d, "iid", seed) if name in PERFORMER else None


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in units of the float64 spacing at the larger of the two (0 where equal)."""
    gap = np.spacing(np.maximum(np.abs(a), np.abs(b)))
    return np.where(a == b, 0.0, np.abs(a - b) / gap)


def _running_mean(v: np.ndarray, causal: bool) -> np.ndarray:
    """Mean over keys (causal: over keys 0..i), in exact rationals, correctly rounded."""
    out = np.empty_like(v)
    n = v.shape[2]
    for idx in np.ndindex(v.shape[0], v.shape[1], v.shape[3]):
        col = [Fraction(t) for t in v[idx[0], idx[1], :, idx[2]]]
        for i in range(n):
            keys = col[: i + 1] if causal else col
            out[idx[0], idx[1], i, idx[2]] = float(sum(keys) / len(keys))
    return out


@pytest.mark.parametrize("engine", ["mp", "arb"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ALL)
def test_constant_values_give_the_constant(name, causal, engine):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 2, 5, 3))
    q, k = np.abs(q) + 0.1, np.abs(k) + 0.1  # relu/cosformer: non-zero denominators
    v = np.broadcast_to(np.array([0.1, -3.0, 7e5]), (1, 2, 5, 3))
    out = lv.reference(q, k, v, name, causal, _w(name, 3), engine=engine)
    np.testing.assert_array_equal(out, np.broadcast_to(v, out.shape))


@pytest.mark.parametrize("engine", ["mp", "arb"])
@pytest.mark.parametrize("name", ALL)
def test_single_token_gives_its_value(name, engine):
    rng = np.random.default_rng(2)
    q, k = np.abs(rng.standard_normal((2, 2, 3, 1, 4))) + 0.1
    v = rng.standard_normal((2, 3, 1, 5))
    out = lv.reference(q, k, v, name, True, _w(name, 4), engine=engine)
    np.testing.assert_array_equal(out, v)


@pytest.mark.parametrize("engine", ["mp", "arb"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", EQUAL_AT_ZERO)
def test_equal_weights_give_the_mean(name, causal, engine):
    v = np.random.default_rng(3).standard_normal((1, 1, 6, 2))
    z = np.zeros((1, 1, 6, 4))
    out = lv.reference(z, z, v, name, causal, _w(name, 4), engine=engine)
    assert np.max(_ulps(out, _running_mean(v, causal))) <= 1


def test_softmax_matches_scipy_within_the_float64_bound():
    """scipy in float64 is a sane float64 algorithm: it must satisfy our a-priori bound."""
    from linattn_verify.accuracy import judge

    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 2, 2, 40, 8))
    for causal in (False, True):
        logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
        if causal:
            logits = np.where(np.tri(40, dtype=bool), logits, -np.inf)
        theirs = scipy.special.softmax(logits, axis=-1) @ v
        spec = lv.Spec("softmax", causal)
        x = validate(q, k, v, spec)
        ref = exact(x, spec)
        verdict = judge(theirs, x, spec, ref)
        assert verdict.within_bound, verdict.message
        assert verdict.max_error > 0  # scipy does round: the comparison is not vacuous


@pytest.mark.parametrize("name", ALL)
def test_mp_engine_agrees_with_itself_at_double_precision(name):
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 1, 1, 7, 3)) * 2
    spec = lv.Spec(name, causal=True)
    x = validate(np.abs(q), k, v, spec, _w(name, 3))
    low = mp_attention(x, spec, family_of(spec).similarity, prec=113)
    high = mp_attention(x, spec, family_of(spec).similarity, prec=226)
    assert np.nanmax(_ulps(low, high)) <= 1


SHAPES = st.tuples(
    st.integers(1, 2), st.integers(1, 2), st.integers(1, 7), st.integers(1, 4), st.integers(1, 3)
)


@st.composite
def cases(draw):
    """Small inputs for every spec: random, scaled over magnitudes, and structured."""
    name = draw(st.sampled_from(ALL), label="feature map")
    causal = draw(st.booleans(), label="causal")
    b, h, n, d, dv = draw(SHAPES, label="B,H,N,d,dv")
    dtype = draw(st.sampled_from([np.float64, np.float32, np.float16]), label="dtype")
    info = np.finfo(dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="seed"))
    qk_scale = 10.0 ** draw(st.integers(-3, 2), label="log10 |q|,|k|")
    v_exp = draw(st.integers(-info.maxexp // 8, info.maxexp // 8), label="log2 |v|")
    q, k = rng.standard_normal((2, b, h, n, d)) * qk_scale
    v = rng.standard_normal((b, h, n, dv)) * 2.0**v_exp
    structure = draw(st.sampled_from(["random", "identical", "dominant", "cancel"]), label="case")
    if structure == "identical":
        k[:] = k[:, :, :1]
    elif structure == "dominant":
        k[:, :, 0] = q.mean(axis=2) * 30
    elif structure == "cancel" and n >= 3:  # +-big beyond the dtype's precision around v
        big = 2.0 ** (v_exp + info.nmant + 2)
        v[:, :, 0], v[:, :, 1] = big, -big
    eps = draw(st.sampled_from([0.0, 1e-6]), label="eps")
    w = _w(name, d, draw(st.integers(1, 5), label="m"), 0)
    return name, causal, eps, q.astype(dtype), k.astype(dtype), v.astype(dtype), w


@given(cases())
def test_arb_engine_agrees_with_mpmath(case):
    name, causal, eps, q, k, v, w = case
    spec = lv.Spec(name, causal=causal, eps=eps)
    x = validate(q, k, v, spec, w)
    mp_out, arb_out = (
        mp_attention(x, spec, family_of(spec).similarity),
        arb_attention(x, spec, family_of(spec).similarity),
    )
    note(f"mp {mp_out.ravel()[:6]}, arb {arb_out.ravel()[:6]}")
    np.testing.assert_array_equal(np.isnan(mp_out), np.isnan(arb_out))
    # each engine returns one of the two doubles around the exact value: at most 1 apart
    assert np.nanmax(_ulps(mp_out, arb_out), initial=0) <= 1


def test_arb_causal_blocks_agree_with_mpmath_on_a_long_sequence():
    """N = 150 crosses two causal blocks and a ragged tail; mp checks rows at the seams."""
    rng = np.random.default_rng(6)
    q, k, v = rng.standard_normal((3, 1, 1, 150, 4))
    spec = lv.Spec("elu", causal=True)
    x = validate(q, k, v, spec)
    out = arb_attention(x, spec, family_of(spec).similarity)
    for i in [0, 63, 64, 127, 128, 149]:  # causal row i == non-causal on keys 0..i
        xi = validate(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1], lv.Spec("elu"))
        np.testing.assert_array_equal(
            out[:, :, i : i + 1], mp_attention(xi, lv.Spec("elu"), KERNELISED)
        )


@pytest.mark.parametrize("engine", ["mp", "arb"])
@pytest.mark.parametrize("name", EQUAL_AT_ZERO)
@pytest.mark.parametrize("big", [1e16, 1e30, 1e300])
def test_cancellation_in_v_is_resolved(name, big, engine):
    z = np.zeros((1, 1, 3, 2))
    v = np.array([big, 1.0, -big]).reshape(1, 1, 3, 1)
    out = lv.reference(z, z, v, name, projection=_w(name, 2), engine=engine)
    np.testing.assert_array_equal(out, np.full((1, 1, 3, 1), 1 / 3))


@pytest.mark.parametrize("engine", ["mp", "arb"])
def test_logits_far_outside_the_exponent_range(engine):
    """exp(+-1.6e7) overflows every machine format; the dominant key's value is the answer."""
    q = np.full((1, 1, 2, 1), 4000.0)
    k = np.array([4000.0, -4000.0, 3999.0]).reshape(1, 1, 3, 1)
    v = np.array([1.0, 2.0, 3.0]).reshape(1, 1, 3, 1)
    out = lv.reference(q, k, v, "softmax", engine=engine)
    # weights exp(s) with s = 1.6e7, -1.6e7, 1.6e7 - 4000: the third is e^-4000 smaller
    np.testing.assert_array_equal(out, np.ones((1, 1, 2, 1)))


@pytest.mark.parametrize("engine", ["mp", "arb"])
def test_elu_denominators_that_underflow_every_format(engine):
    """phi = exp(x) near exp(-1000): below float64's smallest subnormal, yet exact ratios."""
    q = np.full((1, 1, 2, 2), -1000.0)
    k = np.array([[-1000.0, -1000.0], [-1001.0, -1001.0]]).reshape(1, 1, 2, 2)
    v = np.array([0.0, 1.0]).reshape(1, 1, 2, 1)
    out = lv.reference(q, k, v, "elu", engine=engine)
    # weights 2 e^-1000 e^-1000 and 2 e^-1000 e^-1001: out = 1 / (1 + e)
    assert np.max(_ulps(out, np.full(out.shape, 1 / (1 + np.e)))) <= 2


@pytest.mark.parametrize("engine", ["mp", "arb"])
def test_performer_features_that_underflow_every_format(engine):
    """d = m = 1, W = 1: phi(x) = exp(x - x^2/2) ~ e^-840 at x = -40; the ratio of the two
    weights is exp(L_1 - L_0), L = k - k^2/2, so out = 1 / (1 + exp(L_0 - L_1))."""
    q = np.full((1, 1, 1, 1), -40.0)
    k = np.array([-40.0, -40.0078125]).reshape(1, 1, 2, 1)
    v = np.array([0.0, 1.0]).reshape(1, 1, 2, 1)
    out = lv.reference(q, k, v, "performer-positive", projection=np.ones((1, 1)), engine=engine)
    with mpmath.workprec(200):
        lo, l1 = (mpmath.mpf(t) - mpmath.mpf(t) ** 2 / 2 for t in k.ravel())
        expected = float(1 / (1 + mpmath.exp(lo - l1)))
    assert 0.1 < expected < 0.9  # the case is not degenerate
    assert np.max(_ulps(out, np.full(out.shape, expected))) <= 1


@pytest.mark.parametrize("engine", ["mp", "arb"])
def test_relu_zero_denominator_is_nan_and_eps_defines_it(engine):
    q = -np.ones((1, 1, 2, 2))
    k = np.ones((1, 1, 2, 2))
    v = np.ones((1, 1, 2, 1))
    assert np.isnan(lv.reference(q, k, v, "relu", engine=engine)).all()
    np.testing.assert_array_equal(lv.reference(q, k, v, "relu", eps=0.5, engine=engine), 0.0)


def test_reduced_precision_inputs_are_taken_exactly():
    q = torch.randn(1, 1, 4, 3, dtype=torch.bfloat16)
    as64 = q.to(torch.float64)
    np.testing.assert_array_equal(
        lv.reference(q, q, q, "softmax", causal=True),
        lv.reference(as64, as64, as64, "softmax", causal=True),
    )


GOOD = np.zeros((1, 1, 2, 3))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"q": np.zeros((1, 1, 2, 4))}, "head dimensions differ"),
        ({"v": np.zeros((1, 1, 3, 3))}, "different N"),
        ({"q": np.zeros((1, 1, 0, 3))}, "empty dimension"),
        ({"q": np.zeros((1, 1, 2, 0)), "k": np.zeros((1, 1, 2, 0))}, "empty dimension"),
        ({"q": np.full((1, 1, 2, 3), np.nan)}, "non-finite value nan"),
        ({"v": np.full((1, 1, 2, 3), np.inf)}, "non-finite value inf"),
        ({"feature_map": "gelu"}, "unknown feature map 'gelu'"),
        ({"feature_map": "performer-positive"}, "needs projection"),
        ({"projection": np.ones((2, 3))}, "takes no projection"),
        ({"q": np.zeros((1, 1, 2, 3), dtype=np.int64)}, "dtype int64"),
        ({"q": [[1.0]]}, "must be a torch tensor or numpy array"),
        ({"q": np.zeros((2, 3))}, "must be 4-d"),
        ({"k": np.zeros((1, 2, 2, 3))}, "batch and head dimensions differ"),
        ({"eps": -1.0}, "eps must be finite"),
        ({"engine": "fast"}, "unknown engine"),
        ({"causal": True, "q": np.zeros((1, 1, 3, 3))}, "as many queries as keys"),
    ],
)
def test_bad_input_is_a_clear_error(kwargs, message):
    args = {"q": GOOD, "k": GOOD, "v": GOOD, "feature_map": "elu", **kwargs}
    with pytest.raises(lv.SpecError, match=message):
        lv.reference(**args)


def test_projection_shape_is_checked():
    with pytest.raises(lv.SpecError, match=r"projection must have shape \(m, d\)"):
        lv.reference(GOOD, GOOD, GOOD, "performer-trig", projection=np.ones((4, 2)))


@pytest.mark.parametrize("engine", ["mp", "arb"])
def test_an_exact_value_on_a_rounding_boundary_is_faithfully_rounded(engine):
    """Equal irrational weights (elu: exp(-1) features) and v = 1, 1 + 2^-52: the mean
    1 + 2^-53 lies halfway between two doubles, so either neighbour is within one ulp and
    no precision decides between them."""
    q = np.full((1, 1, 2, 1), -1.0)
    v = np.array([1.0, 1 + 2**-52]).reshape(1, 1, 2, 1)
    out = lv.reference(q, q, v, "elu", engine=engine)
    assert set(out.ravel()) <= {1.0, 1 + 2**-52}
