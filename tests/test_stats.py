"""The random-feature statistics themselves: the derived moments against Lemma 2 and against
simulation, the calibration of the tests under the null, their power against biased samplers,
and attention checks that fail broken implementations.

False-failure probabilities: every z-test here is at decide.ALPHA (1e-10); the calibration
KS test at 1e-8; with the properties (about 160 assertions at 1e-10 under ci) a run stays
below 5e-8, inside the suite's 1e-6 (docs/architecture.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch

from linattn_verify.stats import (
    KINDS,
    Pair,
    Sequence1,
    attention_bound,
    bound_check,
    builtin_sampler,
    check_sampler,
    draw_projections,
    mean_test,
    mse_iid,
    mse_orthogonal,
    numpy_sampler,
    orthogonal_mse,
    pair_moment,
    rate_check,
    softmax_kernel,
)
from linattn_verify.stats.checks import below_iid_applies
from linattn_verify.stats.decide import Z_TWO_SIDED, power
from linattn_verify.stats.estimators import row_terms
from linattn_verify.stats.moments import pair_moment_orthogonal, squared_error_variance
from linattn_verify.stats.panel import (
    DEFAULT_D,
    DEFAULT_M,
    DEFAULT_REPLICATES,
    PANEL_NORM,
    panel,
)
from linattn_verify.under_test import Implementation, resolve
from tests.zoo.random_features import BROKEN_SAMPLERS, truncated_features

RNG_PAIRS = [
    Pair(*np.random.default_rng(seed).standard_normal((2, d)) * scale)
    for seed, d, scale in ((0, 1, 0.7), (1, 4, 0.4), (2, 16, 0.25), (3, 5, 1.0))
]


def lemma_2(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Lemma 2 of Choromanski et al. 2021 (Rethinking Attention with Performers), transcribed
    as printed; SM = exp(x.y)."""
    sm = math.exp(x @ y)
    plus, minus = float((x + y) @ (x + y)), float((x - y) @ (x - y))
    mse_plus = math.exp(plus) * sm**2 * (1 - math.exp(-plus)) / m
    if kind == "performer-positive":
        return mse_plus
    if kind == "performer-hyperbolic":
        return 0.5 * (1 - math.exp(-plus)) * mse_plus
    return math.exp(plus) * sm**-2 * (1 - math.exp(-minus)) ** 2 / (2 * m)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", RNG_PAIRS, ids=lambda p: f"d{len(p.x)}")
def test_derived_mse_is_lemma_2(kind, pair):
    for m in (1, 7, 64):
        assert mse_iid(kind, pair.x, pair.y, m) == pytest.approx(
            lemma_2(kind, pair.x, pair.y, m), rel=1e-12
        )


def _z(samples: np.ndarray, expected: float) -> float:
    return mean_test(samples, expected).z


@pytest.mark.parametrize("kind", KINDS)
def test_cross_moment_matches_simulation(kind):
    """E[h(x, y1) h(x, y2)] with y1 != y2 (what the attention bound uses)."""
    x, y1, y2 = np.random.default_rng(5).standard_normal((3, 6)) * 0.3
    w = np.random.default_rng(6).standard_normal((400_000, 6))
    product = row_terms(kind, x, y1, w) * row_terms(kind, x, y2, w)
    assert abs(_z(product, float(pair_moment(kind, x, y1, y2)))) <= Z_TWO_SIDED


