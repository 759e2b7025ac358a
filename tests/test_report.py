"""`python -m linattn_verify report`: the JSON schema, the Markdown, the atomic write,
--compare and the bad inputs. The runs here are shrunk (two N, two dtypes, short scaling
and random-feature sweeps) by patching the sweep constants; the default run's size and time
are the README's."""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import linattn_verify.report.build as build
import linattn_verify.report.long as report_long
import linattn_verify.report.random_features as report_rf
from linattn_verify.cli import main
from linattn_verify.families import attention
from linattn_verify.inputs import UNIT_ROUNDOFF
from linattn_verify.report import ERROR_FACTOR, TIME_FACTOR, compare
from linattn_verify.report.accuracy import Sweep, denominator_margins, sweep_inputs
from linattn_verify.specs import FEATURE_MAPS, Spec, SpecError
from linattn_verify.stats.plot import plot_mse_vs_m
from linattn_verify.under_test import resolve

TARGETS = Path(__file__).parent / "vet_targets.py"
SPECS = ("elu", "performer-trig")
DTYPES = ("float16", "float32")
FORMS = {False: ("quadratic", "linear"), True: ("quadratic", "recurrent", "chunked")}


@pytest.fixture(scope="module")
def small_sweep():
    """The sweep constants shrunk for the duration of this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "DEFAULT_NS", (8, 16))
        mp.setattr(build, "COST_NS", (256, 512))
        mp.setattr(build, "TIME_NS", (256, 512))
        mp.setattr(report_long, "LONG_NS", (16, 64))
        mp.setattr(
            report_rf,
            "plot_mse_vs_m",
            functools.partial(plot_mse_vs_m, ms=(1, 2, 4), replicates=256),
        )
        yield mp


def _report(tmp: Path, *extra: str) -> tuple[int, Path]:
    out = tmp / "latest"
    code = main(["report", "--out", str(out), "--quiet", "--device", "cpu", *extra])
    return code, out


@pytest.fixture(scope="module")
def report(small_sweep, tmp_path_factory):
    """One shrunk built-in report: (exit code, output folder, document)."""
    tmp = tmp_path_factory.mktemp("report")
    code, out = _report(tmp, "--specs", *SPECS, "--dtypes", *DTYPES)
    return code, out, json.loads((out / "report.json").read_text())


# ------------------------------------------------------------------------- schema


def test_the_document_has_the_documented_top_level_keys(report):
    code, _, doc = report
    assert code == 0 and doc["verdict"] == "pass"
    assert set(doc) == {
        "schema",
        "verdict",
        "environment",
        "accuracy",
        "gradients",
        "long_context",
        "scaling",
        "random_features",
    }
    assert doc["schema"] == build.SCHEMA


def test_every_form_spec_dtype_and_n_is_judged_once(report):
    rows = report[2]["accuracy"]["rows"]
    keys = [(r["spec"], r["form"], r["dtype"], r["n"]) for r in rows]
    expected = {
        (f"{name} ({'causal' if causal else 'non-causal'})", form, dtype, n)
        for name in SPECS
        for causal in (False, True)
        for form in FORMS[causal]
        for dtype in DTYPES
        for n in (8, 16)
    }
    assert len(keys) == len(set(keys)) and set(keys) == expected
    for r in rows:
        assert r["device"] == "cpu" and r["passed"] is True
        assert 0 <= r["p99_error"] <= r["max_error"] <= r["budget"]
        name = r["spec"].split(" (")[0]
        terms = (
            FEATURE_MAPS[name].feature_dim(16, 16) + r["n"] + 1
            if name != "softmax"
            else 1 + r["n"] + 1
        )
        floor = max(1.0, math.sqrt(terms) * UNIT_ROUNDOFF["float32"] / r["unit_roundoff"])
        assert r["budget"] == pytest.approx(4 * max(r["golden_max_error"], floor))
        assert r["unit_roundoff"] == {"float16": 2**-11, "float32": 2**-24}[r["dtype"]]


def test_the_long_sequences_cover_the_default_share_of_the_specs(report):
    _, out, doc = report
    rows = doc["long_context"]["rows"]
    keys = {(r["spec"], r["form"], r["dtype"], r["n"]) for r in rows}
    assert len(keys) == len(rows) and keys == {
        (f"elu ({'causal' if causal else 'non-causal'})", form, dtype, n)
        for causal in (False, True)
        for form in FORMS[causal]
        for dtype in DTYPES
        for n in (16, 64)
    }  # elu's two of LONG_SPECS; performer-trig with --full only
    assert all(r["passed"] for r in rows)
    assert doc["long_context"]["plots"] == {t: f"long_context_{t}.png" for t in DTYPES}
    assert doc["environment"]["sweep"]["long_context"]["ns"] == [16, 64]
    assert (out / "report.md").read_text().count("](long_context_") == len(DTYPES)


def test_every_form_spec_and_dtype_has_its_gradients_judged(report):
    rows = report[2]["gradients"]["rows"]
    keys = {(r["spec"], r["form"], r["dtype"]) for r in rows}
    assert len(keys) == len(rows) == 2 * 5 * len(DTYPES)  # 2 + 3 forms per spec
    for r in rows:
        assert r["n"] == 16 and r["passed"] and set(r["max_error"]) == {"q", "k", "v"}
        assert all(r["max_error"][n] <= r["budget"][n] for n in "qkv")
        assert r["bound"] is None or r["bound"] > 1  # None: vacuous (n u >= 1)


def test_margins_count_the_rows_of_the_largest_n(report):
    margins = report[2]["accuracy"]["margins"]
    assert {(m["spec"].split()[0], m["dtype"]) for m in margins} == {
        (s, t) for s in SPECS for t in DTYPES
    }
    for m in margins:
        assert m["n"] == 16 and m["rows"] == 1 * 1 * 16 == sum(m["histogram"]) + m["zero_over_zero"]
        if m["spec"].startswith("elu"):  # positive similarities: r = 1 on every row
            assert m["min"] == pytest.approx(1.0) and m["non_positive"] == m["at_risk"] == 0
        else:  # signed: somewhere below 1
            assert m["min"] < 1


def test_scaling_and_random_features_carry_their_figures(report):
    _, out, doc = report
    rows = doc["scaling"]["rows"]
    assert {r["implementation"].split(" form=")[1].split()[0] for r in rows} == {
        "linear",
        "chunked",
    }
    for r in rows:
        assert r["cost_passed"] and abs(r["flops_slope"] - 1) < 0.05
        assert [c["n"] for c in r["costs"]] == [256, 512]
    timed = [r for r in rows if "seconds" in r]
    assert {r["spec"] for r in timed} == {"elu (non-causal)", "elu (causal)"}
    assert all(set(r["seconds"]) == {"256", "512"} and "sdpa_seconds" in r for r in timed)
    samplers = doc["random_features"]["samplers"]
    assert [s["claim"] for s in samplers] == ["iid", "orthogonal"]
    assert all(s["passed"] and len(s["checks"]) == 12 for s in samplers)
    assert set(doc["random_features"]["mse_vs_m"]) == {
        "performer-positive", "performer-hyperbolic", "performer-trig"
    }  # fmt: skip
    plots = {
        **doc["accuracy"]["plots"],
        **doc["scaling"]["plots"],
        **doc["random_features"]["plots"],
    }
    assert set(plots) == {"error_vs_n", "margins", "scaling", "mse_vs_m"}
    for name in plots.values():
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_environment_names_what_the_figures_depend_on(report):
    env = report[2]["environment"]
    for key in (
        "packages",
        "git",
        "device",
        "torch_threads",
        "native_kernel",
        "float32_matmul_precision",
        "cuda_matmul_allow_tf32",
        "fp16_reduced_precision_reduction",
        "seed",
        "seconds",
    ):
        assert key in env  # fmt: skip
    assert env["seed"] == 0 and env["packages"]["torch"] == torch.__version__
    assert env["sweep"]["accuracy"]["ns"] == [8, 16]


def test_the_json_is_strict_json(report):
    def refuse(token):
        raise AssertionError(f"{token} is not JSON")

    text = (report[1] / "report.json").read_text()
    assert json.loads(text, parse_constant=refuse) == report[2]


def test_a_gradient_case_with_a_0_over_0_row_is_reported_not_judged(small_sweep, tmp_path):
    # seed 411: the N = 16 inputs of causal relu have a row with no positive similarity
    code, out = _report(tmp_path, "--specs", "relu", "--dtypes", "float32", "--seed", "411")
    doc = json.loads((out / "report.json").read_text())
    skipped = [r for r in doc["gradients"]["rows"] if "skipped" in r]
    assert code == 0 and skipped and all(r["spec"] == "relu (causal)" for r in skipped)
    assert skipped[0]["skipped"].startswith("not judged: the exact denominator of row")
    assert "not judged" in (out / "report.md").read_text()


# ----------------------------------------------------------------------- Markdown


def test_markdown_opens_with_the_summary_at_the_largest_n(report):
    _, out, doc = report
    md = (out / "report.md").read_text()
    lines = md.splitlines()
    assert lines[0] == "# linattn-verify report"
    table = lines[lines.index(next(line for line in lines if line.startswith("| spec |"))) :]
    assert table[0] == "| spec | form | float16 | float32 | verdict | gradients |"
    assert md.index("| spec | form |") < md.index("## Accuracy vs N")
    row = next(r for r in doc["accuracy"]["rows"] if r["spec"] == "elu (causal)"
               and r["form"] == "chunked" and r["dtype"] == "float32" and r["n"] == 16)  # fmt: skip
    cell = f"{row['max_error']:.3g} / {row['p99_error']:.3g} ({row['budget']:.3g})"
    line = next(x for x in table if x.startswith("| elu (causal) | chunked | "))
    assert line.split(" | ")[3] == cell  # the float32 column, at N = 16 (not 8)
    for section in (
        "## Accuracy vs N",
        "## Accuracy vs N at long sequences",
        "## Positivity margins",
        "## Gradients",
        "## Random features",
        "## Scaling",
        "## Environment",
    ):
        assert section in md  # fmt: skip
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", md):
        assert (out / image).is_file()


# --------------------------------------------------------------------- atomic write


def test_a_crash_leaves_the_previous_report_as_it_was(small_sweep, tmp_path, monkeypatch):
    out = tmp_path / "latest"
    out.mkdir()
    (out / "report.md").write_text("the previous report")
    (out / "report.json").write_text(json.dumps({"schema": build.SCHEMA}))
    json_path = tmp_path / "r.json"
    json_path.write_text("{}")

    def crash(*args, **kwargs):
        raise RuntimeError("killed half-way")

    monkeypatch.setattr(build, "random_features", crash)
    with pytest.raises(RuntimeError, match="half-way"):
        main(["report", "--out", str(out), "--quiet", "--specs", "elu", "--dtypes", "float32",
              "--json", str(json_path)])  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert (out / "report.md").read_text() == "the previous report"
    assert json_path.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "r.json"]  # no staging left


def test_a_killed_run_leaves_the_previous_report_and_no_staging(tmp_path):
    out = tmp_path / "latest"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"schema": build.SCHEMA}))
    run = subprocess.Popen(
        [sys.executable, "-m", "linattn_verify", "report", "--specs", "elu", "--dtypes",
         "float32", "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".latest.") for p in tmp_path.iterdir()):
        assert run.poll() is None and time.monotonic() < deadline, "no staging folder seen"
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)  # mid-run: the staging folder exists
    assert run.wait(timeout=60) == 128 + signal.SIGTERM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    assert [p.name for p in out.iterdir()] == ["report.json"]


def test_a_new_report_replaces_the_whole_folder(report, tmp_path):
    from linattn_verify.report import publish, staging

    out = tmp_path / "latest"
    out.mkdir()
    (out / "stale.png").write_text("from an older run")
    (out / "report.json").write_text(json.dumps({"schema": build.SCHEMA}))
    with staging(out) as folder:
        (folder / "report.md").write_text("new")
        publish(folder, out)
    assert [p.name for p in out.iterdir()] == ["report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


# ------------------------------------------------------------------------ --compare


def _rows(doc, **match):
    return [r for r in doc["accuracy"]["rows"] if all(r[k] == v for k, v in match.items())]


def test_a_report_has_no_regression_against_itself(report):
    result = compare(report[2], report[2], "same.json")
    assert result.regressions == [] and result.compared > len(report[2]["accuracy"]["rows"])


def test_an_error_beyond_the_factor_is_a_regression_and_one_within_is_not(report):
    doc = report[2]
    old = copy.deepcopy(doc)
    row = next(r for r in _rows(old, dtype="float32") if r["max_error"] > 2)
    twin = next(r for r in _rows(old, dtype="float32") if r["max_error"] > 2 and r is not row)
    row["max_error"] /= ERROR_FACTOR * 1.1  # the new error is 2.2x the old
    twin["max_error"] /= ERROR_FACTOR * 0.9  # 1.8x
    result = compare(old, doc, "old.json")
    assert len(result.regressions) == 1
    assert row["spec"] in result.regressions[0] and row["form"] in result.regressions[0]


def test_errors_below_one_unit_are_not_compared_as_ratios(report):
    doc = report[2]
    old = copy.deepcopy(doc)
    small = [r for r in _rows(old, dtype="float16") if r["max_error"] < 1]
    for r in small:
        r["max_error"] /= 10  # up 10x, but still below the 1-unit floor of the output rounding
    assert small and compare(old, doc, "old.json").regressions == []


def test_a_gradient_error_beyond_the_factor_is_a_regression(report):
    new = copy.deepcopy(report[2])
    row = new["gradients"]["rows"][5]
    old_dk = row["max_error"]["k"]
    row["max_error"]["k"] = 2.1 * max(old_dk, row["rounding_floor"]["k"])
    row["max_error"]["q"] = 1.9 * max(row["max_error"]["q"], row["rounding_floor"]["q"])
    (regression,) = compare(report[2], new, "old.json").regressions
    assert row["spec"] in regression and "dk max error" in regression
    assert regression.endswith("u M")


def test_pass_turned_fail_is_a_regression_whatever_the_figures(report):
    new = copy.deepcopy(report[2])
    row = new["accuracy"]["rows"][3]
    row["passed"] = False
    new["scaling"]["rows"][0]["cost_passed"] = False
    new["random_features"]["samplers"][1]["passed"] = False
    regressions = compare(report[2], new, "old.json").regressions
    assert len(regressions) == 3
    assert "now fails" in regressions[0] and "cost growth now fails" in regressions[1]
    assert "orthogonal: its statistics now fail" in regressions[2]


def test_slower_is_a_regression_only_on_the_same_machine(report):
    doc = copy.deepcopy(report[2])
    for r in doc["scaling"]["rows"]:
        if "seconds" in r:
            r["time_status"] = "ok"  # as if both runs had passed the noise gate
    old = copy.deepcopy(doc)
    timed = [r for r in old["scaling"]["rows"] if "seconds" in r]
    for r in timed:
        r["seconds"] = {n: t / (TIME_FACTOR * 1.2) for n, t in r["seconds"].items()}
    result = compare(old, doc, "old.json")
    assert len(result.regressions) == len(timed)
    assert all("slower" in r for r in result.regressions)
    old["environment"]["device_name"] = "another machine"
    result = compare(old, doc, "old.json")
    assert result.regressions == [] and "another machine" in result.notes[0]
    for r in doc["scaling"]["rows"]:
        r["time_status"] = "too noisy"
    old["environment"]["device_name"] = doc["environment"]["device_name"]
    result = compare(old, doc, "old.json")
    assert result.regressions == [] and "noise gate" in result.notes[0]


def test_a_higher_cost_slope_is_a_regression(report):
    old = copy.deepcopy(report[2])
    old["scaling"]["rows"][0]["flops_slope"] -= 0.1
    (regression,) = compare(old, report[2], "old.json").regressions
    assert "flops ~ N^0.9" in regression


def test_a_report_of_other_inputs_is_not_compared_figure_by_figure(report):
    old = copy.deepcopy(report[2])
    old["environment"]["seed"] = 7
    for r in old["accuracy"]["rows"]:
        r["max_error"] = 1e-3  # would be regressions everywhere, were the inputs the same
    result = compare(old, report[2], "old.json")
    assert result.regressions == [] and result.notes[0].startswith("not compared")


def test_a_document_of_another_kind_cannot_be_compared(report):
    with pytest.raises(SpecError, match="schema"):
        compare({"schema": "something else"}, report[2], "x.json")


def test_compare_on_the_command_line_exits_1_and_writes_the_regressions(
    small_sweep, report, tmp_path
):
    old = copy.deepcopy(report[2])
    for r in old["scaling"]["rows"]:
        r["time_status"] = "too noisy"  # timings are not compared: this run's may differ
        if r["spec"] == "elu (causal)":
            r["flops_slope"] -= 0.2  # as if the chunked form had grown as N^0.8
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old))
    code, out = _report(
        tmp_path, "--specs", "elu", "--dtypes", "float32", "--compare", str(old_path)
    )
    assert code == 1
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "pass"
    (regression,) = doc["comparison"]["regressions"]
    assert regression.startswith("lv.attention elu (causal) form=chunked") and "flops" in regression
    assert "missing" not in regression and doc["comparison"]["notes"]  # specs left out: noted
    assert f"**{regression}**" in (out / "report.md").read_text()


# ----------------------------------------------------------------------- --impl


def test_a_third_party_implementation_is_reported_and_its_failure_shown(small_sweep, tmp_path):
    target = f"{TARGETS}:bf16_state_elu"
    code, out = _report(tmp_path, "--impl", target, "--feature-map", "elu", "--causal",
                        "--dtypes", "float32")  # fmt: skip
    assert code == 1
    doc = json.loads((out / "report.json").read_text())
    assert doc["verdict"] == "fail" and "skipped" in doc["random_features"]
    (row,) = [r for r in doc["accuracy"]["rows"] if r["n"] == 16]
    assert row["form"] == "impl" and row["passed"] is False and row["max_error"] > 1000
    assert "FAIL" in (out / "report.md").read_text()


def test_an_implementation_that_fails_while_measured_gets_a_failed_scaling_row(
    small_sweep, tmp_path
):
    target = f"{TARGETS}:small_heads_only"  # the accuracy sweep has d = 16, scaling d = 32
    code, out = _report(tmp_path, "--impl", target, "--feature-map", "elu", "--dtypes", "float32")
    doc = json.loads((out / "report.json").read_text())
    (row,) = doc["scaling"]["rows"]
    assert code == 1 and not row["cost_passed"] and "head dimension 32 > 16" in row["error"]
    assert all(r["passed"] for r in doc["accuracy"]["rows"] + doc["gradients"]["rows"])


def test_a_forward_only_implementation_is_reported_with_no_grad(small_sweep, tmp_path):
    args = ["--impl", f"{TARGETS}:forward_only", "--feature-map", "elu", "--dtypes", "float32"]
    code, out = _report(tmp_path, *args)
    doc = json.loads((out / "report.json").read_text())
    assert code == 1 and "no backward" in doc["gradients"]["rows"][0]["error"]
    code, out = _report(tmp_path / "again", *args, "--no-grad")
    doc = json.loads((out / "report.json").read_text())
    assert code == 0 and doc["gradients"]["rows"] == [] and doc["verdict"] == "pass"


# ------------------------------------------------------------- non-plain specs

GATED = ("--causal", "--feature-map", "identity", "--no-normalize", "--scale", "d^-0.5",
         "--decay", "gates")  # fmt: skip
DELTA = ("--causal", "--feature-map", "identity", "--no-normalize", "--delta-rule", "--decay",
         "gates", "--qk-l2norm")  # fmt: skip


def _judged(doc) -> dict[str, list[dict]]:
    return {key: doc[key]["rows"] for key in ("accuracy", "long_context", "gradients")}


@pytest.mark.parametrize("spec, leaves", [(GATED, {"g"}), (DELTA, {"beta", "g"})],
                         ids=["gates", "delta-rule"])  # fmt: skip
def test_a_built_in_form_of_a_decayed_or_delta_rule_spec_passes_every_section(
    small_sweep, tmp_path, spec, leaves
):
    code, out = _report(tmp_path, "--form", "chunked", *spec, "--dtypes", "float32")
    doc = json.loads((out / "report.json").read_text())
    assert code == 0 and doc["verdict"] == "pass"
    rows = _judged(doc)
    assert [r["n"] for r in rows["accuracy"]] == [8, 16]
    assert [r["n"] for r in rows["long_context"]] == [16, 64]
    for r in rows["accuracy"] + rows["long_context"] + rows["gradients"]:
        assert r["passed"] and "decay=gates" in r["spec"], r
    # the decay's gradients (the delta rule's beta too) are judged with dq, dk and dv
    assert set(rows["gradients"][0]["max_error"]) == {"q", "k", "v", *leaves}
    sweep = doc["environment"]["sweep"]
    assert sweep["accuracy"]["decay"].startswith("cases.Case.decay")
    assert ("delta_rule" in sweep["long_context"]) == ("--delta-rule" in spec)
    # no denominator: the margins say why, and no plot is drawn
    (margin,) = doc["accuracy"]["margins"]
    assert margin["not_applicable"] == "unnormalised: the output has no denominator"
    assert "margins" not in doc["accuracy"]["plots"]
    markdown = (out / "report.md").read_text()
    assert f"Not applicable to {margin['spec']}: unnormalised" in markdown
    assert "Not run: --impl reports an implementation" in markdown  # random features


def test_the_margins_weigh_the_similarities_by_the_decay():
    """r = D_i / sum_j |a_ij w_ij|: r stays 1 for positive features, and moves for signed
    ones, whose far keys the decay weighs down."""
    sweep, margins = Sweep((64,), ("float64",), "cpu", h=2), {}
    for name, decay in (("elu", "gates"), ("performer-trig", "gates"), ("performer-trig", None)):
        spec = Spec(name, causal=True, decay=decay)
        q, k, _, w, gates = sweep_inputs(spec, sweep, 64, "float64")
        margins[name, decay] = denominator_margins(q, k, spec, w, gates)
    assert margins["elu", "gates"]["min"] == 1.0
    assert margins["performer-trig", "gates"]["min"] < 1.0
    assert margins["performer-trig", "gates"] != margins["performer-trig", None]


def gates_ignored(q, k, v, g):
    """BUG: GATED's chunked form with the gates never applied (a decay of 1)."""
    return attention(q, k, v, "identity", True, "chunked", normalize=False, scale="d^-0.5")


