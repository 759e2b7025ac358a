"""The long-context check's plan: which lengths run is decided by the kernel's counted cost
(FLOPs, peak live bytes, dispatched ops) at the lengths before, never by wall time."""

from __future__ import annotations

from linattn_verify.checks.long_context import LIMITS, lengths, predicted_stop
from linattn_verify.scaling.cost import Cost

MiB = 2**20


def _costs(slope: float, bytes_at_1024: int, ops: int = 100) -> list[Cost]:
    """Counts at N = 1024 and 4096 growing as N^slope."""
    return [
        Cost(1024, 10**6, bytes_at_1024, ops),
        Cost(4096, int(10**6 * 4**slope), int(bytes_at_1024 * 4**slope), ops),
    ]


def test_a_linear_kernel_within_the_limits_runs_every_length():
    costs = _costs(1.0, 8 * MiB)
    assert all(predicted_stop(costs, n) is None for n in lengths()[2:])


def test_the_first_two_lengths_always_run():
    assert predicted_stop([], 1024) is None
    assert predicted_stop(_costs(2.0, 500 * MiB)[:1], 4096) is None


def test_n_by_n_weights_under_a_linear_claim_stop_as_a_cost_finding():
    # 8 MiB at 1024 and 128 MiB at 4096 (the N x N float32 weights): 2 GiB at 16384
    stop = predicted_stop(_costs(2.0, 8 * MiB + 1), 16384)
    assert stop is not None and stop.superlinear and stop.n == 16384
    assert stop.what.startswith("claims linear cost; peak memory grows as N^2.00")


def test_a_linear_kernel_past_a_limit_ends_its_panel_without_a_cost_finding():
    # linear, but 1 GiB at 4096 tokens: 4 GiB predicted at 16384
    stop = predicted_stop(_costs(1.0, 256 * MiB), 16384)
    assert stop is not None and not stop.superlinear
    assert "peak memory grows as N^1.00" in stop.what and "past the check's limit" in stop.what


def test_a_loop_over_tokens_is_limited_by_its_ops_not_a_cost_finding():
    ops_at_4096 = LIMITS["ops"] // 8  # a per-token loop: 2^16 x 4 = 2^18 x 2 = past 2^19
    costs = [Cost(1024, 0, MiB, ops_at_4096 // 4), Cost(4096, 0, 4 * MiB, ops_at_4096)]
    assert predicted_stop(costs, 16384) is None  # 2^18 ops
    stop = predicted_stop(costs, 65536)
    assert stop is not None and not stop.superlinear and "dispatched ops" in stop.what
