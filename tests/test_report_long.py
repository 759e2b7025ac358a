"""The report's accuracy vs N at long sequences (report/long.py) on small N: the rows, the
N each form runs at, a broken kernel failing there and the verdict with it, the plot, and
the progress count of a whole run. The section at its own N is the README's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import linattn_verify.report.build as build
import linattn_verify.report.long as long
from linattn_verify.families import forms_of
from linattn_verify.report.plots import plot_long_context
from linattn_verify.specs import Spec
from linattn_verify.under_test import resolve

TARGETS = Path(__file__).parent / "vet_targets.py"
NS = (16, 64, 256)
PNG = b"\x89PNG\r\n\x1a\n"


def _forms(spec: Spec) -> dict:
    return {form: resolve(form=form, spec=spec) for form in forms_of(spec)}


@pytest.fixture(scope="module")
def elu_causal():
    """The section's rows of causal elu at NS in float32 and bfloat16 (float64 asked for,
    and left out), and the progress steps it made."""
    steps: list[str] = []
    sweep = long.LongSweep(("float32", "bfloat16", "float64"), "cpu")
    rows = long.long_section([(Spec("elu", causal=True), _forms(Spec("elu", causal=True)), NS)],
                             sweep, steps.append)  # fmt: skip
    return rows, steps


def test_every_form_n_and_dtype_but_float64_has_one_passing_row(elu_causal):
    rows, steps = elu_causal
    keys = [(r["form"], r["dtype"], r["n"]) for r in rows]
    forms = ("quadratic", "recurrent", "chunked")
    assert sorted(keys) == sorted((f, t, n) for f in forms for t in ("float32", "bfloat16")
                                  for n in NS)  # fmt: skip
    assert len(steps) == len(NS) * 2 and steps[0] == "long elu (causal) N=16 float32"
    for r in rows:
        assert r["spec"] == "elu (causal)" and r["device"] == "cpu" and r["passed"], r["message"]
        assert 0 <= r["max_error"] <= r["budget"] and r["max_error"] <= r["bound_at_worst"]
        # positive features: every row's denominator resolved, the budget compares them all
        assert r["rows_left_to_bound"] == 0
        assert r["budget_golden_max_error"] == r["golden_max_error"]
        assert r["budget"] >= 4 * r["golden_max_error"]
        # the probabilistic bound is the smaller of the two, element by element
        assert r["probabilistic_bound_max"] <= r["bound_max"]


def test_the_bounds_grow_with_n_and_the_deterministic_one_turns_vacuous(elu_causal):
    rows, _ = elu_causal
    first = {(r["dtype"], r["n"]): r for r in rows if r["form"] == "chunked"}
    bounds = [first["float32", n]["bound_max"] for n in NS]
    assert bounds == sorted(bounds) and all(b < float("inf") for b in bounds)
    # bfloat16, u = 2^-8: n u >= 1 once the sums have 256 terms (m + N + 1 > 256 at N = 256)
    assert first["bfloat16", 256]["bound_max"] == float("inf")
    assert first["bfloat16", 256]["probabilistic_bound_max"] < float("inf")


def test_quadratic_forms_stop_at_their_longest_n(monkeypatch):
    monkeypatch.setattr(long, "QUADRATIC_LONGEST", 64)
    spec = Spec("elu")
    rows = long.long_rows(spec, _forms(spec), NS, long.LongSweep(("float32",), "cpu"),
                          lambda done: None)  # fmt: skip
    assert sorted((r["form"], r["n"]) for r in rows) == [
        ("linear", 16), ("linear", 64), ("linear", 256), ("quadratic", 16), ("quadratic", 64)
    ]  # fmt: skip
    declared = {"impl": resolve(form="linear", spec=spec, cost="quadratic")}
    assert long.long_ns(spec, declared, full=False, chosen=True) == (16, 64)  # quadratic cost
    assert long.long_ns(spec, _forms(spec), full=False, chosen=True) == long.LONG_NS
    softmax = Spec("softmax")  # its bound is arb's alone: not in the section
    assert long.long_ns(softmax, _forms(softmax), full=True, chosen=True) == ()


def test_full_runs_the_chosen_specs_to_2_20_and_the_others_to_2_18():
    spec = Spec("relu")
    assert long.long_ns(spec, _forms(spec), full=True, chosen=True)[-1] == 2**20
    assert long.long_ns(spec, _forms(spec), full=True, chosen=False)[-1] == 2**18
    assert long.FULL_LONGEST == 2**18
    assert long.LONG_NS == (16, 64, 256, 1024, 4096, 16384, 65536)


def test_every_form_of_a_decayed_spec_passes_on_the_checks_decay():
    spec = Spec("elu", causal=True, decay="constant")
    rows = long.long_rows(spec, _forms(spec), NS[:2], long.LongSweep(("float32", "bfloat16"),
                          "cpu"), lambda done: None)  # fmt: skip
    assert sorted({r["form"] for r in rows}) == sorted(forms_of(spec)) and len(rows) == 3 * 2 * 2
    assert all(r["passed"] and r["spec"] == "elu (causal, decay=constant)" for r in rows)


def test_the_delta_rule_stops_at_its_longest_n_and_is_judged_by_its_one_bound():
    spec = Spec("identity", causal=True, normalize=False, decay="gates", delta_rule=True)
    forms = _forms(spec)
    assert long.long_ns(spec, forms, full=False, chosen=True)[-1] == long.DELTA_LONGEST == 2**12
    assert long.long_ns(spec, forms, full=True, chosen=True)[-1] == long.DELTA_FULL_LONGEST
    assert long.DELTA_FULL_LONGEST == 2**16
    rows = long.long_rows(spec, forms, NS[:2], long.LongSweep(("float32",), "cpu"),
                          lambda done: None)  # fmt: skip
    assert len(rows) == len(forms) * 2 and all(r["passed"] for r in rows)
    # its normwise bound (families/delta/bound.py) is its only one: both columns show it
    assert all(r["bound_max"] == r["probabilistic_bound_max"] < float("inf") for r in rows)


def test_a_kernel_with_a_bfloat16_state_fails_here_and_fails_the_verdict(tmp_path):
    impl = resolve(f"{TARGETS}:bf16_state_elu", feature_map="elu", causal=True)
    rows = long.long_rows(impl.spec, {"impl": impl}, NS, long.LongSweep(("float32",), "cpu"),
                          lambda done: None)  # fmt: skip
    assert [r["n"] for r in rows] == list(NS)
    assert not any(r["passed"] for r in rows)
    assert all(r["max_error"] > r["budget"] and r["severity"] for r in rows)
    document = {
        "accuracy": {"rows": []},
        "long_context": {"rows": rows},
        "gradients": {"rows": []},
        "scaling": {"rows": []},
        "random_features": {},
    }
    assert build.verdict(document) == "fail"
    path = plot_long_context(rows, "float32", tmp_path / "long.png")
    assert path.read_bytes()[:8] == PNG


def test_the_plot_draws_the_budget_the_verdict_judges_by(tmp_path, monkeypatch):
    """Issue 51, item 9: the plot drew the golden's error, not the budget its crosses fail
    against (K_BUDGET x the golden's error over the rows the budget compares, or the
    floor). A kernel with a bfloat16 state fails the budget: its errors lie above the budget
    line, which is the rows' budget at each N."""
    import matplotlib.pyplot as plt

    impl = resolve(f"{TARGETS}:bf16_state_elu", feature_map="elu", causal=True)
    rows = long.long_rows(impl.spec, {"impl": impl}, NS, long.LongSweep(("float32",), "cpu"),
                          lambda done: None)  # fmt: skip
    assert not any(r["within_budget"] for r in rows)
    kept = []
    monkeypatch.setattr(plt, "close", kept.append)
    plot_long_context(rows, "float32", tmp_path / "long.png")
    (ax,) = [ax for ax in kept[0].axes if ax.get_visible()]
    lines = {line.get_label(): line for line in ax.lines}
    (budget,) = [line for label, line in lines.items() if label.startswith("budget")]
    assert list(budget.get_xdata()) == list(NS)
    assert list(budget.get_ydata()) == [r["budget"] for r in rows]
    errors = lines["implementation"].get_ydata()
    assert all(e > b for e, b in zip(errors, budget.get_ydata(), strict=True))
    plt.close(kept[0])


