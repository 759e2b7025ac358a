"""vet on implementations loaded in its worker process: a correct one passes with a JSON
report; a raising, a crashing and a hanging one each fail with a message and exit code 1,
within the timeout; a target that cannot be loaded is a usage error."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from linattn_verify.checks import GRAD_CHECKS
from linattn_verify.cli import main

TARGETS = Path(__file__).with_name("vet_targets.py")


def _vet(name: str, *extra: str) -> int:
    return main(["vet", f"{TARGETS}:{name}", "--feature-map", "elu", "--quiet", *extra])


def test_a_correct_implementation_passes_with_a_json_report(tmp_path, capsys):
    out = tmp_path / "vet.json"
    args = ["--dtypes", "float16", "float32", "--long", "2048", "--json", str(out)]
    assert _vet("elu_linear", *args) == 0
    report = json.loads(out.read_text())
    assert report["verdict"] == "pass"
    names = {c["name"] for c in report["checks"]}
    assert {"contract", "reference", "causality", "scaling", "accuracy float16"} <= names
    assert "N = 1024, 2049 in float16, float32" in next(
        c["detail"] for c in report["checks"] if c["name"] == "long-context"
    )
    assert "accuracy float64" not in names
    assert all({"name", "status", "detail"} <= set(c) for c in report["checks"])
    statuses = {"pass", "not applicable", "skipped", "envelope"}
    assert {c["status"] for c in report["checks"]} == statuses
    skipped = {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "skipped"}
    assert skipped["gradient"] == "without --grad" and skipped["known-answers"] == "without --kat"
    assert set(skipped) <= {*GRAD_CHECKS, "gradient-length", "known-answers"}
    assert report["findings"] == [] and report["failing_regimes"] == ["typical"]
    envelope = [c for c in report["checks"] if c["status"] == "envelope"]
    assert [c["name"] for c in envelope] == ["envelope float16", "envelope float32"]
    assert all(0 < c["figures"]["low"] < 1 < c["figures"]["high"] for c in envelope)
    assert report["environment"]["packages"]["torch"]
    assert set(report["seconds"]) >= {"contract", "accuracy", "scaling", "long-context"}
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "verdict: pass: no finding on typical inputs" and len(out) <= 20
    assert "skipped: the gradient checks (without --grad); known-answers (without --kat)" in out
    assert out[-1].startswith("time: ") and "long-context " in out[-1]


def test_repro_writes_a_script_the_summary_and_the_json_name(tmp_path, capsys):
    """--repro DIR (vet/repro.py, tests/test_repro.py): the last line names DIR and the
    script; the JSON gives each finding's script."""
    repro, out = tmp_path / "repro", tmp_path / "vet.json"
    args = ["--causal", "--smallest", "--long", "0", "--dtypes", "float32", "--no-envelope"]
    assert _vet("bf16_state_elu", *args, "--repro", str(repro), "--json", str(out)) == 1
    script = repro / "finding-1.py"
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == f"reproducers: 1 script in {repro} (finding 1): finding-1.py"
    report = json.loads(out.read_text())
    assert [f["reproducer"] for f in report["findings"]] == [str(script)]
    assert report["reproducers"] == {"directory": str(repro), "scripts": {"1": str(script)},
                                     "none": {}}  # fmt: skip
    assert f'TARGET = "{TARGETS}:bf16_state_elu"' in script.read_text()


def test_what_the_kernel_prints_goes_to_a_file_the_summary_names(tmp_path, capfd):
    """Issue 51, item 4: the kernel's prints (Python's stdout and stderr, a write at file
    descriptor 1) reach neither the terminal's stdout nor its stderr; the summary names the
    file and its line count, the verdict and the time line stay the last thing."""
    out = tmp_path / "vet.json"
    args = ["--dtypes", "float32", "--smallest", "--long", "0", "--json", str(out)]
    assert _vet("printing", *args) == 0
    screen = capfd.readouterr()
    assert "kernel" not in screen.err and "kernel says" not in screen.out
    printed = json.loads(out.read_text())["printed"]
    log = Path(printed["file"])
    text = log.read_text().splitlines()
    assert printed["lines"] == len(text) == 3 * text.count("kernel says hello") > 0
    assert {"kernel warns", "kernel writes to fd 1"} <= set(text)
    lines = screen.out.splitlines()
    assert lines[-2] == f"the kernel printed {printed['lines']:,} lines: {log}"
    assert lines[-1].startswith("time: ")
    log.unlink()


