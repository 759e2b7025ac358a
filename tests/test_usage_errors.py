"""Every bad input a newcomer tries is one line on stderr and exit code 2 (the command line),
or one pytest usage error before any test runs (the plugin)."""

from __future__ import annotations

import subprocess
import sys
import time
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


EDITS_ITSELF = '''
from pathlib import Path

import linattn_verify as lv

HERE = Path(__file__)
LOADED = HERE.read_text()


def attn(q, k, v):
    """elu linear attention that edits its own file on its first call ({edit}) and, as
    Triton's interpreter reading an edited kernel's source by line, raises once its file
    is not the one it was loaded from."""
    if HERE.read_text() != LOADED:
        raise KeyError("_chunk_gla_h")
    if {edit}:
        HERE.write_text(LOADED + "# edited while vet ran\\n")
    return lv.attention(q, k, v, "elu", form="linear")
'''


@pytest.mark.parametrize("edit", [True, False])
def test_a_kernel_file_edited_while_vet_runs_is_named_not_judged(tmp_path, capsys, edit):
    """Issue 51, item 9: a kernel whose file is edited while vet runs raised in every later
    case, reported as the kernel's failure. A failure after its file changed is a usage
    error naming the file (exit 2); the same kernel left alone passes."""
    kernel = tmp_path / "kernel.py"
    kernel.write_text(EDITS_ITSELF.format(edit=edit))
    args = ["vet", f"{kernel}:attn", "--feature-map", "elu", "--dtypes", "float32"]
    code = main([*args, "--long", "0", "--no-envelope", "--quiet"])
    out, err = capsys.readouterr()
    if not edit:
        assert code == 0, out
        return
    assert code == 2, out
    (line,) = err.strip().splitlines()
    head, at = line.split(" (at ")
    assert head == f"error: the kernel's file {kernel.resolve()} changed while vet ran", line
    assert at == f"{time.strftime('%H:%M:%S', time.localtime(kernel.stat().st_mtime))}): rerun vet"
    assert "verdict" not in out  # no verdict on a kernel that changed under it


def test_the_file_of_a_module_target_is_watched_too():
    from linattn_verify.under_test import resolve
    from linattn_verify.vet.worker import kernel_files

    impl = resolve("tests.vet_targets:elu_linear", feature_map="elu").load()
    assert list(kernel_files(impl)) == [str(Path(TARGET.split(":")[0]).resolve())]
    assert kernel_files(resolve(form="linear", feature_map="elu").load()) == {}
