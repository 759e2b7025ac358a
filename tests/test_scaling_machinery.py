"""The scaling machinery itself: exact counts, fits, the noise gate, a quadratic impostor."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import linattn_verify as lv
from linattn_verify.scaling import (
    PeakLiveBytes,
    check_growth,
    cost_curve,
    crossover,
    judge_timings,
    loglog_fit,
    measure_cost,
    plot_scaling,
    scaling_result,
    time_curve,
)

NS = [2**i for i in range(8, 13)]


def test_a_known_matmul_is_counted_exactly():
    a, b = torch.randn(3, 5, 7), torch.randn(3, 7, 11)
    cost = measure_cost(lambda: a @ b, n=5)
    assert cost.flops == 2 * 3 * 5 * 7 * 11
    assert cost.peak_bytes == 3 * 5 * 11 * 4  # the product, float32


def test_products_torch_does_not_count_are_counted():
    """In place (a state updated with baddbmm_ or addmm_), addbmm and matrix-vector."""
    a, b, s = torch.randn(3, 5, 7), torch.randn(3, 7, 11), torch.zeros(3, 5, 11)
    x, y = torch.randn(7), torch.zeros(5)
    cases = {
        "baddbmm_": (lambda: s.baddbmm_(a, b), 2 * 3 * 5 * 7 * 11),
        "addmm_": (lambda: s[0].addmm_(a[0], b[0]), 2 * 5 * 7 * 11),
        "addbmm": (lambda: torch.addbmm(s[0], a, b), 2 * 3 * 5 * 7 * 11),
        "addbmm_": (lambda: s[0].addbmm_(a, b), 2 * 3 * 5 * 7 * 11),
        "mv": (lambda: a[0] @ x, 2 * 5 * 7),
        "addmv_": (lambda: y.addmv_(a[0], x), 2 * 5 * 7),
    }
    for name, (fn, flops) in cases.items():
        assert measure_cost(fn, n=5).flops == flops, name


def test_peak_live_bytes_follows_allocation_and_release():
    a = torch.randn(100, 100)  # 40 kB
    with PeakLiveBytes() as mode:
        for _ in range(5):
            b = a + 1
            c = b * 2
            c.add_(1)  # in place: no new storage
            _ = c[:10]  # a view: no new storage
    # a new b (then c) is allocated while the previous b and c are still alive
    assert mode.peak == 3 * 40_000


def test_loglog_fit_recovers_a_power_law():
    ns = np.array(NS, float)
    fit = loglog_fit(ns, 3.0 * ns**1.5)
    assert fit.slope == pytest.approx(1.5, abs=1e-12) and fit.worst_factor == pytest.approx(1)


def _materialising_linear(q, k, v):
    """A 'linear attention' that builds the (N, N) weights: quadratic in disguise."""
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    a = phi_q @ phi_k.transpose(-2, -1)
    return (a @ v) / a.sum(-1, keepdim=True)


def test_a_quadratic_impostor_is_caught_by_flops_and_bytes():
    check = check_growth(cost_curve(_materialising_linear, NS, d=16, dv=16), "linear")
    assert not check.passed
    assert check.flops.slope == pytest.approx(2, abs=0.05)
    assert check.bytes.slope > 1.5
    assert "FLOPs grow as N^2.00" in check.message and "faster than N" in check.message


def _cumsum_linear(q, k, v):
    """Causal linear attention from cumsum and broadcasting: no op FlopCounterMode counts."""
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    s = torch.cumsum(phi_k.unsqueeze(-1) * v.unsqueeze(-2), dim=2)
    z = torch.cumsum(phi_k, dim=2)
    return (phi_q.unsqueeze(-1) * s).sum(-2) / (phi_q * z).sum(-1, keepdim=True)


def _broadcast_quadratic(q, k, v):
    """The (N, N) weights by broadcasting, no matmul: quadratic, and only bytes show it."""
    a = (
        (torch.nn.functional.elu(q) + 1).unsqueeze(-2)
        * (torch.nn.functional.elu(k) + 1).unsqueeze(-3)
    ).sum(-1)
    return (a.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2) / a.sum(-1, keepdim=True)


def test_without_counted_flops_the_bytes_alone_judge():
    linear = check_growth(cost_curve(_cumsum_linear, NS[:3], d=8, dv=8), "linear")
    assert linear.flops is None and linear.passed
    assert linear.message.startswith("no FLOPs counted (no matmul-like op), peak bytes ~ N^1.0")
    quadratic = check_growth(cost_curve(_broadcast_quadratic, NS[:3], d=8, dv=8), "linear")
    assert quadratic.flops is None and not quadratic.passed
    assert "peak bytes grow as N^2.00, faster than N^1" in quadratic.message


def test_the_built_in_linear_form_passes():
    impl = lambda q, k, v: lv.attention(q, k, v, "elu", False, "linear")  # noqa: E731
    check = check_growth(cost_curve(impl, NS, d=16, dv=16), "linear")
    assert check.passed, check.message


def test_noise_gate_refuses_a_noisy_curve_and_accepts_a_clean_one():
    clean = [[1e-6 * n * f for f in (1.0, 1.01, 0.99, 1.0, 1.02)] for n in NS]
    curve = judge_timings(NS, clean)
    assert curve.status == "ok" and curve.fit.slope == pytest.approx(1, abs=0.01)
    spread = [list(s) for s in clean]
    spread[-1] = [s * f for s, f in zip(spread[-1], (1.0, 2.0, 0.5, 1.9, 0.6), strict=True)]
    assert judge_timings(NS, spread).status == "too noisy"
    kinked = [[1e-6 * n * (3 if n == NS[-2] else 1)] * 5 for n in NS]
    noisy = judge_timings(NS, kinked)
    assert noisy.status == "too noisy" and "off the fitted power law" in noisy.reason


def test_crossover_is_where_we_stay_faster():
    assert crossover([1, 2, 3, 4], [5, 1, 5, 1], [2, 2, 2, 2]) == 4
    assert crossover([1, 2, 3], [1, 1, 1], [2, 2, 2]) == 1
    assert crossover([1, 2], [3, 3], [2, 2]) is None


def test_time_curve_and_plot(tmp_path):
    impl = lambda q, k, v: lv.attention(q, k, v, "elu", False, "linear")  # noqa: E731
    curve = time_curve(impl, [64, 128, 256, 512], repeats=3, d=8, dv=8)
    assert curve.status in ("ok", "too noisy") and len(curve.seconds) == 4
    assert all(s > 0 and math.isfinite(s) for s in curve.seconds)
    costs = {"elu linear": cost_curve(impl, [64, 128], d=8, dv=8)}
    path = plot_scaling({"elu linear": curve}, costs, tmp_path / "scaling.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_result_summarises_costs_timings_and_crossover():
    impl = lambda q, k, v: lv.attention(q, k, v, "elu", True, "chunked")  # noqa: E731
    result = scaling_result(
        "elu chunked", impl, "linear", [64, 128, 256], [64, 128], causal=True, repeats=3, d=8, dv=8
    )
    s = result.summary()
    assert s["cost_passed"] and s["flops_slope"] == pytest.approx(1, abs=0.05)
    assert s["time_status"] in ("ok", "too noisy") and set(s["seconds"]) == {64, 128}
    assert s["crossover_vs_sdpa"] in (None, 64, 128)
    assert result.sdpa_timing is not None and result.sdpa_timing.ns == (64, 128)


def test_scaling_result_skips_sdpa_when_it_cannot_fit_a_curve(monkeypatch):
    import linattn_verify.scaling.result as result_module

    monkeypatch.setattr(result_module, "SDPA_MAX_N", 64)
    impl = lambda q, k, v: lv.attention(q, k, v, "elu", False, "linear")  # noqa: E731
    result = scaling_result("elu", impl, "linear", [64, 128, 256], [64, 128], repeats=2, d=8, dv=8)
    assert result.sdpa_timing is None and result.crossover_vs_sdpa is None
    assert result.timing is not None and result.summary()["crossover_vs_sdpa"] is None
