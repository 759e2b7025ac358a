"""Wall-clock growth with a noise gate: a timing slope is reported only when the machine
was quiet enough to tell it; otherwise the verdict is "too noisy", never a pass or a fail.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .cost import Implementation, attention_inputs
from .fit import Fit, larger_half, loglog_fit

# Noise gate. SPREAD_LIMIT: the 75th over the 25th percentile of the repeats at one N; a
# quiet core repeats within a few percent, a core shared with another busy process (one
# scheduler tick of 4-8 ms per op was seen on this 2-core machine) spreads by 1.5x and more.
# RESIDUAL_LIMIT: no point of the large-N half may lie further than this factor off the
# fitted power law, or the slope describes the noise rather than the algorithm.
SPREAD_LIMIT = 1.25
RESIDUAL_LIMIT = 1.25


@dataclass(frozen=True)
class TimingCurve:
    ns: tuple[int, ...]
    seconds: tuple[float, ...]  # median of the repeats at each N
    spreads: tuple[float, ...]  # p75 / p25 of the repeats at each N
    fit: Fit  # over the large-N half
    status: str  # "ok" or "too noisy"
    reason: str


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def judge_timings(ns: Sequence[int], samples: Sequence[Sequence[float]]) -> TimingCurve:
    """Medians, spreads, the large-N-half fit and the noise gate for measured samples."""
    medians = [float(np.median(s)) for s in samples]
    spreads = [float(np.percentile(s, 75) / np.percentile(s, 25)) for s in samples]
    fit = loglog_fit(larger_half(ns), larger_half(medians))
    noisy = [n for n, s in zip(ns, spreads, strict=True) if s > SPREAD_LIMIT]
    if noisy:
        status, reason = "too noisy", f"repeats spread more than {SPREAD_LIMIT}x at N={noisy}"
    elif fit.worst_factor > RESIDUAL_LIMIT:
        status = "too noisy"
        reason = f"a point lies {fit.worst_factor:.2f}x off the fitted power law"
    else:
        status, reason = "ok", ""
    return TimingCurve(tuple(ns), tuple(medians), tuple(spreads), fit, status, reason)


def time_curve(impl: Implementation, ns: Sequence[int], repeats: int = 5, **inputs) -> TimingCurve:
    """Time impl(q, k, v) at each N (one warm-up call, then `repeats` timed calls).

    On CPU with one torch thread: with two, any other busy process makes each op wait a
    scheduler tick and flattens every curve (see SPREAD_LIMIT).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        samples = []
        for n in ns:
            q, k, v = attention_inputs(n, **inputs)
            impl(q, k, v)
            runs = []
            for _ in range(repeats):
                _synchronize(q.device)
                start = time.perf_counter()
                impl(q, k, v)
                _synchronize(q.device)
                runs.append(time.perf_counter() - start)
            samples.append(runs)
    finally:
        torch.set_num_threads(threads)
    return judge_timings(ns, samples)


def crossover(ns: Sequence[int], ours: Sequence[float], theirs: Sequence[float]) -> int | None:
    """The smallest N from which `ours` is faster than `theirs` at every larger N measured."""
    for i, n in enumerate(ns):
        if all(a < b for a, b in zip(ours[i:], theirs[i:], strict=True)):
            return n
    return None


def sdpa(causal: bool) -> Callable[..., torch.Tensor]:
    """torch's scaled_dot_product_attention with the given causality, as an implementation."""

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn
