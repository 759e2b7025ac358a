"""The report's own plots (Agg backend, no display): error against N per dtype, and the
distribution of the denominators' relative margins."""

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