def test_the_plot_is_one_png_per_dtype_with_every_spec(elu_causal, tmp_path):
    rows, _ = elu_causal
    more = long.long_rows(Spec("elu"), _forms(Spec("elu")), NS[:2],
                          long.LongSweep(("float32",), "cpu"), lambda done: None)  # fmt: skip
    for dtype in ("float32", "bfloat16"):
        path = plot_long_context(json.loads(json.dumps(rows + more)), dtype, tmp_path / "p.png")
        assert path.read_bytes()[:8] == PNG  # infinities read back from JSON as null


def test_a_run_makes_as_many_progress_steps_as_units_says(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "DEFAULT_NS", (8,))
    monkeypatch.setattr(build, "COST_NS", (256, 512))
    monkeypatch.setattr(build, "TIME_NS", (256, 512))
    monkeypatch.setattr(long, "LONG_NS", (16, 64))
    monkeypatch.setattr(build, "random_features", lambda folder, seed, full, step: {})
    options = build.ReportOptions(("softmax", "relu"), ("float64", "float16"), ("cpu",))
    plan = build.make_plan(options)
    # none of LONG_SPECS in the report: its first spec but softmax, both ways, to N = 64
    assert [(str(s), ns) for s, _, ns in plan.long] == [
        ("relu (non-causal)", (16, 64)), ("relu (causal)", (16, 64))
    ]  # fmt: skip
    steps: list[str] = []
    document = build.run_report(options, tmp_path, steps.append)
    assert len(steps) == build.units(options, plan) - 3  # random features: 3, patched out
    rows = document["long_context"]["rows"]
    assert {r["dtype"] for r in rows} == {"float16"} and all(r["passed"] for r in rows)
    assert document["long_context"]["plots"] == {"float16": "long_context_float16.png"}
    assert (tmp_path / "long_context_float16.png").read_bytes()[:8] == PNG
