"""The structure of the report's figures, read from the matplotlib objects (not pixels):
every spec gets a panel, at most MAX_LINES lines a panel, N ticked at the N measured with no
minor tick labels, the form, the budget and the bound named in the legends, no empty
legend."""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest

from linattn_verify.report.accuracy import MARGIN_EDGES
from linattn_verify.report.build import _scaling_curves
from linattn_verify.report.plots import plot_error_vs_n, plot_margins
from linattn_verify.scaling import Cost, plot_scaling
from linattn_verify.scaling.timing import judge_timings
from linattn_verify.specs import Spec
from linattn_verify.under_test import resolve

MAX_LINES = 6
NS = (16, 64, 256)
MAPS = ("softmax", "elu", "performer-trig")
FAST = {
    f"{name} ({'causal' if causal else 'non-causal'})": (
        "quadratic" if name == "softmax" else "chunked" if causal else "linear"
    )
    for name in MAPS
    for causal in (False, True)
}


@pytest.fixture
def figures(monkeypatch):
    """The figures the plots close, kept open to be read, closed after the test."""
    kept, close = [], plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def _panels(fig):
    """The visible axes, each with a line at least."""
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert all(ax.lines for ax in shown)
    return shown


def _assert_n_axis(ax, ns):
    assert list(ax.xaxis.get_majorticklocs()) == list(ns)
    assert not list(ax.xaxis.get_minorticklocs())
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"$2^{{{n.bit_length() - 1}}}$" for n in ns
    ]
    assert not any(t.get_text() for t in ax.yaxis.get_minorticklabels())


def _sweep_rows():
    rows = []
    for spec, form in FAST.items():
        for dtype in ("bfloat16", "float32"):
            for n in NS:
                vacuous = dtype == "bfloat16" and n == NS[-1]
                for f in {form, "quadratic"}:  # the other forms are in the rows, not drawn
                    rows.append({"spec": spec, "form": f, "dtype": dtype, "n": n,
                                 "max_error": 0.0 if n == NS[0] else 1.5, "budget": 6.0,
                                 "bound_max": None if vacuous else 40.0 * n})  # fmt: skip
    return rows


def test_error_vs_n_is_a_panel_per_map_and_dtype_with_form_budget_and_bound(figures, tmp_path):
    plot_error_vs_n(_sweep_rows(), FAST, tmp_path / "e.png")
    (fig,) = figures
    grid = fig.axes
    assert len(grid) == len(MAPS) * 2 and _panels(fig) == grid
    for i, ax in enumerate(grid):
        labels = [line.get_label() for line in ax.lines]
        assert len(labels) <= MAX_LINES and not ax.get_legend()
        form = FAST[f"{MAPS[i // 2]} (non-causal)"]
        assert f"{form} form, non-causal" in labels
        assert sum(label.startswith("budget") for label in labels) == 2
        assert sum(label.startswith("a-priori bound") for label in labels) == 2
        _assert_n_axis(ax, NS)
    bounds = [line for line in grid[0].lines if line.get_label().startswith("a-priori")]
    assert all(len(line.get_xdata()) == 2 for line in bounds)  # bfloat16: vacuous at 2^8
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert len(texts) == len(set(texts)) == 8  # 4 forms, 2 budgets, 2 bounds
    assert texts[:2] == ["quadratic form, non-causal", "quadratic form, causal"]


def test_margins_has_panels_only_for_maps_with_content_and_no_figure_legend(figures, tmp_path):
    bins = len(MARGIN_EDGES) - 1
    margins = [
        {
            "spec": spec,
            "dtype": "float32",
            "zero_over_zero": 0,
            "min": -0.5 if spec.startswith("performer-trig") else 1.0,
            "histogram": [1] * bins,
        }
        for spec in FAST
    ]
    plot_margins(margins, "float32", tmp_path / "m.png")
    (fig,) = figures
    (ax,) = fig.axes
    assert ax.get_title().startswith("performer-trig") and not fig.legends
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["non-causal", "causal"]
    (note,) = fig.texts
    assert "softmax, elu" in note.get_text()


