"""The command line: help, the reference and accuracy commands, errors as exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

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
    with pytest.raises(SystemExit) as exit_:
        main(["accuracy", "--specs", "gelu"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "invalid choice: 'gelu'" in err and len(err.splitlines()) == 1


IMPLS = """
import torch


def linear(q, k, v):
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    z = phi_k.sum(-2, keepdim=True).transpose(-2, -1)
    return (phi_q @ (phi_k.transpose(-2, -1) @ v)) / (phi_q @ z)


def materialising(q, k, v):
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    a = phi_q @ phi_k.transpose(-2, -1)
    return (a @ v) / a.sum(-1, keepdim=True)


def raising(q, k, v):
    raise RuntimeError("kernel exploded")
"""


def _scaling(tmp_path, target, *extra):
    (tmp_path / "impls.py").write_text(IMPLS)
    return main(
        [
            "scaling",
            f"{tmp_path / 'impls.py'}:{target}",
            "--feature-map",
            "elu",
            "--max-n",
            "1024",
            "--d",
            "8",
            "--json",
            str(tmp_path / "s.json"),
            "--quiet",
            *extra,
        ]
    )


def test_scaling_passes_a_linear_implementation_from_a_file(tmp_path, capsys):
    assert _scaling(tmp_path, "linear") == 0
    summary = json.loads((tmp_path / "s.json").read_text())
    assert abs(summary["flops_slope"] - 1) < 0.05 and summary["cost_passed"]
    assert "-> pass" in capsys.readouterr().out


def test_scaling_fails_a_quadratic_impostor(tmp_path, capsys):
    assert _scaling(tmp_path, "materialising") == 1
    out = capsys.readouterr().out
    assert "FLOPs grow as N^2.00" in out and "-> FAIL" in out


def test_scaling_reports_a_raising_implementation(tmp_path, capsys):
    assert _scaling(tmp_path, "raising") == 1
    assert "raised RuntimeError: kernel exploded" in capsys.readouterr().out


def test_scaling_with_a_bad_target_is_a_usage_error(tmp_path, capsys):
    assert main(["scaling", "no_such_module_xyz:fn", "--feature-map", "elu"]) == 2
    assert "cannot import 'no_such_module_xyz'" in capsys.readouterr().err
    assert main(["scaling", "nocolon"]) == 2


def test_scaling_times_and_plots_the_built_in(tmp_path, capsys):
    code = main(
        [
            "scaling",
            "--feature-map",
            "elu",
            "--causal",
            "--time",
            "--max-n",
            "1024",
            "--d",
            "8",
            "--repeats",
            "3",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "time ~ N^" in out and "crossover vs SDPA" in out
    assert (tmp_path / "scaling.png").read_bytes()[:4] == b"\x89PNG"


SAMPLERS = """
import torch


def gaussian(m, d, generator):
    return torch.randn(m, d, generator=generator, dtype=torch.float64)


def unit_rows(m, d, generator):
    w = torch.randn(m, d, generator=generator, dtype=torch.float64)
    return w / w.norm(dim=1, keepdim=True)
"""


def _random_features(tmp_path, *extra):
    path = tmp_path / "samplers.py"
    path.write_text(SAMPLERS)
    return main(["random-features", "--quiet", "--replicates", "1024", *extra])


def test_random_features_passes_a_gaussian_sampler_from_a_file(tmp_path, capsys):
    out = tmp_path / "rf.json"
    target = f"{tmp_path / 'samplers.py'}:gaussian"
    assert (
        _random_features(tmp_path, "--sampler", target, "--claim", "iid", "--json", str(out)) == 0
    )
    payload = json.loads(out.read_text())
    assert payload["verdict"] == "pass"
    (run,) = payload["samplers"]
    assert run["claim"] == "iid" and len(run["checks"]) == 12
    assert {c["name"] for c in run["checks"]} == {"unbiasedness", "mse-formula"}
    assert "verdict: pass" in capsys.readouterr().out


def test_random_features_fails_unit_norm_rows(tmp_path, capsys):
    target = f"{tmp_path / 'samplers.py'}:unit_rows"
    assert _random_features(tmp_path, "--sampler", target, "--claim", "iid") == 1
    out = capsys.readouterr().out
    assert "FAIL  unbiasedness" in out and "verdict: FAIL" in out
    assert f"reproduce: python -m linattn_verify random-features --sampler {target}" in out


def test_random_features_usage_errors(tmp_path, capsys):
    target = f"{tmp_path / 'samplers.py'}:gaussian"
    assert _random_features(tmp_path, "--sampler", target) == 2
    assert "needs --claim" in capsys.readouterr().err
    assert _random_features(tmp_path, "--sampler", "no_such_module:f", "--claim", "iid") == 2
    assert "cannot import" in capsys.readouterr().err
    assert _random_features(tmp_path, "--m", "0") == 2
    assert "--m must be >= 1" in capsys.readouterr().err


def test_report_progress_off_a_terminal_is_whole_lines(monkeypatch, capsys):
    from linattn_verify.cli import report

    lines = report._Lines(total=3, quiet=False)
    for what in ("a", "b", "c"):
        lines(what)  # within LINE_EVERY of the start: only the last unit is said
    err = capsys.readouterr().err
    assert err.endswith("\n") and "\r" not in err
    assert err.splitlines() == [err.splitlines()[0]] and err.startswith("report: 3/3 units, ")
    monkeypatch.setattr(report, "LINE_EVERY", 0.0)
    every = report._Lines(total=2, quiet=False)
    every("x"), every("y")
    assert [line.split(": ")[-1] for line in capsys.readouterr().err.splitlines()] == ["x", "y"]
