"""Linear scaling of the built-in forms: counted FLOPs and bytes (exact, always run), and
pytest-benchmark timings (a small grid by default; --full-grid --benchmark-enable for all).

    pytest properties/test_scaling.py -m scaling --full-grid --benchmark-enable \
        --benchmark-json=reports/benchmark.json
"""

from __future__ import annotations

import pytest
import torch

import linattn_verify as lv
from linattn_verify.scaling import attention_inputs, check_growth, cost_curve, measure_cost

pytestmark = pytest.mark.builtin_only

LINEAR_NS = [2**i for i in range(8, 17)]
QUADRATIC_NS = [2**i for i in range(8, 13)]  # an (N, N) float32 matrix: 64 MiB at 2^12
# (feature map, causal, form, head dim): taylor's 1 + d + d^2 features keep d small
CASES = [
    (name, causal, form, 8 if name == "taylor" else 64)
    for name, fm in lv.FEATURE_MAPS.items()
    for causal in (False, True)
    for form in (
        ["quadratic"] if not fm.kernelised else ["quadratic", "chunked" if causal else "linear"]
    )
]


def _impl(name: str, causal: bool, form: str, d: int):
    w = (
        lv.sample_projection_torch(d, d, "orthogonal")
        if lv.FEATURE_MAPS[name].needs_projection
        else None
    )
    return lambda q, k, v: lv.attention(q, k, v, name, causal, form, w)


@pytest.mark.parametrize(("name", "causal", "form", "d"), CASES, ids=lambda x: str(x))
def test_cost_grows_as_the_form_promises(name, causal, form, d):
    expected = "quadratic" if form == "quadratic" else "linear"
    ns = QUADRATIC_NS if expected == "quadratic" else LINEAR_NS
    check = check_growth(cost_curve(_impl(name, causal, form, d), ns, d=d, dv=d), expected)
    assert check.passed, f"{name} {form} causal={causal}: {check.message}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """test_time's grid: N = 256 and 2048 by default, every N with --full-grid."""
    if metafunc.function.__name__ != "test_time":
        return
    full = metafunc.config.getoption("--full-grid")
    params = [
        pytest.param(*case, n, id=f"{case[0]}-{case[2]}-{'causal' if case[1] else 'full'}-N{n}")
        for case in CASES
        for n in (QUADRATIC_NS if case[2] == "quadratic" else LINEAR_NS)
        if full or n in (256, 2048)
    ]
    metafunc.parametrize(("name", "causal", "form", "d", "n"), params)


@pytest.mark.scaling
def test_time(benchmark, name, causal, form, d, n):
    impl = _impl(name, causal, form, d)
    q, k, v = attention_inputs(n, h=4, d=d, dv=d)
    cost = measure_cost(lambda: impl(q, k, v), n)
    benchmark.group = f"{name} {form} causal={causal}"
    benchmark.extra_info.update(n=n, flops=cost.flops, peak_bytes=cost.peak_bytes)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two threads on two cores: every op waits for a busy neighbour
    try:
        out = benchmark(impl, q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert out.shape == v.shape
