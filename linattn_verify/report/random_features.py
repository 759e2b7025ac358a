"""The report's random-feature section: the project's samplers through the sampler panel
(unbiasedness, MSE against Lemma 2 or the exact orthogonal MSE), and the MSE against m."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..stats import CLAIMS, builtin_sampler, check_sampler
from ..stats.plot import plot_attention_error_vs_m, plot_mse_vs_m


def random_features(
    folder: Path, seed: int, full: bool, step: Callable[[str], None]
) -> dict[str, Any]:
    """Panel verdicts for lv.sample_projection_torch (iid and orthogonal), and the MSE vs m
    plot (mse_vs_m.png in `folder`) with its figures; with `full`, also the attention error
    vs m (attention_error_vs_m.png)."""
    samplers = []
    for claim in CLAIMS:
        results = check_sampler(builtin_sampler(claim), claim, seed=seed)
        samplers.append(
            {
                "sampler": f"lv.sample_projection_torch {claim}",
                "claim": claim,
                "passed": all(r.passed for r in results),
                "checks": [r.to_dict() for r in results],
            }
        )
        step(f"random features: {claim} panel")
    out: dict[str, Any] = {"samplers": samplers, "plots": {}}
    out["mse_vs_m"] = plot_mse_vs_m(folder / "mse_vs_m.png", seed=seed)
    out["plots"]["mse_vs_m"] = "mse_vs_m.png"
    step("random features: MSE vs m")
    if full:
        path = folder / "attention_error_vs_m.png"
        out["attention_error_vs_m"] = plot_attention_error_vs_m(path, seed=seed)
        out["plots"]["attention_error_vs_m"] = path.name
        step("random features: attention error vs m")
    return out
