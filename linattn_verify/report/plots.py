"""The report's own plots (Agg backend, no display): error, budget and bound against N per
feature map and dtype, the distribution of the denominators' relative margins, and the long
sequences' error and bounds against N (one figure per dtype)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..accuracy import K_BUDGET
from ..scaling.plot import n_axis, power_of_2
from .accuracy import MARGIN_EDGES

Row = dict[str, Any]


SWEEP_ERROR_FLOOR = 1e-3  # errors below it (exact outputs: 0) are drawn at it, on a log axis
FORM_MARKERS = {"quadratic": "^", "linear": "o", "recurrent": "D", "chunked": "s"}
CAUSALITY_COLOURS = {False: "C0", True: "C1"}  # non-causal, causal


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_error_vs_n(rows: list[Row], forms: dict[str, str], path: Path) -> Path:
    """Max error (units of u s) against N, a panel per feature map (rows) and dtype
    (columns): the form `forms[spec]` (the one lv.attention picks at large N) of the
    non-causal and the causal spec, each with its budget (K_BUDGET x the golden's error, or
    the floor where it is larger) and the largest element of its a-priori bound (where
    finite). One legend above."""
    plt = _pyplot()
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    maps = list(dict.fromkeys(spec.split(" ")[0] for spec in forms))
    ns = sorted({r["n"] for r in rows})
    fig, axes = plt.subplots(
        len(maps), len(dtypes), figsize=(2.9 * len(dtypes) + 0.9, 1.8 * len(maps) + 1.0),
        sharey="row", squeeze=False,
    )  # fmt: skip
    try:
        for line, name in zip(axes, maps, strict=True):
            for ax, dtype in zip(line, dtypes, strict=True):
                vacuous = {
                    spec: _sweep_lines(ax, rows, spec, form, dtype)
                    for spec, form in forms.items()
                    if spec.split(" ")[0] == name
                }
                _vacuous_note(ax, vacuous)
                n_axis(ax, ns)
                ax.grid(True, which="major", alpha=0.3)
            _decades(line)
            line[0].set_ylabel(f"{name}\nmax error (u s)", fontsize=8)
        for ax, dtype in zip(axes[0], dtypes, strict=True):
            ax.set_title(dtype, fontsize=9)
        for ax in axes[-1]:
            ax.set_xlabel("N (tokens)", fontsize=8)
        kinds = ("form", "budget", "a-priori bound")  # a column of the legend per kind, or two
        legend = sorted(_legend(axes).items(), key=lambda kv: kinds.index(_kind(kv[0])))
        inch = 1 / fig.get_figheight()
        fig.suptitle("max error vs N (d = dv = 16, typical inputs)", fontsize=10, y=1 - 0.1 * inch,
                     va="top")  # fmt: skip
        fig.legend([h for _, h in legend], [label for label, _ in legend], loc="upper center",
                   ncol=min(len(legend), 4), fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.35 * inch))  # fmt: skip
        fig.tight_layout()
        fig.subplots_adjust(top=1 - 1.1 * inch)  # below the title and the legend
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def _kind(label: str) -> str:
    """What a line of plot_error_vs_n shows, from its label."""
    return next((k for k in ("budget", "a-priori bound") if label.startswith(k)), "form")


def _sweep_lines(ax: Any, rows: list[Row], spec: str, form: str, dtype: str) -> int | None:
    """The form's error, the budget and the bound of one spec in one dtype against N
    (plot_error_vs_n); returns the first N where the bound is vacuous, if any."""
    rows = [r for r in rows if (r["spec"], r["form"], r["dtype"]) == (spec, form, dtype)]
    causal = "(causal)" in spec
    colour = CAUSALITY_COLOURS[causal]
    which = "causal" if causal else "non-causal"
    what = "implementation" if form == "impl" else f"{form} form"
    lines = (
        ("max_error", f"{what}, {which}", {"marker": FORM_MARKERS.get(form, "o"), "ms": 4}),
        ("budget", f"budget ({K_BUDGET:g} x golden or floor), {which}", {"ls": "--", "lw": 1}),
        ("bound_max", f"a-priori bound (max), {which}", {"ls": ":", "lw": 1.5, "marker": "."}),
    )
    for key, label, style in lines:
        points = sorted(
            (r["n"], max(r[key], SWEEP_ERROR_FLOOR)) for r in rows if _finite(r.get(key))
        )
        if points:
            ax.plot(*zip(*points, strict=True), color=colour, label=label, **style)
    vacuous = [r["n"] for r in rows if "bound_max" in r and not _finite(r["bound_max"])]
    return min(vacuous, default=None)


def _vacuous_note(ax: Any, vacuous: dict[str, int | None]) -> None:
    """Name, top right, the N from which each spec's bound is vacuous (not drawn)."""
    firsts = {n for n in vacuous.values() if n is not None}
    if len(firsts) == 1 and None not in vacuous.values():
        notes = [f"bound vacuous from N = {power_of_2(firsts.pop())}"]
    else:
        notes = [
            f"{spec.split(' ')[1].strip('()')} bound vacuous from N = {power_of_2(n)}"
            for spec, n in vacuous.items()
            if n is not None
        ]
    if notes:
        ax.text(0.97, 0.95, "\n".join(notes), transform=ax.transAxes, ha="right", va="top",
                fontsize=6.5, color="0.3")  # fmt: skip