def test_margins_without_content_is_the_note_alone(figures, tmp_path):
    margins = [{"spec": "elu (causal)", "dtype": "float32", "zero_over_zero": 0, "min": 1.0}]
    plot_margins(margins, "float32", tmp_path / "m.png")
    (fig,) = figures
    assert not fig.axes and "elu (causal)" in fig.texts[0].get_text()


def _timing(ns, per_n):
    return judge_timings(ns, [[per_n * n] * 3 for n in ns])


def _costs(ns, order):
    return [Cost(n, 4 * n**order, 2 * n**order) for n in ns]


def test_scaling_draws_every_group_in_small_multiples(figures, tmp_path):
    ns = (256, 512, 1024, 2048)
    costs, panels = {}, {}
    for name in MAPS:
        for causal in ("non-causal", "causal"):
            key = f"{name} {causal}"
            costs[key] = _costs(ns, 2 if name == "softmax" else 1)
            panels[key] = (name, causal)
    timings = {"elu non-causal": _timing(ns, 1e-6), "sdpa": _timing(ns, 1e-9)}
    panels["sdpa"] = ("elu", "sdpa")
    plot_scaling(timings, costs, tmp_path / "s.png", panels)
    (fig,) = figures
    drawn = _panels(fig)
    titles = [ax.get_title() for ax in drawn]
    assert titles == [
        "softmax: FLOPs and peak bytes",
        "elu: time (median, one thread)",
        "elu: FLOPs and peak bytes",
        "performer-trig: FLOPs and peak bytes",
    ]
    for ax in drawn:
        assert len(ax.lines) <= MAX_LINES
        assert len(ax.get_legend().get_texts()) == len(ax.lines)
        _assert_n_axis(ax, ns)
    assert [t.get_text() for t in drawn[1].get_legend().get_texts()] == [
        "non-causal (N^1.00)",
        "sdpa (N^1.00)",
    ]


def test_scaling_without_groups_is_one_time_and_one_cost_panel(figures, tmp_path):
    ns = (256, 512, 1024)
    plot_scaling({"x": _timing(ns, 1e-6)}, {"x": _costs(ns, 1)}, tmp_path / "s.png")
    (fig,) = figures
    assert [ax.get_title() for ax in _panels(fig)] == ["time (median, one thread)",
                                                       "FLOPs and peak bytes"]  # fmt: skip


def test_scaling_splits_flops_and_bytes_where_one_panel_would_hold_too_many(figures, tmp_path):
    ns = (256, 512, 1024)
    names = [f"form {i}" for i in range(MAX_LINES)]  # the benchmark's six, ungrouped
    timings = {name: _timing(ns, 1e-6) for name in names}
    plot_scaling(timings, {name: _costs(ns, 1) for name in names}, tmp_path / "s.png")
    (fig,) = figures
    drawn = _panels(fig)
    assert [ax.get_title() for ax in drawn] == [
        "time (median, one thread)",
        "FLOPs (counted)",
        "peak live bytes",
    ]
    assert all(len(ax.lines) == MAX_LINES for ax in drawn)


def test_the_report_groups_its_scaling_curves_by_feature_map():
    ns = (256, 512)
    measured = []
    for name in ("elu", "relu"):
        for causal in (False, True):
            spec = Spec(name, causal=causal)
            impl = resolve(form="chunked" if causal else "linear", spec=spec)
            timed = name == "elu"
            result = SimpleNamespace(
                costs=_costs(ns, 1),
                timing=_timing(ns, 1e-6) if timed else None,
                sdpa_timing=_timing(ns, 1e-7) if timed else None,
            )
            measured.append((impl, result, "cpu"))
    timings, costs, panels = _scaling_curves(measured)
    assert len(costs) == 4 and len(timings) == 4
    assert sorted(panels[name] for name in costs) == [
        ("elu", "chunked, causal"),
        ("elu", "linear, non-causal"),
        ("relu", "chunked, causal"),
        ("relu", "linear, non-causal"),
    ]
    assert sorted(panels[name] for name in timings if name not in costs) == [
        ("elu", "sdpa, causal"),
        ("elu", "sdpa, non-causal"),
    ]