def _orthogonal_pairs(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2, d): the first two rows of n independent orthogonal blocks with chi(d) norms."""
    q, r = np.linalg.qr(rng.standard_normal((n, d, d)))
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    rows = np.swapaxes(q, 1, 2)[:, :2]
    return rows * np.sqrt(rng.chisquare(d, size=(n, 2)))[..., None]


@pytest.mark.parametrize("d", [2, 3, 8])
@pytest.mark.parametrize("kind", KINDS)
def test_orthogonal_pair_moment_matches_simulation(kind, d):
    x, y = np.random.default_rng(d).standard_normal((2, d)) * 0.5
    w = _orthogonal_pairs(200_000, d, np.random.default_rng(10 + d))
    terms = row_terms(kind, x, y, w)
    expected = pair_moment_orthogonal(kind, x, y)
    assert abs(_z(terms[:, 0] * terms[:, 1], expected)) <= Z_TWO_SIDED


def test_orthogonal_mse_is_iid_without_pairs():
    """One row per block (d = 1) or one row in all (m = 1): nothing is coupled."""
    x, y = np.array([0.4]), np.array([0.3])
    for kind in KINDS:
        assert mse_orthogonal(kind, x, y, 5) == pytest.approx(mse_iid(kind, x, y, 5), rel=1e-12)
        x4, y4 = np.full(4, 0.2), np.full(4, 0.1)
        assert mse_orthogonal(kind, x4, y4, 1) == pytest.approx(mse_iid(kind, x4, y4, 1))


@pytest.mark.parametrize("statistic", ["mean", "squared-error"])
@pytest.mark.parametrize("kind", ["performer-positive", "performer-hyperbolic"])
def test_z_is_calibrated_at_the_edge_of_the_regime(kind, statistic):
    """z of unbiasedness and of mse-formula (exact variances) at the heaviest edge of their
    regime (|x + y| = 1, m = 16) over 2000 runs of R = 2048 iid replicates: the
    count beyond 3 sd must stay below the Binomial(2000, 0.0027) quantile at 1e-8, which a
    tail 3x heavier than normal exceeds with probability 0.99 (false failure 1e-8)."""
    m, runs, replicates = 16, 2000, 2048
    pair = Pair(np.array([0.6, 0.0]), np.array([0.4, 0.0]))
    sm, mse = softmax_kernel(pair.x, pair.y), mse_iid(kind, pair.x, pair.y, m)
    rng = np.random.default_rng(0)
    z = []
    for _ in range(runs):
        estimates = row_terms(kind, pair.x, pair.y, rng.standard_normal((replicates, m, 2)))
        estimates = estimates.mean(axis=1)
        if statistic == "mean":
            z.append(mean_test(estimates, sm, mse).z)
        else:
            variance = squared_error_variance(kind, pair.x, pair.y, m)
            z.append(mean_test((estimates - sm) ** 2, mse, variance).z)
    beyond = int((np.abs(z) > 3).sum())
    allowed = binomial_critical_at(runs, 2 * scipy.stats.norm.sf(3), 1e-8)
    assert beyond <= allowed, (beyond, allowed)
    # the mean of 2000 z has se 0.022 and their sd se 0.016: these bands are 9 and 6 se wide
    assert abs(np.mean(z)) < 0.2 and 0.9 < np.std(z) < 1.1


def binomial_critical_at(trials: int, probability: float, alpha: float) -> int:
    return int(scipy.stats.binom.isf(alpha, trials, probability))


@pytest.mark.parametrize(
    ("sampler", "claim"),
    [
        (builtin_sampler("iid"), "iid"),
        (numpy_sampler("iid"), "iid"),
        (builtin_sampler("orthogonal"), "orthogonal"),
        (numpy_sampler("orthogonal"), "orthogonal"),
    ],
    ids=["torch-iid", "numpy-iid", "torch-orthogonal", "numpy-orthogonal"],
)
def test_correct_samplers_pass_the_panel(sampler, claim):
    results = check_sampler(sampler, claim, seed=1)
    assert len(results) == 12
    assert all(r.passed for r in results), "\n".join(r.report() for r in results)


@pytest.mark.parametrize("name", list(BROKEN_SAMPLERS))
def test_broken_samplers_fail_for_the_right_reason(name):
    sampler, claim, reason = BROKEN_SAMPLERS[name]
    failed = {r.check for r in check_sampler(sampler, claim, seed=1) if not r.passed}
    assert reason in failed, failed


def _sphere_mgf(s: float, d: int) -> float:
    """E exp(s u_1), u uniform on the unit sphere of R^d."""
    nu = d / 2 - 1
    return math.gamma(d / 2) * (2 / s) ** nu * scipy.special.iv(nu, s)


def _sphere_cf(s: float, d: int) -> float:
    """E cos(s u_1), u uniform on the unit sphere of R^d."""
    nu = d / 2 - 1
    return math.gamma(d / 2) * (2 / s) ** nu * scipy.special.jv(nu, s)


def test_power_against_biased_samplers_at_the_defaults():
    """The exact means of K_hat under each biased sampler, at the panel's axis inputs and the
    default sizes (d 16, m 64, 4096 replicates), with the iid standard error: the best
    unbiasedness assertion rejects each with probability >= 1 - 1e-6."""
    d, rows = DEFAULT_D, DEFAULT_M * DEFAULT_REPLICATES
    r, t = PANEL_NORM["performer-positive"], PANEL_NORM["performer-trig"]
    se_positive = math.sqrt(math.exp(r * r) - 1) / math.sqrt(rows)  # relative to exp(x.y)
    se_trig = (1 - math.exp(-t * t)) / math.sqrt(2) / math.exp(-t * t / 2) / math.sqrt(rows)
    gauss, gauss_cf = math.exp(r * r / 2), math.exp(-t * t / 2)
    shifts = {  # relative shift of E K_hat: (positive, trig)
        "unit-norm-rows": (_sphere_mgf(r, d) / gauss - 1, _sphere_cf(t, d) / gauss_cf - 1),
        "rademacher-entries": (math.cosh(r) / gauss - 1, math.cos(t) / gauss_cf - 1),
        "fixed-norm-orthogonal": (
            _sphere_mgf(math.sqrt(d) * r, d) / gauss - 1,
            _sphere_cf(math.sqrt(d) * t, d) / gauss_cf - 1,
        ),
    }
    for name, (positive, trig) in shifts.items():
        best = max(power(positive, se_positive), power(trig, se_trig))
        assert best >= 1 - 1e-6, (name, positive, trig)


@pytest.mark.parametrize("norm", [0.8, 0.9])
def test_orthogonal_mse_passes_at_the_positive_regime_edges(norm):
    """The positive kind's orthogonal regime in the properties (d >= 16, m >= 2d, |x + y| in
    0.8..0.9), at its corners, over three seeds each."""
    pair = panel("performer-positive", 16, norm)[1]
    assert below_iid_applies("performer-positive", pair, 32, 8192)
    for seed in range(3):
        w = draw_projections(builtin_sampler("orthogonal"), 32, 16, 8192, seed)
        result = orthogonal_mse("performer-positive", pair, w)
        assert result.passed, result.report()


def test_below_iid_is_not_asserted_without_coupled_rows():
    """d = 1 or m = 1: orthogonal rows are iid rows, and "below" would be a coin flip."""
    for x, y, m in ((np.array([0.5]), np.array([0.4]), 8), (np.full(4, 0.3), np.full(4, 0.2), 1)):
        assert not below_iid_applies("performer-trig", Pair(x, y), m, 8192)
    assert below_iid_applies("performer-trig", panel("performer-trig", 16)[0], 16, 8192)


@pytest.mark.parametrize(
    ("sampler", "message"),
    [
        (lambda m, d, g: 1 / 0, "sampler raised ZeroDivisionError"),
        (lambda m, d, g: torch.zeros(d, m), "returned shape"),
        (lambda m, d, g: torch.full((m, d), math.nan), "non-finite"),
    ],
)
def test_a_broken_sampler_is_a_failed_check(sampler, message):
    (result,) = check_sampler(sampler, "iid", replicates=4)
    assert not result.passed and message in result.message


def _inputs(seed: int = 0) -> Sequence1:
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 8, 4)) * 0.4
    return Sequence1(q, k, rng.standard_normal((8, 3)))


def _impl(fn) -> Implementation:
    return resolve(fn, feature_map="performer-positive")


def test_rate_and_bound_pass_the_builtin_implementation():
    impl = resolve(form="linear", feature_map="performer-positive")
    assert rate_check(impl, builtin_sampler("iid"), _inputs()).passed
    assert bound_check(impl, builtin_sampler("iid"), _inputs(), 4096).passed


def test_rate_fails_when_the_error_does_not_fall_with_m():
    result = rate_check(_impl(truncated_features), builtin_sampler("iid"), _inputs())
    assert not result.passed and result.figures["slope"] > -0.4, result.report()


def test_bound_fails_when_the_error_does_not_fall_with_m():
    """With m = 2^16 the bound is below the typical error of 16 rows."""
    result = bound_check(_impl(truncated_features), builtin_sampler("iid"), _inputs(), 2**16)
    assert not result.passed and result.figures["exceedances"] > result.figures["allowed"]


def test_bound_shrinks_with_m_and_is_infinite_when_m_is_too_small():
    inputs = _inputs()
    small, large = (
        attention_bound(inputs, "performer-positive", False, m, 0.1) for m in (64, 2**14)
    )
    assert math.isinf(small)
    assert math.isfinite(large)
    assert attention_bound(inputs, "performer-positive", False, 2**16, 0.1) < large


def test_the_critical_values_are_scipys():
    """decide.py's Z literals are scipy's normal quantiles at ALPHA / 2 and ALPHA, to the bit."""
    import scipy.stats

    from linattn_verify.stats.decide import ALPHA, Z_ONE_SIDED

    assert float(scipy.stats.norm.isf(ALPHA / 2)) == Z_TWO_SIDED
    assert float(scipy.stats.norm.isf(ALPHA)) == Z_ONE_SIDED