def delta_gates_ignored(q, k, v, beta, g):
    """BUG: DELTA's chunked form, beta used and the gates never applied (DeltaNet, not Gated
    DeltaNet)."""
    return attention(q, k, v, "identity", True, "chunked", normalize=False, delta_rule=True,
                     qk_l2norm=True, beta=beta)  # fmt: skip


@pytest.mark.parametrize(
    "fn, claim",
    [
        (gates_ignored, dict(normalize=False, scale="d^-0.5", decay="gates")),
        (delta_gates_ignored, dict(normalize=False, decay="gates", delta_rule=True,
                                   qk_l2norm=True)),
    ],
    ids=["gates", "delta-rule"],
)  # fmt: skip
def test_a_kernel_that_ignores_the_decay_fails_the_accuracy_and_long_sections(
    small_sweep, tmp_path, fn, claim
):
    impl = resolve(fn, feature_map="identity", causal=True, **claim)
    options = build.ReportOptions(("elu",), ("float32",), ("cpu",), impl=impl, grad=False)
    doc = build.run_report(options, tmp_path, lambda done: None)
    assert doc["verdict"] == "fail"
    for section, rows in _judged(doc).items():
        if section != "gradients":
            assert rows and not any(r["passed"] for r in rows), section
            assert all(r["max_error"] > r["budget"] for r in rows), section


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "args, message",
    [
        (["--specs", "nonsense"], "invalid choice: 'nonsense'"),
        (["--dtypes", "float8"], "invalid choice: 'float8'"),
    ],
)
def test_unknown_names_are_usage_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stop:
        _report(tmp_path, *args)
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "latest").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--feature-map", "elu"], "--feature-map describes --impl"),
        (["--impl", f"{TARGETS}:elu_linear"], "needs --feature-map"),
        (["--impl", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--specs", "elu"], "--specs"),
        (["--impl", "no_such_module:fn", "--feature-map", "elu"], "no_such_module"),
        (["--impl", "fast-transformers.linear", "--causal"], "is an adapter"),
        (["--compare", "/nonexistent/old.json"], "cannot read a report"),
        (["--json", "/nonexistent/dir/r.json"], "cannot write a file there"),
    ],
)
def test_bad_arguments_exit_2_before_any_work(tmp_path, capsys, args, message):
    code, out = _report(tmp_path, *args)
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_a_compare_file_that_is_not_a_report_is_refused(tmp_path, capsys):
    (tmp_path / "other.json").write_text('{"verdict": "pass"}')
    code, _ = _report(tmp_path, "--compare", str(tmp_path / "other.json"))
    assert code == 2 and "not a report.json of this tool" in capsys.readouterr().err


def test_a_folder_that_is_not_a_report_is_never_replaced(tmp_path, capsys):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    code = main(["report", "--out", str(precious), "--quiet"])
    assert code == 2 and "not a report of this tool" in capsys.readouterr().err
    assert [p.name for p in precious.iterdir()] == ["notes.txt"]


def test_an_unwritable_output_folder_fails_before_any_work(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    code = main(["report", "--out", str(tmp_path / "a_file" / "latest"), "--quiet"])
    assert code == 2 and "cannot write a report under" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_for_but_absent(tmp_path, capsys):
    code = main(["report", "--out", str(tmp_path / "r"), "--device", "cuda", "--quiet"])
    assert code == 2 and "no CUDA device" in capsys.readouterr().err


def test_an_implementation_that_raises_fails_by_name_and_writes_nothing(tmp_path, capsys):
    code, out = _report(tmp_path, "--impl", f"{TARGETS}:raising", "--feature-map", "elu")
    err = capsys.readouterr().err
    assert code == 1 and "raising raised ValueError: this kernel always fails" in err
    assert "no report written" in err and not out.exists()
    assert list(tmp_path.iterdir()) == []
