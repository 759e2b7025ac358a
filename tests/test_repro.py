"""vet --repro (vet/repro.py): the reproducers of three zoo entries and of one fla adapter of
a Triton kernel leave the suite. vet runs in process on each buggy zoo kernel, loaded from a
copy of its zoo module in a package of its own (which imports no linattn_verify); the fla
kernel is judged by the reference check on a small case (in Triton's interpreter, as CI has
no GPU). Each script then runs in an interpreter where linattn_verify cannot be imported: on
the buggy kernel it exits non-zero with an AssertionError naming the element, with --impl
its corrected twin it exits 0."""

from __future__ import annotations

import importlib.util
import inspect
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from linattn_verify.cases import Case
from linattn_verify.checks import CHECKS
from linattn_verify.under_test import resolve
from linattn_verify.vet import VetOptions, VetReport, vet_in_process
from linattn_verify.vet.repro import write_reproducers
from tests.zoo import ZOO

FLA_TRITON = importlib.util.find_spec("fla") and importlib.util.find_spec("triton")

ZOO_DIR = Path(__file__).parent / "zoo"
PACKAGE = "repro_zoo"  # the copy's name: the kernels' own library, as a user's would be
ENTRY_IMPORTS = "# The entry modules import Entry from here"  # where Entry's module ends
# (the buggy kernel, its corrected twin): a bug each that shows on the smallest case
KERNELS = (
    ("delta:kda_gate_after", "delta:kda_recurrent"),
    ("gla:gla_exclusive", "gla:gla_recurrent"),
    ("broken:anti_causal_mask", "textbook:elu_cumsum"),
)
# one interpreter with torch imported and linattn_verify made unimportable; each run a
# fork of it (its own process, exit code and output), the script run as __main__; the runs
# side by side (an fla script imports fla for seconds), their exit codes printed in order
RUNNER = """
import json, os, runpy, sys
sys.modules["linattn_verify"] = None
import torch
pids = []
for number, argv in enumerate(json.loads(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        with open(f"run-{number}.txt", "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            sys.argv = argv
            try:
                runpy.run_path(argv[0], run_name="__main__")
                code = 0
            except BaseException:
                sys.excepthook(*sys.exc_info())
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    pids.append(pid)
for pid in pids:
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.fixture
def kernels(tmp_path, monkeypatch):
    """The directory holding PACKAGE: the zoo modules the kernels are in, copied, with
    Entry's part of the zoo's __init__ (the rest imports every entry module)."""
    package = tmp_path / "kernels" / PACKAGE
    package.mkdir(parents=True)
    init = (ZOO_DIR / "__init__.py").read_text()
    (package / "__init__.py").write_text(init[: init.index(ENTRY_IMPORTS)])
    for module in {k.split(":")[0] for pair in KERNELS for k in pair}:
        shutil.copy(ZOO_DIR / f"{module}.py", package)
    monkeypatch.syspath_prepend(str(package.parent))
    yield package.parent
    for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
        del sys.modules[name]


def _claims(name: str) -> dict:
    """What the zoo entry of kernel `name` claims, as resolve's keywords."""
    entry = next(e for e in ZOO if getattr(e.fn, "__name__", None) == name)
    return dict(feature_map=entry.feature_map, causal=entry.causal, eps=entry.eps,
                decay=entry.decay, normalize=entry.normalize, scale=entry.scale,
                delta_rule=entry.delta_rule)  # fmt: skip


def _run(runs: list[list[str]], where: Path) -> list[tuple[int, str]]:
    """(exit code, output) of each run's argv, in the RUNNER's interpreter."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", RUNNER, json.dumps(runs)],
        cwd=where, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    codes = [int(line) for line in done.stdout.split()]
    return [(c, (where / f"run-{i}.txt").read_text()) for i, c in enumerate(codes)]


def test_reproducers_fail_on_the_bug_and_pass_on_its_twin(kernels: Path, tmp_path: Path):
    options = VetOptions(dtypes=("float32", "float64"), envelope=False, longest=0,
                         long_grad=0, smallest=True)  # fmt: skip
    runs, expected = [], []
    for buggy, twin in KERNELS:
        impl = resolve(f"{PACKAGE}.{buggy}", **_claims(buggy.split(":")[1]))
        report = vet_in_process(impl, options)
        written = write_reproducers(report, impl, tmp_path / buggy.replace(":", "-"), kernels)
        assert written.scripts, f"{buggy}: no reproducer\n{report.summary()}"
        number, script = next(iter(written.scripts.items()))  # the first finding's
        assert "linattn_verify" not in script.read_text().split('"""')[2]  # past its docstring
        assert script.with_suffix(".pt").is_file()
        row = next(r for r in report.rows if r.get("worst") == report.findings[number - 1].worst)
        element = ", ".join(map(str, row["figures"]["worst_index"]))
        runs += [[str(script)], [str(script), "--impl", f"{PACKAGE}.{twin}"]]
        expected.append((buggy, twin, element))
    results = _run(runs, tmp_path)
    for (buggy, twin, element), failed, passed in zip(expected, results[::2], results[1::2]):
        code, output = failed
        assert code != 0, f"{buggy}'s reproducer passes on it:\n{output}"
        named = rf"AssertionError: out\[{element}\] \(b, h, i, c\) = .* > tolerance"
        assert re.search(named, output), output
        code, output = passed
        assert code == 0, f"{buggy}'s reproducer fails on {twin}:\n{output}"
        assert f"out[{element}] (b, h, i, c)" in output and output.rstrip().endswith(": ok"), output


