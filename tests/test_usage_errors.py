"""Every bad input a newcomer tries is one line on stderr and exit code 2 (the command line),
or one pytest usage error before any test runs (the plugin)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from linattn_verify.cli import main

TARGET = f"{Path(__file__).with_name('vet_targets.py')}:elu_linear"
CASE = '{"b":1,"h":1,"n":3,"d":2,"dv":2,"dtype":"float32"}'
CHECK_ELU = ["check", "reference", "--impl", TARGET, "--feature-map", "elu"]
BAD = {
    "unknown feature map": ["vet", TARGET, "--feature-map", "nosuch"],
    "unknown dtype": ["report", "--dtypes", "float8"],
    "malformed shape": ["reference", "--random", "a,b"],
    "missing claim": ["check", "reference", "--impl", TARGET],
    "missing target file": ["check", "reference", "--impl", "nosuch.py:f", "--feature-map", "elu"],
    "missing function": ["vet", f"{TARGET}x", "--feature-map", "elu"],
    "no target": ["vet"],
    "unknown spec": ["accuracy", "--specs", "gelu"],
    "save without a case": [*CHECK_ELU, "--save", "c.npz"],
    "save where no file can go": [*CHECK_ELU, "--case", CASE, "--save", "/no/such/dir/c.npz"],
    "bad case": [*CHECK_ELU, "--case", "{"],
    "no vectors there": ["known-answers", "check", "--dir", "/no/such/dir"],
    "unknown check": ["check", "nosuch", "--impl", TARGET, "--feature-map", "elu"],
    "unimportable module": ["check", "layout", "--impl", "no_such:fn", "--feature-map", "elu"],
    "check that does not apply": ["check", "causality", "--feature-map", "elu"],  # non-causal
    "unknown form": ["check", "layout", "--feature-map", "elu", "--form", "bogus"],
    "chunk size of a target": [*CHECK_ELU, "--chunk-size", "8"],
    "layout of a built-in form": ["check", "layout", "--feature-map", "elu", "--layout", "bnhd"],
    "no examples": [*CHECK_ELU, "--examples", "0"],
    "fractional length": [*CHECK_ELU, "--case", CASE.replace('"n":3', '"n":3.5')],
    "negative seed": [*CHECK_ELU, "--case", CASE.replace("}", ',"seed":-1}')],
}


@pytest.mark.parametrize("args", BAD.values(), ids=BAD.keys())
def test_a_bad_input_is_one_line_and_exit_2(args, capsys):
    try:
        code = main([*args, "--quiet"] if args[0] != "reference" else args)
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2, captured
    assert len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("error: "), (
        captured.err
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--impl", "nosuch.py:f", "--feature-map", "elu"], "target file nosuch.py does not exist"),
        (["--impl", TARGET], "needs --feature-map NAME"),
        (["--impl", TARGET, "--feature-map", "elu", "--scale", "abc"], "--scale must be a number"),
        (["--long", "-1"], "--long must be 0 (skip) or at least 1024, got -1"),
    ],
)
def test_a_bad_plugin_option_is_a_usage_error_before_any_test(tmp_path, options, message):
    (tmp_path / "test_mine.py").write_text(
        "def test_it(attention_under_test):\n    assert attention_under_test.spec\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage-error code
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ERROR: ") and message in line and "test_it" not in done.stdout