@pytest.mark.parametrize(
    ("target", "fix"),
    [("with_state", "--state Sz or S"), ("transposed", "declare --layout bnhd")],
)
def test_a_convention_mismatch_is_one_contract_finding_with_its_fix(target, fix, tmp_path):
    """Issue 51, item 2: a tuple (an undeclared state) or an output in the other layout is
    the contract finding alone on typical inputs, naming the option that fixes it; the
    long-context check, which met the same failure, is listed under it (a case whose H is
    its N cannot tell the layouts apart: a warning on such stress inputs remains)."""
    out = tmp_path / "vet.json"
    assert (
        _vet(target, "--causal", "--dtypes", "float32", "--long", "2048", "--json", str(out)) == 1
    )
    report = json.loads(out.read_text())
    typical = [f for f in report["findings"] if f["regime"] == "typical"]
    assert [f["checks"] for f in typical] == [["contract"]] and fix in typical[0]["headline"]
    long = next(c for c in report["checks"] if c["name"] == "long-context")
    assert long["status"] == "depends" and "the contract's failure" in long["detail"]


@pytest.mark.parametrize(
    ("target", "claim", "first_line"),
    [
        ("upcast", (), "dtype torch.float32, expected torch.float16"),
        ("without_gates", ("--feature-map", "identity", "--causal", "--no-normalize",
                           "--decay", "gates"), "(vet passes g= for the spec identity"),
    ],
)  # fmt: skip
def test_a_wrong_dtype_or_a_rejected_keyword_is_the_contract_finding_alone(
    target, claim, first_line, tmp_path
):
    """Issue 51, item 2: float32 returned for 16-bit and float64 inputs, or a keyword the
    spec passes rejected, is one contract finding saying what was returned or raised (and
    the keyword vet passes); the checks that met it on the same cases (associativity in
    float64 by float32's rounding) are listed under it, none a finding of its own."""
    out = tmp_path / "vet.json"
    args = ["--smallest", "--long", "0", "--json", str(out)]
    assert (
        main(["vet", f"{TARGETS}:{target}", "--feature-map", "elu", *claim, "--quiet", *args]) == 1
    )
    report = json.loads(out.read_text())
    (finding,) = report["findings"]
    assert finding["checks"][0] == "contract" and first_line in finding["headline"]


def test_an_undeclared_dtype_limit_names_the_option_that_declares_it(tmp_path):
    """Issue 51, item 6: a raise on one dtype, every other dtype's panel passing, is the
    contract finding, naming --dtypes with the others; declared so, the verdict passes."""
    out = tmp_path / "vet.json"
    args = ["--smallest", "--long", "0", "--no-envelope"]
    assert _vet("no_float32", *args, "--json", str(out)) == 1
    (finding,) = json.loads(out.read_text())["findings"]
    assert finding["detail"].endswith(
        "declare the dtypes it takes, --dtypes float16 bfloat16 float64)"
    )
    assert _vet("no_float32", *args, "--dtypes", "float16", "bfloat16", "float64") == 0


def test_a_library_claiming_some_dtypes_is_judged_inside_them_and_outside_is_one_line():
    """Issue 51, item 6: an adapter's declared dtypes (Adapter.dtypes, as fla's
    chunk_delta_rule's assert) keep the verdict inside them, scaling included; what the
    kernel does on the others is one line, no finding."""
    from dataclasses import replace

    from linattn_verify.under_test import resolve
    from linattn_verify.vet.runner import VetOptions, vet_in_process
    from tests import vet_targets

    impl = replace(resolve(vet_targets.no_float32, feature_map="elu"), dtypes=("float16",))
    report = vet_in_process(impl, VetOptions(smallest=True, longest=0, envelope=False))
    assert report.verdict == "pass" and report.findings == [], report.summary()
    assert {r["name"] for r in report.rows if r["name"].startswith("accuracy ")} == {
        "accuracy float16"
    }
    (line,) = [x for x in report.summary().splitlines() if x.startswith("outside the claim")]
    assert "(it takes float16)" in line
    assert "bfloat16: meets the contract" in line and "float64: meets the contract" in line
    assert "float32: raised AssertionError: does not support float32" in line


