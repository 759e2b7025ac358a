"""Log-log plots of time, FLOPs and memory against N, with the fitted slopes in the legends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cost import Cost
from .fit import larger_half, loglog_fit
from .timing import TimingCurve

COLUMNS = 3  # panels a row, or one more where that leaves fewer slots empty
PANEL = (3.8, 3.0)  # inches, width and height, legend aside
LEGEND_LINE = 0.14  # inches
MAX_LINES = 6  # a panel's; beyond it a group's FLOPs and bytes take a panel each
TITLES = {
    "time": "time (median, one thread)",
    "cost": "FLOPs and peak bytes",
    "FLOPs": "FLOPs (counted)",
    "bytes": "peak live bytes",
}


def plot_scaling(
    timings: Mapping[str, TimingCurve],
    costs: Mapping[str, Sequence[Cost]],
    path: str | Path,
    panels: Mapping[str, tuple[str, str]] | None = None,
) -> Path:
    """Write a PNG of small multiples against N: per group of curves, a panel of time
    (where timed) and one of counted FLOPs and peak live bytes (a panel each where both
    would exceed MAX_LINES lines), each line with its slope fitted over the larger half of
    N in the panel's legend. panels maps a curve's name to (its group, its label there);
    names it lacks are drawn in one group "", by name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    place = {name: (panels or {}).get(name, ("", name)) for name in [*costs, *timings]}
    groups = list(dict.fromkeys(group for group, _ in place.values()))
    contents = []  # (group, a key of TITLES, {label: curve})
    for group in groups:
        for kind, curves in (("time", timings), ("cost", costs)):
            mine = {place[n][1]: c for n, c in curves.items() if place[n][0] == group}
            split = kind == "cost" and 2 * len(mine) > MAX_LINES
            kinds = ("FLOPs", "bytes") if split else (kind,) if mine else ()
            contents += [(group, k, mine) for k in kinds]
    cols = min(len(contents), min((COLUMNS, COLUMNS + 1), key=lambda c: -len(contents) % c))
    rows = -(-len(contents) // cols)
    entries = max(len(curves) * (2 if kind == "cost" else 1) for _, kind, curves in contents)
    height = PANEL[1] + LEGEND_LINE * entries  # each legend below its panel
    fig, axes = plt.subplots(rows, cols, figsize=(PANEL[0] * cols, height * rows), squeeze=False)
    try:
        for ax, (group, kind, curves) in zip(axes.flat, contents):
            if kind == "time":
                _time_panel(ax, curves)
            else:
                _cost_panel(ax, curves, ("FLOPs", "bytes") if kind == "cost" else (kind,))
            title = TITLES[kind]
            ax.set_title(f"{group}: {title}" if group else title, fontsize=9)
            ax.set_xlabel("N (tokens)", fontsize=8)
            ax.grid(True, which="major", alpha=0.3)
            if ax.lines:
                ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=6.5,
                          frameon=False)  # fmt: skip
        for ax in list(axes.flat)[len(contents) :]:
            ax.set_visible(False)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _time_panel(ax: Any, curves: Mapping[str, TimingCurve]) -> None:
    """Median seconds against N, one line per curve; the slope flagged where too noisy."""
    for i, (label, curve) in enumerate(curves.items()):
        noisy = "" if curve.status == "ok" else ", too noisy"
        ax.plot(curve.ns, curve.seconds, "o-", color=f"C{i}", ms=3,
                label=f"{label} (N^{curve.fit.slope:.2f}{noisy})")  # fmt: skip
    _log_axes(ax, "seconds")


def _cost_panel(ax: Any, curves: Mapping[str, Sequence[Cost]], drawn: tuple[str, ...]) -> None:
    """Counted FLOPs (solid; where any are counted) and peak live bytes (dashed), those of
    `drawn`, against N, a colour per curve."""
    for i, (label, curve) in enumerate(curves.items()):
        ns = [c.n for c in curve]
        for what, ys, style in (
            ("FLOPs", [c.flops for c in curve], {"ls": "-", "marker": "o"}),
            ("bytes", [c.peak_bytes for c in curve], {"ls": "--", "marker": "s"}),
        ):
            if what in drawn and all(y > 0 for y in larger_half(ys)):
                slope = loglog_fit(larger_half(ns), larger_half(ys)).slope
                named = f"{label}, {what}" if len(drawn) > 1 else label
                ax.plot(ns, ys, color=f"C{i}", ms=3, label=f"{named} (N^{slope:.2f})", **style)
    _log_axes(ax, ", ".join({"FLOPs": "FLOPs", "bytes": "peak live bytes"}[w] for w in drawn))


def _log_axes(ax: Any, ylabel: str) -> None:
    """Log-2 N with a labelled tick at each N drawn and no minor ticks; log-10 y at whole
    decades around the lines (two labelled ticks at least), minor ticks unlabelled."""
    from matplotlib.ticker import LogLocator, NullFormatter

    ax.set_ylabel(ylabel, fontsize=8)
    if not ax.lines:  # FLOPs that no curve counts
        ax.text(0.5, 0.5, "none counted", transform=ax.transAxes, ha="center", fontsize=8)
        return
    ns = sorted({n for line in ax.lines for n in line.get_xdata()})
    ys = np.concatenate([np.asarray(line.get_ydata(), float) for line in ax.lines])
    ys = ys[ys > 0]
    n_axis(ax, [int(n) for n in ns])
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.tick_params(axis="y", labelsize=8)
    low = np.floor(np.log10(ys.min()))
    ax.set_ylim(10**low, 10 ** max(np.ceil(np.log10(ys.max()) + 0.05), low + 2))


def power_of_2(n: int) -> str:
    """n as $2^e$ where it is a power of two, else in digits."""
    return f"$2^{{{n.bit_length() - 1}}}$" if n & (n - 1) == 0 else str(n)


def n_axis(ax: Any, ns: list[int]) -> None:
    """A log-2 N axis with a labelled major tick at each N measured, no minor ticks."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ns))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([power_of_2(n) for n in ns], fontsize=8)
