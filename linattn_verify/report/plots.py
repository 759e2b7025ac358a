"""The report's own plots (Agg backend, no display): error against N per dtype, the
distribution of the denominators' relative margins, and the long sequences' error and
bounds against N (one figure per dtype)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import MARGIN_EDGES

Row = dict[str, Any]


@contextmanager
def _figure(path: Path, panels: int, width: float = 4.6) -> Iterator[Sequence[Any]]:
    """A row of `panels` axes; on exit, one legend for all of them on the right, the PNG
    at path, figure closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels + 2.6, 4.2), squeeze=False)
    try:
        yield axes[0]
        legend = {}
        for ax in axes[0]:
            legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
        fig.legend(legend.values(), legend.keys(), loc="center right", fontsize=7)
        fig.tight_layout(rect=(0, 0, 1 - 2.6 / (width * panels + 2.6), 1))
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _style(spec: str, names: list[str]) -> dict[str, Any]:
    """One colour per feature map, dashed when causal."""
    name = spec.split(" ")[0]
    return {"color": f"C{names.index(name) % 10}", "ls": "--" if "(causal)" in spec else "-"}


def plot_error_vs_n(rows: list[Row], forms: dict[str, str], path: Path) -> Path:
    """Max error (units of u s) against N, one panel per dtype, one line per spec in the
    form `forms[spec]` (the one lv.attention picks at large N)."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    names = list(dict.fromkeys(s.split(" ")[0] for s in forms))
    with _figure(path, len(dtypes)) as axes:
        for ax, dtype in zip(axes, dtypes, strict=True):
            for spec, form in forms.items():
                points = [
                    (r["n"], r["max_error"])
                    for r in rows
                    if r["spec"] == spec and r["form"] == form and r["dtype"] == dtype
                    if r.get("max_error") is not None
                ]
                if points:
                    ns, errors = zip(*sorted(points), strict=True)
                    ax.plot(
                        ns, np.fmax(errors, 1e-3), marker="o", label=spec, **_style(spec, names)
                    )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{dtype}: max error vs N")
            ax.set_xlabel("N (tokens)")
            ax.set_ylabel("max error (units of u s)")
            ax.grid(True, which="both", alpha=0.3)
    return path


def plot_margins(margins: list[Row], dtype: str, path: Path) -> Path:
    """Histograms of the relative denominator margin r = D / sum |a| (inputs rounded to
    `dtype`), non-causal and causal panels, one step line per spec whose r is not 1 on
    every row; those that are are named on the plot."""
    centres = (np.array(MARGIN_EDGES[:-1]) + np.array(MARGIN_EDGES[1:])) / 2
    chosen = [m for m in margins if m["dtype"] == dtype]
    names = list(dict.fromkeys(m["spec"].split(" ")[0] for m in chosen))
    with _figure(path, 2) as axes:
        for ax, causal in zip(axes, (False, True), strict=True):
            ones = []
            for m in chosen:
                if ("(causal)" in m["spec"]) != causal:
                    continue
                if m["min"] == 1.0 and not m["zero_over_zero"]:
                    ones.append(m["spec"].split(" ")[0])
                    continue
                ax.step(
                    centres, m["histogram"], where="mid", label=m["spec"],
                    **_style(m["spec"], names),
                )  # fmt: skip
            if ones:
                ax.text(
                    0.02, 0.98, "r = 1 on every row:\n" + "\n".join(ones), fontsize=7,
                    transform=ax.transAxes, va="top",
                )  # fmt: skip
            ax.set_yscale("log")
            ax.set_xlabel("r = D_i / sum_j |a_ij|")
            ax.set_ylabel("rows")
            ax.set_title(f"denominator margins, {'causal' if causal else 'non-causal'} ({dtype})")
            ax.grid(True, which="both", alpha=0.3)
    return path


LONG_STYLES = {  # line kind -> (label, style); forms by name, then the golden and bounds
    "quadratic": ("quadratic form", {"color": "C0", "marker": "o", "ms": 3}),
    "linear": ("linear form", {"color": "C1", "marker": "o", "ms": 3}),
    "recurrent": ("recurrent form", {"color": "C2", "marker": "o", "ms": 3}),
    "chunked": ("chunked form", {"color": "C3", "marker": "o", "ms": 3}),
    "impl": ("implementation", {"color": "C1", "marker": "o", "ms": 3}),
    "golden": ("golden", {"color": "black", "ls": "--", "lw": 1}),
    "bound_max": ("deterministic bound (max)", {"color": "0.45", "ls": ":", "lw": 1.5}),
    "probabilistic_bound_max": (
        "probabilistic bound (max)",
        {"color": "0.45", "ls": "-.", "lw": 1},
    ),
}
ERROR_FLOOR = 0.1  # errors below it (exact outputs: 0) are drawn at it, on a log axis


def plot_long_context(rows: list[Row], dtype: str, path: Path) -> Path:
    """Max error (units of u s) against N in `dtype`, one panel per spec: each form, the
    golden's error and the two bounds' largest element (a bound is drawn where finite, and
    the panel says from which N the deterministic one is vacuous); a failed judgement gets
    a red cross. One legend below the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [r for r in rows if r["dtype"] == dtype]
    specs = list(dict.fromkeys(r["spec"] for r in chosen))
    cols = min(len(specs), 4)
    lines = -(-len(specs) // cols)
    height = 3.2 * lines + 1.0
    width = max(3.9 * cols, 7.8)  # the title and a legend of three columns fit one panel
    fig, axes = plt.subplots(lines, cols, figsize=(width, height), squeeze=False)
    try:
        legend: dict[str, Any] = {}
        for ax, spec in zip(axes.flat, specs):
            _long_panel(ax, [r for r in chosen if r["spec"] == spec], spec)
            legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
        for ax in list(axes.flat)[len(specs) :]:
            ax.set_visible(False)
        fig.suptitle(f"{dtype}: max error vs N (d = dv = 16, B = H = 1, typical inputs)")
        order = [label for label, _ in LONG_STYLES.values()]
        legend = dict(sorted(legend.items(), key=lambda kv: _rank(order, kv[0])))
        columns = 4 if cols > 2 else 3
        legend_lines = -(-len(legend) // columns)
        if legend:
            fig.legend(
                legend.values(), legend.keys(), loc="lower center",
                ncol=min(len(legend), columns), fontsize=8, frameon=False,
            )  # fmt: skip
        fig.tight_layout(rect=(0, (0.1 + 0.2 * legend_lines) / height, 1, 1))
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _long_panel(ax: Any, rows: list[Row], spec: str) -> None:
    """One spec's lines (plot_long_context) on log-log axes, N ticks at powers of 2."""
    from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, NullLocator

    ns = sorted({r["n"] for r in rows})
    at = {r["n"]: r for r in rows}  # the per-N figures, the same in every form's row
    for key in ("bound_max", "probabilistic_bound_max"):
        _line(ax, [(n, at[n].get(key)) for n in ns], key)
    vacuous = []
    for key, what in (("bound_max", "deterministic"), ("probabilistic_bound_max", "probabilistic")):
        first = next((n for n in ns if key in at[n] and not _finite(at[n][key])), None)
        if first is not None:
            vacuous.append(f"{what} bound vacuous from N = $2^{{{round(np.log2(first))}}}$")
    if vacuous:
        ax.text(0.03, 0.97, "\n".join(vacuous), transform=ax.transAxes, ha="left", va="top",
                fontsize=7, color="0.3")  # fmt: skip
    forms = list(dict.fromkeys(r["form"] for r in rows))
    for i, form in enumerate(forms):  # the first widest: forms that agree still show
        mine = [r for r in rows if r["form"] == form]
        _line(
            ax,
            [(r["n"], r.get("max_error")) for r in mine],
            form,
            lw=1.2 + 1.2 * (len(forms) - 1 - i),
        )
        failed = [(r["n"], r.get("max_error")) for r in mine if not r["passed"]]
        failed = [(n, max(e, ERROR_FLOOR)) for n, e in failed if _finite(e)]
        if failed:
            ax.plot(*zip(*failed, strict=True), "x", color="red", ms=8, mew=2, zorder=5,
                    label="fails (bound or budget)")  # fmt: skip
    _line(ax, [(n, at[n]["golden_max_error"]) for n in ns], "golden")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    if ax.lines:  # none where every form raised and the golden is not finite
        ys = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.lines])
        low, high = ys.min() / 3, ys.max() * 12  # room above for the note on vacuous bounds
        ax.set_ylim(low, max(high, low * 1e3))  # three decades at least: ticks at 10^k
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_locator(FixedLocator(ns))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"$2^{{{round(np.log2(n))}}}$" for n in ns], fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title(spec, fontsize=9)
    ax.set_xlabel("N", fontsize=8)
    ax.set_ylabel("max error (units of u s)", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)


def _line(ax: Any, points: list[tuple[int, Any]], kind: str, **more: Any) -> None:
    """The finite points of one kind of line (LONG_STYLES), errors floored at ERROR_FLOOR."""
    finite = sorted((n, max(y, ERROR_FLOOR)) for n, y in points if _finite(y))
    if finite:
        label, style = LONG_STYLES.get(kind, (kind, {"marker": "o", "ms": 3}))
        ax.plot(*zip(*finite, strict=True), label=label, **{**style, **more})


def _rank(order: list[str], label: str) -> int:
    return order.index(label) if label in order else len(order)


def _finite(x: Any) -> bool:
    """A figure that can be drawn: not None (an inf in the JSON, or absent), nor inf or NaN."""
    return x is not None and bool(np.isfinite(x))
