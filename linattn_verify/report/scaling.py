"""The report's scaling section: counted FLOPs and peak bytes of each implementation over N
(exact, fitted log-log), and wall time of the timed ones against torch's SDPA."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..families import default_arguments
from ..implementations.projection import sample_projection_torch
from ..scaling import ScalingResult, scaling_result
from ..scaling.result import SDPA_MAX_N
from ..under_test import Implementation, ImplementationFailure


@dataclass(frozen=True)
class ScalingPlan:
    """Counted cost over cost_ns, time over time_ns (float32, d = dv = `d`, on device)."""

    cost_ns: tuple[int, ...]
    time_ns: tuple[int, ...]
    device: str
    d: int = 32
    repeats: int = 5
    seed: int = 0


def measure(
    impl: Implementation, expected: str, plan: ScalingPlan, timed: bool
) -> tuple[dict[str, Any], ScalingResult]:
    """The cost of one implementation, checked to grow as `expected` ("linear" or
    "quadratic"), and if timed its time against SDPA: a JSON row and the ScalingResult the
    plot draws (None, and a failed row with its error, when the implementation raised). A
    decayed spec's decay and the delta rule's beta are the constant ones of
    families.default_arguments, as vet's scaling check gives them."""
    w = None
    if impl.spec.info.needs_projection:
        gen = torch.Generator().manual_seed(plan.seed)
        w = sample_projection_torch(plan.d, plan.d, "orthogonal", gen).to(plan.device)
    row = {"spec": str(impl.spec), "implementation": impl.name, "device": plan.device}
    # a quadratic form materialises N x N weights: 4 GiB each at N = 32768, in float32
    time_ns = [n for n in plan.time_ns if expected == "linear" or n <= SDPA_MAX_N]
    try:
        result = scaling_result(
            impl.name,
            lambda q, k, v: impl(q, k, v, w, default_arguments(impl.spec, q)),
            expected,
            plan.cost_ns,
            time_ns if timed else None,
            impl.spec.causal,
            plan.repeats,
            d=plan.d,
            dv=plan.d,
            device=plan.device,
        )
    except ImplementationFailure as err:  # e.g. a kernel for d <= 16 only, measured at 32
        message = f"{impl.name} {err} while measured (d = dv = {plan.d})"
        return {**row, "expected": expected, "cost_passed": False, "error": message}, None
    row = {
        **row,
        **result.summary(),
        "costs": [{"n": c.n, "flops": c.flops, "peak_bytes": c.peak_bytes} for c in result.costs],
    }
    if result.sdpa_timing is not None:
        t = result.sdpa_timing
        row["sdpa_seconds"] = dict(zip(t.ns, t.seconds, strict=True))
    return row, result


def scaling_rows(
    impls: list[tuple[Implementation, str, bool]],
    plan: ScalingPlan,
    step: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[tuple[Implementation, ScalingResult]]]:
    """measure() each (implementation, expected growth, timed); the rows, and each
    implementation measured with its result (those that raised left out)."""
    rows, results = [], []
    for impl, expected, timed in impls:
        row, result = measure(impl, expected, plan, timed)
        rows.append(row)
        if result is not None:
            results.append((impl, result))
        step(f"scaling {impl.name}")
    return rows, results