@pytest.mark.parametrize(
    ("target", "claim", "outside", "option"),
    [
        ("small_heads", {"max_head_dim": 16}, "d = 17: raised AssertionError: only support",
         "--max-head-dim 16)"),
        ("even_backward", {"even_dims_backward": True},
         "float16 backward, dv = 3: backward raised AssertionError", "--even-dims-backward)"),
    ],
)  # fmt: skip
def test_a_head_dimension_limit_declared_passes_and_undeclared_names_its_option(
    target, claim, outside, option
):
    """Issue 51, item 6: a correct kernel that raises past its head dimensions (d > 16, as
    fla's fused_chunk_based; odd d or dv in a 16-bit backward, as fla's chunk_bwd_dv) passes
    when it declares them, every check run inside them (scaling at d = 16), and says in one
    line what a call just outside does; undeclared, the raise is a contract finding naming
    the limit the calls show and the option that declares it."""
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.runner import VetOptions, vet_in_process
    from tests import vet_targets

    fn = getattr(vet_targets, target)
    options = VetOptions(smallest=True, longest=0, envelope=False, grad="even" in target)
    declared = vet_in_process(resolve(fn, feature_map="elu", **claim), options)
    assert declared.verdict == "pass" and declared.findings == [], declared.summary()
    (line,) = [x for x in declared.summary().splitlines() if x.startswith("outside the claim")]
    assert outside in line
    undeclared = vet_in_process(resolve(fn, feature_map="elu"), options)
    (finding,) = undeclared.findings
    assert finding.is_contract and finding.detail.endswith(option), undeclared.summary()
    assert finding.headline().startswith("wrong on typical inputs: contract"), finding.headline()


def test_a_kernel_wrong_in_float64_is_one_finding_across_dtypes_checks_and_lengths(tmp_path):
    """Issue 51, item 3: a defect float64 shows is one of every precision, so its failures in
    every dtype, check and length are one finding that lists them; its headline gives the
    figure its body shows, at the element the body names."""
    out = tmp_path / "vet.json"
    args = ["--dtypes", "float16", "float32", "float64", "--smallest", "--long", "2048"]
    assert _vet("ten_percent_high", *args, "--json", str(out)) == 1
    report = json.loads(out.read_text())
    (finding,) = [f for f in report["findings"] if f["regime"] == "typical"]
    assert finding["exact"] and finding["dtypes"] == ["float16", "float32", "float64"]
    assert {"accuracy float16", "accuracy float32", "accuracy float64", "long-context"} <= set(
        finding["checks"]
    )
    assert finding["lengths"] == [["long-context", 1024]]
    shown = next(c for c in report["checks"] if c["detail"] == finding["detail"])
    assert json.loads(shown["case"])["dtype"] == "float64"
    assert finding["relative_error"] == shown["figures"]["relative_error"]
    share = finding["headline"].split("error ")[1].split(" of")[0]
    assert f"= {share} of the output's scale" in finding["detail"]
    at = "({})".format(", ".join(map(str, shown["figures"]["worst_index"])))
    assert f"at {at}" in finding["detail"] and finding["worst"].startswith(
        f"worst element (b, h, i, c) = {at}"
    )


