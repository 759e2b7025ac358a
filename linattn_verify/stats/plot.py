"""Log-log plots of the random-feature estimators against m, one panel per Performer kind:
the kernel MSE against its exact theory (iid and orthogonal rows), and the RMSE of attention
against exact softmax attention with its fitted rate."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ..under_test import resolve
from .attention import fit_rate, regime_inputs, rmse_by_m
from .estimators import builtin_sampler, draw_projections, kernel_estimates
from .moments import KINDS, mse_iid, mse_orthogonal, softmax_kernel
from .panel import panel

THEORY = {"iid": mse_iid, "orthogonal": mse_orthogonal}


@contextmanager
def _kind_panels(path: str | Path) -> Iterator[dict[str, Any]]:
    """One log-log axis per kind (Agg backend); on exit: grid, legend, PNG at path (parent
    folders created), figure closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KINDS), figsize=(5 * len(KINDS), 4.2))
    try:
        yield dict(zip(KINDS, axes))
        for ax in axes:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("m (random features)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def plot_mse_vs_m(
    path: str | Path,
    d: int = 16,
    ms: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    replicates: int = 2048,
    seed: int = 0,
) -> dict:
    """Write a PNG of the MSE of K_hat(x, y) against m for the first MSE pair of each kind's
    panel: empirical (markers, `replicates` draws per m) and exact theory (lines) for iid and
    orthogonal rows. Returns per kind the m, and per sampler the empirical MSE, its standard
    error, the theory and their ratio."""
    draws = {
        name: [
            draw_projections(builtin_sampler(name), m, d, replicates, seed + i)
            for i, m in enumerate(ms)
        ]
        for name in THEORY
    }
    out: dict[str, Any] = {}
    with _kind_panels(path) as axes:
        for kind in KINDS:
            pair = panel(kind, d)[0]
            exact = softmax_kernel(pair.x, pair.y)
            out[kind] = {"m": list(ms)}
            for (name, theory_fn), colour in zip(THEORY.items(), ("C0", "C1")):
                errors = [
                    (kernel_estimates(kind, pair.x, pair.y, w) - exact) ** 2 for w in draws[name]
                ]
                empirical = np.array([float(e.mean()) for e in errors])
                theory = np.array([theory_fn(kind, pair.x, pair.y, m) for m in ms])
                out[kind][name] = {
                    "empirical": empirical.tolist(),
                    "se": [float(e.std(ddof=1) / np.sqrt(replicates)) for e in errors],
                    "theory": theory.tolist(),
                    "ratio": (empirical / theory).tolist(),
                }
                axes[kind].plot(ms, empirical, "o", color=colour, label=f"{name} empirical")
                axes[kind].plot(ms, theory, "-", color=colour, label=f"{name} theory")
            sign, z = ("-", pair.x - pair.y) if kind == "performer-trig" else ("+", pair.x + pair.y)
            axes[kind].set_title(f"{kind}: |x{sign}y| = {np.linalg.norm(z):.3g}, d = {d}")
            axes[kind].set_ylabel("MSE of K_hat(x, y)")
    return out


def plot_attention_error_vs_m(
    path: str | Path,
    ms: Sequence[int] = (16, 32, 64, 128, 256, 512, 1024),
    replicates: int = 100,
    seed: int = 0,
) -> dict:
    """Write a PNG of the RMSE of each kind's non-causal linear form (iid rows) against exact
    softmax attention on fixed small inputs (N = 8, d = 4, dv = 3, |q| d^(-1/4) <= 0.5), with
    the fitted slope of log RMSE on log m and a dashed m^(-1/2) reference. Returns per kind
    the m, the RMSE, the slope and its standard error."""
    inputs = regime_inputs(seed)
    sampler = builtin_sampler("iid")
    out: dict[str, Any] = {}
    with _kind_panels(path) as axes:
        for kind in KINDS:
            impl = resolve(form="linear", feature_map=kind)
            rmse, se = rmse_by_m(impl, sampler, inputs, ms, replicates, seed)
            slope, slope_se = fit_rate(ms, rmse, se)
            out[kind] = {"m": list(ms), "rmse": rmse.tolist(), "slope": slope, "slope_se": slope_se}
            reference = rmse[0] * (np.asarray(ms, dtype=np.float64) / ms[0]) ** -0.5
            axes[kind].plot(ms, rmse, "o-", label=f"RMSE (slope {slope:.3f} ± {slope_se:.3f})")
            axes[kind].plot(ms, reference, "k--", label="slope -1/2")
            axes[kind].set_title(f"{kind}\nlinear form, iid rows, {replicates} draws per m")
            axes[kind].set_ylabel("RMSE of the output against softmax")
    return out