def plot_margins(margins: list[Row], dtype: str, path: Path) -> Path:
    """Histograms of the relative denominator margin r = D / sum |a| (inputs rounded to
    `dtype`): a panel per feature map some of whose rows have r < 1, a step line for each
    such spec (non-causal solid, causal dashed); the specs whose r is 1 wherever defined
    are named below the panels."""
    plt = _pyplot()
    centres = (np.array(MARGIN_EDGES[:-1]) + np.array(MARGIN_EDGES[1:])) / 2
    chosen = [m for m in margins if m["dtype"] == dtype]
    drawn = [m for m in chosen if m["min"] is not None and m["min"] < 1]
    maps = list(dict.fromkeys(m["spec"].split(" ")[0] for m in drawn))
    rest = _named_by_map([m["spec"] for m in chosen if m not in drawn])
    height = 3.9 if maps else 0.8  # no panel: the note alone
    fig = plt.figure(figsize=(max(4.6 * len(maps), 6.4), height))
    try:
        for ax, name in zip(fig.subplots(1, len(maps), squeeze=False)[0] if maps else [], maps):
            for m in drawn:
                if m["spec"].split(" ")[0] == name:
                    causal = "(causal)" in m["spec"]
                    ax.step(
                        centres, m["histogram"], where="mid", color=CAUSALITY_COLOURS[causal],
                        ls="--" if causal else "-", label="causal" if causal else "non-causal",
                    )  # fmt: skip
            ax.set_yscale("log")
            ax.set_xlim(-1, 1)
            ax.set_xlabel("r = D_i / sum_j |a_ij|")
            ax.set_ylabel("rows")
            ax.set_title(f"{name}: denominator margins ({dtype})", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(loc="upper left", fontsize=7)
        if rest:
            fig.text(0.5, 0.02 if maps else 0.5, f"r = 1 on every row where defined ({dtype}, "
                     f"not drawn): {', '.join(rest)}", ha="center",
                     va="bottom" if maps else "center", fontsize=8, wrap=True)  # fmt: skip
        if maps:
            fig.tight_layout(rect=(0, 0.45 / height if rest else 0, 1, 1))
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def _named_by_map(specs: list[str]) -> list[str]:
    """The specs by feature map where both of its specs are listed, else by spec."""
    maps = [spec.split(" ")[0] for spec in specs]
    return list(
        dict.fromkeys(m if maps.count(m) == 2 else s for m, s in zip(maps, specs, strict=True))
    )


def _decades(axes: Sequence[Any]) -> None:
    """Log y on axes that share it, limits at whole decades around their lines (two
    labelled ticks at least; one more above where a panel has a note), minor ticks
    unlabelled."""
    from matplotlib.ticker import LogLocator, NullFormatter

    ys = [np.asarray(line.get_ydata(), float) for ax in axes for line in ax.lines]
    for ax in axes:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.tick_params(axis="y", labelsize=8)
    if ys:
        ys = np.concatenate(ys)
        low = np.floor(np.log10(ys.min()))
        high = np.ceil(np.log10(ys.max()) + 0.05) + any(ax.texts for ax in axes)
        axes[0].set_ylim(10**low, 10 ** max(high, low + 1))


def _legend(axes: Any) -> dict[str, Any]:
    """Every labelled line of the axes, by label, in the order first drawn."""
    legend: dict[str, Any] = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    return legend


LONG_STYLES = {  # line kind -> (label, style); forms by name, then the golden and bounds
    "quadratic": ("quadratic form", {"color": "C0", "marker": "o", "ms": 3}),
    "linear": ("linear form", {"color": "C1", "marker": "o", "ms": 3}),
    "recurrent": ("recurrent form", {"color": "C2", "marker": "o", "ms": 3}),
    "chunked": ("chunked form", {"color": "C3", "marker": "o", "ms": 3}),
    "impl": ("implementation", {"color": "C1", "marker": "o", "ms": 3}),
    "golden": ("golden", {"color": "black", "ls": "--", "lw": 1}),
    # the budget the verdict judges by (the long-context check's: K_BUDGET x the larger of
    # the golden's error over the rows it compares and the attainable floor)
    "budget": (f"budget ({K_BUDGET:g} x golden or floor)", {"color": "black", "lw": 1.2}),
    "bound_max": ("deterministic bound (max)", {"color": "0.45", "ls": ":", "lw": 1.5}),
    "probabilistic_bound_max": (
        "probabilistic bound (max)",
        {"color": "0.45", "ls": "-.", "lw": 1},
    ),
}
ERROR_FLOOR = 0.1  # errors below it (exact outputs: 0) are drawn at it, on a log axis


def plot_long_context(rows: list[Row], dtype: str, path: Path) -> Path:
    """Max error (units of u s) against N in `dtype`, one panel per spec: each form, the
    golden's error, the budget the verdict judges by (the rows' `budget`: the long-context
    check's) and the two bounds' largest element (a bound is drawn where finite, and the
    panel says from which N the deterministic one is vacuous); a failed judgement gets a
    red cross. One legend below the panels."""
    plt = _pyplot()
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
    from matplotlib.ticker import LogLocator, NullFormatter

    ns = sorted({r["n"] for r in rows})
    at = {r["n"]: r for r in rows}  # the per-N figures, the same in every form's row
    for key in ("bound_max", "probabilistic_bound_max"):
        _line(ax, [(n, at[n].get(key)) for n in ns], key)
    vacuous = []
    for key, what in (("bound_max", "deterministic"), ("probabilistic_bound_max", "probabilistic")):
        first = next((n for n in ns if key in at[n] and not _finite(at[n][key])), None)
        if first is not None:
            vacuous.append(f"{what} bound vacuous from N = {power_of_2(first)}")
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
    budgets = {r["n"]: r["budget"] for r in reversed(rows) if _finite(r.get("budget"))}
    _line(ax, [(n, budgets.get(n)) for n in ns], "budget")  # the same for every form at N
    ax.set_yscale("log")
    if ax.lines:  # none where every form raised and the golden is not finite
        ys = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax.lines])
        low, high = ys.min() / 3, ys.max() * 12  # room above for the note on vacuous bounds
        ax.set_ylim(low, max(high, low * 1e3))  # three decades at least: ticks at 10^k
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_minor_formatter(NullFormatter())
    n_axis(ax, ns)
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
