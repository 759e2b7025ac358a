"""The figures of linattn_verify/stats/plot.py: a PNG is written, the theory lines are the
exact MSEs, and the plotted numbers agree with theory where the statistics are calibrated
(fixed seeds; each band at the suite's ALPHA = 1e-10)."""

from __future__ import annotations

import json

import pytest

from linattn_verify.stats import KINDS, mse_iid, mse_orthogonal
from linattn_verify.stats.decide import Z_TWO_SIDED
from linattn_verify.stats.panel import panel
from linattn_verify.stats.plot import plot_attention_error_vs_m, plot_mse_vs_m

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
THEORY = {"iid": mse_iid, "orthogonal": mse_orthogonal}
# attention.RATE_MARGIN's measurement: true slopes within 0.015 of -1/2 for m in 32..1024
TRUE_SLOPE_OFFSET = 0.015


def _assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_mse_plot_matches_theory(tmp_path):
    """The theory lines are the exact iid and orthogonal MSEs at the plotted pair; for trig
    (bounded terms, where the studentised test is calibrated) the empirical MSE over 2048
    replicates lies within Z_TWO_SIDED standard errors of them. m = 40 ends in a partial
    orthogonal block of d = 16, m = 64 is four full blocks; there the orthogonal trig MSE is
    a third of the iid one, so swapped series fail."""
    path = tmp_path / "sub" / "mse.png"
    out = plot_mse_vs_m(path, d=16, ms=(40, 64), replicates=2048, seed=1)
    _assert_png(path)
    json.dumps(out)
    assert set(out) == set(KINDS)
    for kind in KINDS:
        assert out[kind]["m"] == [40, 64]
        for sampler in ("iid", "orthogonal"):
            got = out[kind][sampler]
            pair = panel(kind, 16)[0]
            rows = zip((40, 64), got["empirical"], got["se"], got["theory"], got["ratio"])
            for m, emp, se, theory, ratio in rows:
                assert theory == pytest.approx(THEORY[sampler](kind, pair.x, pair.y, m))
                assert ratio == pytest.approx(emp / theory)
                if kind == "performer-trig":
                    assert abs(emp - theory) <= Z_TWO_SIDED * se, (sampler, m, ratio)


def test_attention_plot_falls_as_inverse_sqrt_m(tmp_path):
    """The fitted slope lies within TRUE_SLOPE_OFFSET + Z_TWO_SIDED standard errors of -1/2,
    the standard error below 0.05 so that a flat curve (slope 0) fails."""
    path = tmp_path / "sub" / "attention.png"
    ms = (32, 128, 512)
    out = plot_attention_error_vs_m(path, ms=ms, replicates=30, seed=0)
    _assert_png(path)
    json.dumps(out)
    assert set(out) == set(KINDS)
    for kind in KINDS:
        got = out[kind]
        assert got["m"] == list(ms) and len(got["rmse"]) == len(ms)
        assert got["slope_se"] < 0.05, (kind, got["slope_se"])
        band = TRUE_SLOPE_OFFSET + Z_TWO_SIDED * got["slope_se"]
        assert abs(got["slope"] + 0.5) <= band, (kind, got["slope"], band)