def test_what_a_target_printed_before_it_failed_to_load_is_named(tmp_path, capsys):
    target = tmp_path / "bad.py"
    target.write_text('print("loading my kernel")\nraise ImportError("no such extension")\n')
    assert main(["vet", f"{target}:fn", "--feature-map", "elu", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "ImportError: no such extension (what it printed: " in err
    log = Path(err.split("what it printed: ")[1].split(")")[0])
    assert log.read_text() == "loading my kernel\n"
    log.unlink()


def test_a_raising_implementation_fails_every_check_with_its_message(capsys):
    assert _vet("raising", "--dtypes", "float32") == 1
    out = capsys.readouterr().out
    assert "raised ValueError: this kernel always fails" in out
    assert "verdict: FAIL" in out


def test_a_crashing_implementation_fails_and_vet_survives(capsys):
    start = time.perf_counter()
    assert _vet("crashing", "--timeout", "60") == 1
    out = capsys.readouterr().out
    assert "crashed" in out and "SIGSEGV" in out and "not run" in out
    assert time.perf_counter() - start < 60


def test_a_hanging_implementation_fails_within_the_timeout(capsys):
    start = time.perf_counter()
    assert _vet("hanging", "--timeout", "5") == 1
    elapsed = time.perf_counter() - start
    out = capsys.readouterr().out
    assert "\n  1. hung: contract took longer than 5 s" in out and "verdict: FAIL" in out
    assert "--timeout SECONDS gives each task longer" in out  # how to allow it more
    assert "None" not in out
    assert elapsed < 5 + 30  # the timeout plus starting one worker process


def test_a_biased_sampler_fails_the_random_feature_statistics(tmp_path, capsys):
    out = tmp_path / "vet.json"
    sampler = "tests.zoo.random_features:unit_norm_rows"
    args = ["--dtypes", "float32", "--sampler", sampler, "--claim", "iid", "--long", "0"]
    args += ["--no-envelope", "--json", str(out)]
    assert (
        main(
            ["vet", f"{TARGETS}:performer", "--feature-map", "performer-positive", "--quiet", *args]
        )
        == 1
    )
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["checks"]}
    assert rows["sampler unbiasedness"]["status"] == "fail"
    assert rows["rate"]["status"] == "fail"  # |W| = 1 rows estimate another kernel
    assert all(rows[name]["status"] == "pass" for name in ("contract", "reference", "scaling"))
    # one finding: the sampler, the W it drew, and the rate on its draws
    (finding,) = report["findings"]
    assert finding["kind"] == "sampler" and "rate" in finding["checks"]
    assert finding["headline"].startswith(
        f"sampler: {sampler} (claims iid rows; 4096 draws of W (64, 16) from seed 0) fails "
        "unbiasedness and mse-formula"
    )
    again, rate = finding["reproduces"]
    assert again.startswith(f"python -m linattn_verify random-features --sampler {sampler}")
    assert rate.startswith(f"python -m linattn_verify vet {TARGETS}:performer ")
    assert f"--sampler {sampler} --claim iid --seed 0 --dtypes float32" in rate
    summary = capsys.readouterr().out
    assert "None" not in summary and f"reproduce: {rate}" in summary


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["vet", "no_such_module:f", "--feature-map", "elu"], "cannot import"),
        (["vet", f"{TARGETS}:elu_linear"], "needs --feature-map"),
        (["vet"], "needs TARGET"),
        (["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--timeout", "0"], "--timeout"),
        (["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--sampler", "a:b"], "Performer"),
        (
            [
                "vet",
                f"{TARGETS}:performer",
                "--feature-map",
                "performer-positive",
                "--sampler",
                "no_such_module:draw",
                "--claim",
                "iid",
            ],
            "cannot import",
        ),
        (["vet", "fla.linear-attn-chunk", "--device", "cuda"], "drop --device"),
        (["vet", "fla.based-naive", "--triton", "interpret"], "not Triton code"),
        (["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--tf32"], "--triton interpret"),
        (
            ["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--dot-precision", "fp8"],
            "--dot-precision must be",
        ),
        (["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--long", "100"], "at least"),
        (["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--long", "2" * 14], "GiB"),
        (
            ["vet", f"{TARGETS}:elu_linear", "--feature-map", "elu", "--repro", "pyproject.toml"],
            "not a folder",
        ),
    ],
)
def test_usage_errors_exit_2(args, message, capsys):
    assert main([*args, "--quiet"]) == 2
    assert message in capsys.readouterr().err
