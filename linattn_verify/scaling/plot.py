"""Log-log plots of time and memory against N, with the fitted slopes in the legend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from .cost import Cost
from .fit import larger_half, loglog_fit
from .timing import TimingCurve


def plot_scaling(
    timings: Mapping[str, TimingCurve], costs: Mapping[str, Sequence[Cost]], path: str | Path
) -> Path:
    """Write a PNG: time (left) and peak live bytes (right) against N, one line each, with
    the slope fitted over the larger half of N in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, curve in timings.items():
        label = f"{name} (N^{curve.fit.slope:.2f}{'' if curve.status == 'ok' else ', too noisy'})"
        ax_t.loglog(curve.ns, curve.seconds, "o-", label=label)
    for name, curve in costs.items():
        ns = [c.n for c in curve]
        fit = loglog_fit(larger_half(ns), larger_half([c.peak_bytes for c in curve]))
        ax_m.loglog(ns, [c.peak_bytes for c in curve], "o-", label=f"{name} (N^{fit.slope:.2f})")
    for ax, what in ((ax_t, "seconds"), (ax_m, "peak live bytes")):
        ax.set_xlabel("N (tokens)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax_t.set_title("time (median, one thread)")
    ax_m.set_title("memory")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
