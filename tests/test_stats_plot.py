"""The figures of linattn_verify/stats/plot.py: a PNG is written and the plotted numbers agree
with theory (fixed seeds, so each test is deterministic; the bands are chosen so that a
correct estimator would fail them only with small probability over seeds)."""

from __future__ import annotations

import json

import pytest

from linattn_verify.stats import KINDS
from linattn_verify.stats.decide import Z_TWO_SIDED
from linattn_verify.stats.plot import plot_attention_error_vs_m, plot_mse_vs_m

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
Z_BAND = Z_TWO_SIDED  # two-sided normal tail ALPHA = 1e-10 per comparison
MAX_RELATIVE_SE = 0.15  # the band is at most +-97%, and +-20..60% at the observed se


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_mse_plot_matches_theory(tmp_path):
    """Empirical MSE over R = 2048 replicates within Z_BAND standard errors of the exact MSE,
    for iid and orthogonal rows (the mean of R iid squared errors is normal by the CLT; over
    seeds 1..20 the 240 z values had mean -0.10, sd 0.96, max |z| 3.8, and relative standard
    errors of at most 0.125). m = 40 ends in a partial orthogonal block of d = 16, m = 64 is
    four full blocks; there the orthogonal MSE of the hyperbolic and trig estimators is about
    a third of the iid one, so swapping the two theories, or a factor-2 error, fails."""
    path = tmp_path / "sub" / "mse.png"
    out = plot_mse_vs_m(path, d=16, ms=(40, 64), replicates=2048, seed=1)
    _assert_png(path)
    json.dumps(out)
    assert set(out) == set(KINDS)
    for kind in KINDS:
        assert out[kind]["m"] == [40, 64]
        for sampler in ("iid", "orthogonal"):
            got = out[kind][sampler]
            rows = zip(got["empirical"], got["se"], got["theory"], got["ratio"])
            for emp, se, theory, ratio in rows:
                where = (kind, sampler, ratio, se / theory)
                assert ratio == pytest.approx(emp / theory)
                assert se / theory <= MAX_RELATIVE_SE, where
                assert abs(emp - theory) <= Z_BAND * se, where


def test_attention_plot_falls_as_inverse_sqrt_m(tmp_path):
    """The fitted slope is negative and within 0.15 of -1/2, with its standard error below
    0.03 (so the band is at least 5 standard errors wide)."""
    path = tmp_path / "sub" / "attention.png"
    ms = (16, 64, 256)
    out = plot_attention_error_vs_m(path, ms=ms, replicates=30, seed=0)
    _assert_png(path)
    json.dumps(out)
    assert set(out) == set(KINDS)
    for kind in KINDS:
        got = out[kind]
        assert got["m"] == list(ms) and len(got["rmse"]) == len(ms)
        assert got["slope"] < 0, (kind, got["slope"])
        assert got["slope_se"] < 0.03, (kind, got["slope_se"])
        assert abs(got["slope"] + 0.5) <= 0.15, (kind, got["slope"])
