"""The command line: help, the reference and accuracy commands, errors as exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from linattn_verify.cli import main


def test_help_lists_the_commands():
    result = subprocess.run(
        [sys.executable, "-m", "linattn_verify", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "reference" in result.stdout and "accuracy" in result.stdout
    assert "Examples" in result.stdout


def test_reference_from_a_file_writes_the_output(tmp_path, capsys):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 2, 5, 3))
    np.savez(tmp_path / "in.npz", q=q, k=k, v=v)
    out, summary = tmp_path / "out.npz", tmp_path / "s.json"
    code = main(
        [
            "reference",
            str(tmp_path / "in.npz"),
            "--feature-map",
            "softmax",
            "--causal",
            "--out",
            str(out),
            "--json",
            str(summary),
            "--quiet",
        ]
    )
    assert code == 0
    with np.load(out) as f:
        ref = f["out"]
    # row 0 of causal attention attends to key 0 only
    np.testing.assert_array_equal(ref[:, :, 0], v[:, :, 0])
    assert json.loads(summary.read_text())["spec"] == "softmax (causal)"


def test_reference_with_a_missing_array_is_a_usage_error(tmp_path, capsys):
    np.savez(tmp_path / "in.npz", q=np.zeros((1, 1, 2, 2)))
    code = main(["reference", str(tmp_path / "in.npz"), "--feature-map", "elu"])
    assert code == 2
    assert "lacks arrays ['k', 'v']" in capsys.readouterr().err


def test_reference_with_bad_values_names_them(tmp_path, capsys):
    nan = np.full((1, 1, 2, 2), np.nan)
    np.savez(tmp_path / "in.npz", q=nan, k=nan, v=nan)
    assert main(["reference", str(tmp_path / "in.npz"), "--feature-map", "elu"]) == 2
    assert "q has a non-finite value nan" in capsys.readouterr().err


def test_accuracy_runs_and_writes_json(tmp_path, capsys):
    path = tmp_path / "acc.json"
    code = main(
        [
            "accuracy",
            "--specs",
            "elu",
            "softmax",
            "--dtypes",
            "float16",
            "--shape",
            "1,1,8,4,2",
            "--json",
            str(path),
            "--quiet",
        ]
    )
    assert code == 0
    cases = json.loads(path.read_text())["cases"]
    assert len(cases) == 2 * 3  # elu: 2 causal x 2 forms, softmax: 2 causal x quadratic
    assert all(c["passed"] and c["dtype"] == "float16" for c in cases)
    assert "| elu (causal) | linear | float16 |" in capsys.readouterr().out


def test_accuracy_with_an_unknown_spec_is_a_usage_error(capsys):
    assert main(["accuracy", "--specs", "gelu"]) == 2
    assert "unknown feature map 'gelu'" in capsys.readouterr().err
