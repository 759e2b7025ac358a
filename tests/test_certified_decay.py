"""The certified engine on the specs that are not plain (reference/certified.py,
certified_decay.py): scaled, unnormalised, constant decay, gates, channel gates. Its bound
holds against arb (correctly rounded) element by element on random and adversarial inputs
(no decay at all, decays that kill the state in a token and underflow, gamma next to 1,
values of both signs, features that underflow, ragged chunks, N = 1), and typical inputs
are certified without arb."""

from __future__ import annotations

import numpy as np
import pytest

from linattn_verify.families import exact, family_of, validate
from linattn_verify.families.channel_gates.fields import CHANNEL_GATED_MAPS
from linattn_verify.reference import CERTIFIED_SHARE, certified_attention
from linattn_verify.reference import certified as engine
from linattn_verify.reference import certified_decay as decayed
from linattn_verify.specs import Spec, SpecError

KINDS = ("normal", "no-decay", "strong", "near-one", "mixed-v", "spikes", "negative-rows")
# (feature map, decay, normalize, scale, eps): every decay with the channel-gated maps,
# the scalar decays with the others; scales and normalisation varied across them
CASES = [
    (name, decay, norm, scale, eps)
    for name in CHANNEL_GATED_MAPS
    for decay, norm, scale, eps in (
        ("constant", True, 1.0, 0.0),
        ("gates", False, "d^-0.5", 0.0),
        ("channel-gates", True, "d^-0.5", 0.5),
        ("channel-gates", False, 0.3, 0.0),
    )
] + [
    ("performer-positive", "gates", True, "d^-0.5", 0.0),
    ("performer-trig", "constant", False, 1.0, 0.0),
    ("taylor", "gates", True, 0.3, 0.0),
]


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 8 tokens, sub-chunks of 4, 2 chunks per step: N = 37 crosses sub-chunks,
    chunks, steps and a ragged end."""
    monkeypatch.setattr(decayed, "CHUNK", 8)
    monkeypatch.setattr(decayed, "SUB", 4)
    monkeypatch.setattr(decayed, "GROUP", 2)


def _decay(kind: str, decay: str, rng, shape: tuple[int, ...]) -> np.ndarray:
    """gamma (H,) or log-gates (B, H, N[, d]) of one adversarial kind."""
    b, h, n, d = shape
    if decay == "constant":
        return {
            "no-decay": np.ones(h),
            "strong": np.array([1e-200, 1e-3])[:h],  # gamma^2 underflows
            "near-one": 1 - 2.0 ** -np.arange(40, 40 + h),
        }.get(kind, rng.uniform(0.7, 0.99, h))
    size = (b, h, n) if decay == "gates" else (b, h, n, d)
    if kind == "no-decay":
        return np.zeros(size)
    if kind == "strong":  # the state killed in a token; factors far below 2^-1074
        return -rng.uniform(20, 900, size)
    if kind == "near-one":
        return -1e-12 * rng.exponential(1.0, size)
    if kind == "spikes":  # mostly no decay, a few tokens that kill it mid-chunk
        return np.where(rng.random(size) < 0.1, -800.0, 0.0)
    return -rng.exponential(0.2, size)


def _inputs(kind: str, spec: Spec, seed: int, n: int = 37, d: int = 4):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(2, 2, 2, n, d))
    v = rng.normal(0.0 if kind == "mixed-v" else 1.0, 1.0, size=(2, 2, n, 3))
    if kind == "mixed-v":  # values of both signs and very different sizes per column
        v *= np.array([1e-3, 1.0, 1e3])
    if kind == "negative-rows":  # relu rows without a positive feature, elu's exp(-800)
        q[0, 0, :6] = -np.abs(q[0, 0, :6]) - 800
        k[0, 1, 3:9] = -np.abs(k[0, 1, 3:9]) - 800
    w = rng.normal(size=(d, d)) if spec.info.needs_projection else None
    decay = None if spec.decay is None else _decay(kind, spec.decay, rng, q.shape)
    return validate(q, k, v, spec, w, decay)


def _holds(x, spec: Spec) -> engine.Certified:
    """The certified result, after checking it against arb: NaN where arb's is, the same
    infinity where the exact value overflows float64 (performer-trig's exp(|x'|^2 / 2)
    unnormalised), within its bound (and within CERTIFIED_SHARE s, or arb's own rounding)
    everywhere else."""
    got = certified_attention(x, spec, family_of(spec).similarity)
    ref = exact(x, spec, "arb")
    assert np.array_equal(np.isnan(got.values), np.isnan(ref))
    assert np.array_equal(got.values[np.isinf(ref)], ref[np.isinf(ref)])
    defined = np.isfinite(ref)
    err = np.abs(got.values - ref)[defined]
    assert np.all(err <= got.bound[defined]), (np.max(err / got.bound[defined]), got.recomputed)
    # within the certified share of the scale (where the float64 sums give one), or of ulp
    share = np.nan_to_num(CERTIFIED_SHARE * got.scale[defined], nan=0.0)
    assert np.all(err <= share + 2 * 2.0**-53 * np.abs(ref[defined]))
    return got


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "decay", "norm", "scale", "eps"), CASES)
def test_the_decayed_bound_holds_against_arb(small_chunks, kind, name, decay, norm, scale, eps):
    spec = Spec(name, causal=True, eps=eps, normalize=norm, scale=scale, decay=decay)
    _holds(_inputs(kind, spec, seed=len(kind) + len(name)), spec)


@pytest.mark.parametrize("name", ["softmax", "elu", "identity", "cosformer", "performer-trig"])
@pytest.mark.parametrize("causal", [False, True])
def test_scaled_and_unnormalised_specs_hold_against_arb(name, causal):
    for normalize, scale, eps in ((True, "d^-0.5", 0.5), (False, 0.3, 0.0)):
        if name == "softmax" and not normalize:
            continue
        spec = Spec(name, causal=causal, eps=eps, normalize=normalize, scale=scale)
        got = _holds(_inputs("normal", spec, seed=7), spec)
        assert got.recomputed == 0


@pytest.mark.parametrize(("name", "decay", "norm", "scale", "eps"), CASES)
def test_typical_decayed_inputs_are_certified_without_arb(
    small_chunks, name, decay, norm, scale, eps
):
    spec = Spec(name, causal=True, eps=eps, normalize=norm, scale=scale, decay=decay)
    got = certified_attention(
        _inputs("normal", spec, seed=11, n=70, d=8), spec, family_of(spec).similarity
    )
    assert got.recomputed == 0
    assert np.all(got.bound <= CERTIFIED_SHARE * got.scale)


@pytest.mark.parametrize("decay", ["constant", "gates", "channel-gates"])
def test_the_engine_sizes_cross_chunks_and_sub_chunks(decay):
    """CHUNK and SUB as shipped: N = 300 crosses two chunk boundaries, ragged."""
    spec = Spec("elu", causal=True, scale="d^-0.5", decay=decay)
    got = _holds(_inputs("normal", spec, seed=3, n=300, d=8), spec)
    assert got.recomputed == 0


@pytest.mark.parametrize("decay", ["constant", "gates", "channel-gates"])
def test_one_token(decay):
    spec = Spec("identity", causal=True, normalize=False, decay=decay)
    _holds(_inputs("normal", spec, seed=1, n=1), spec)


def test_the_half_decays_exponents_are_at_least_half_the_exact_ones():
    """HALF's condition (certified_decay.py): 2 HALF (1 + gamma_e)(1 + u) <= 1."""
    _, gamma_e = decayed.log_decays(np.float64(0.5), 1)
    assert 2 * decayed.HALF * (1 + gamma_e) * (1 + 2.0**-53) <= 1


def test_numpy_log_is_within_the_assumed_ulps():
    """ln gamma of the constant decay: the engine's LIB_ULPS assumption for np.log."""
    from flint import arb

    rng = np.random.default_rng(0)
    args = np.concatenate([rng.uniform(0, 1, 2000), 1 - rng.uniform(0, 1e-6, 2000)])
    exact_values = np.array([float(arb(t).log()) for t in args.tolist()])
    ulps = np.abs(np.log(args) - exact_values) / np.spacing(np.abs(exact_values))
    assert ulps.max() <= engine.LIB_ULPS, ulps.max()


def test_the_delta_rule_has_its_own_engine():
    spec = Spec("identity", causal=True, normalize=False, delta_rule=True)
    with pytest.raises(SpecError, match="its certified engine and references are its family"):
        certified_attention(
            _inputs("normal", Spec("identity", causal=True), seed=0),
            spec,
            family_of(spec).similarity,
        )


def _within(x, spec: Spec) -> None:
    """Every defined element within its bound of arb's value (no share: these are at the
    edge of float64's range, where arb settles rows)."""
    got, ref = certified_attention(x, spec, family_of(spec).similarity), exact(x, spec, "arb")
    defined = np.isfinite(ref)
    assert np.all(np.abs(got.values - ref)[defined] <= got.bound[defined])


@pytest.mark.parametrize("normalize", [True, False])
def test_an_underflowed_product_scaled_by_the_query_is_bounded(normalize):
    """phi(k) v = 1e-10 x 1.2345e-310 underflows (half a subnormal unit of error), then
    times phi(q) = 1e10 through the state (key 0, query 128, beyond a chunk): the bound
    carries the error times the query's features (it was 0, the value off by 1.4e-4)."""
    n = 129
    q, k, v = np.zeros((3, 1, 1, n, 1))
    q[0, 0, 128], k[0, 0, 0], v[0, 0, 0] = 1e10, 1e-10, 1.2345e-310
    spec = Spec("relu", causal=True, normalize=normalize)
    _within(validate(q, k, v, spec), spec)


def test_a_result_rounded_below_2_to_the_minus_1022_is_charged_a_subnormal_unit():
    """c = 2^-1074 times N = 3.5 - 5e-18 (computed 3.5): fl(c N^) is 4 units, the exact
    value rounds to 3; the bound was u |out| = 0."""
    q, k = np.ones((2, 1, 1, 2, 1))
    v = np.array([0.5, 3.0]).reshape(1, 1, 2, 1)
    g = np.array([0.0, -1e-17]).reshape(1, 1, 2)
    spec = Spec("identity", causal=True, normalize=False, scale=2.0**-1074, decay="gates")
    _within(validate(q, k, v, spec, None, g), spec)