def test_a_finding_without_a_judged_case_has_no_script(tmp_path: Path):
    """A cost has no case: no script, and the summary line says so."""
    row = {"name": "scaling", "status": "fail", "cause": "cost", "detail": "FLOPs grow as N^2",
           "figures": {}}  # fmt: skip
    report = VetReport("mod:fn", "mod:fn", "elu", rows=[row])
    impl = resolve("mod:fn", feature_map="elu", load=False)
    written = write_reproducers(report, impl, tmp_path / "out")
    assert not written.scripts and written.none == {1: "a cost"}
    none = "1 finding has none (1: a cost)"
    assert written.summary() == f"reproducers: no script in {tmp_path / 'out'}; {none}"
    assert not list((tmp_path / "out").iterdir())


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")
def test_an_adapter_gets_a_script_where_it_calls_its_library_function_as_is(tmp_path: Path):
    """fla.based-naive's function is fla's naive_parallel_based itself: the script loads it
    from fla's file; fla.gla-naive wraps its call (gk=g, [0]): no script, and why."""
    case = Case(b=1, h=2, n=5, d=4, dv=3, dtype="float32", seed=3)
    for name, script in (("fla.based-naive", True), ("fla.gla-naive", False)):
        impl = resolve(name)
        row = CHECKS["reference"](impl, case).to_dict()
        figures = {**row["figures"], "worst_index": [0, 1, 4, 2], "worst_exact": 0.5,
                   "worst_output": 0.25}  # fmt: skip
        row |= {"status": "fail", "severity": "wrong", "worst": "(0, 1, 4, 2)", "figures": figures}
        report = VetReport(name, name, str(impl.spec), rows=[row], claimed=impl.spec)
        written = write_reproducers(report, impl, tmp_path / name)
        if script:
            text = written.scripts[1].read_text()
            assert re.search(r'^TARGET = ".*/fla/ops/based/naive\.py:naive_parallel_based"$',
                             text, re.MULTILINE), text  # fmt: skip
        else:
            assert not written.scripts and "code of its own" in written.none[1]


def fused_recurrent_linear_attn(q, k, v, normalize=False):
    """fla's fused_recurrent_linear_attn as a maintainer would correct it: the normaliser
    with its eps added in float32. fla adds `+ 1e-10` in the input dtype
    (fla/ops/linear_attn/utils.py), 0 in float16, so a row with q . z = 0 is 0/0 = NaN there.
    fla's kernel runs unnormalised; the division is this function's."""
    from fla.ops.linear_attn import fused_recurrent_linear_attn as fla_kernel

    o, state = fla_kernel(q, k, v, normalize=False)
    if not normalize:
        return o, state
    scale = q.shape[-1] ** -0.5
    z = (q.float() * scale * k.float().cumsum(1)).sum(-1, keepdim=True) + 1e-10
    return (o.float() / z).to(o.dtype), state


@pytest.mark.skipif(not FLA_TRITON, reason="fla-core or triton is not installed")
def test_an_fla_triton_kernel_reproducer_fails_on_it_and_passes_on_its_twin(tmp_path: Path):
    """fla.linear-attn-fused-recurrent in float16: NaN where relu(q) is all 0 and the exact
    value is 0. Its script calls fla's kernel through the adapter's code around it (relu
    features, normalize=True) and runs it in Triton's interpreter (no GPU here); with --impl
    fla's kernel corrected (the eps in float32, fused_recurrent_linear_attn above), 0."""
    case = Case(b=1, h=1, n=1, d=1, dv=1, dtype="float16", seed=4)  # q < 0 < k
    impl = resolve("fla.linear-attn-fused-recurrent")
    row = CHECKS["reference"](impl, case).to_dict()
    assert row["status"] == "fail" and math.isnan(row["figures"]["worst_output"]), row
    report = VetReport(impl.name, impl.name, str(impl.spec), rows=[row], claimed=impl.spec)
    written = write_reproducers(report, impl, tmp_path / "fla")
    script = written.scripts[1]
    text = script.read_text()
    assert "linattn_verify" not in text.split('"""', 2)[2]  # past its docstring
    assert "return kernel(torch.relu(q), torch.relu(k), v, normalize=True)[0]" in text
    assert 'DEVICE = "cuda" if torch.cuda.is_available() else "cpu"' in text
    twin = tmp_path / "fixed.py"
    twin.write_text(inspect.getsource(fused_recurrent_linear_attn))
    element = ", ".join(map(str, row["figures"]["worst_index"]))
    failed, passed = _run(
        [[str(script)], [str(script), "--impl", f"{twin}:fused_recurrent_linear_attn"]], tmp_path
    )
    code, output = failed
    assert code != 0, f"the reproducer passes on fla's kernel:\n{output}"
    assert f"AssertionError: out[{element}] (b, h, i, c) = nan, exact 0: not finite" in output
    code, output = passed
    assert code == 0, f"the reproducer fails on the corrected kernel:\n{output}"
    assert f"out[{element}] (b, h, i, c) = 0.0, exact 0: error 0 <= inf: ok" in output, output
