"""The generated blocks of README.md and docs/: every example output and table of figures
there is pasted between two lines, <!-- NAME --> and <!-- /NAME -->, by the command that
produced it, so that none is typed by hand or left stale.

    python scripts/doc_blocks.py                    # list the blocks: where, cheap or not
    python scripts/doc_blocks.py --update [NAME...] # rerun and paste (default: every block)
    python scripts/doc_blocks.py --check [NAME...]  # rerun and compare (default: the cheap)

A block is cheap when it reruns in seconds: tests/test_doc_blocks.py checks those on every
run. The others (a vet run, the report's figure) are refreshed with --update when what they
show changes. The report's excerpts are computed by the report's own code (report.build's
plan, report.accuracy, report.gradients, report.markdown) on the rows they show: the same
seeded inputs as `python -m linattn_verify report`, so the same figures as a full run. The
adapters' table is not here: `make readme-verdicts` writes it (tests/test_adapter_verdicts.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
COLUMNS = "100"  # argparse and pytest wrap to the terminal's width: fixed, so output repeats


@dataclass(frozen=True)
class Block:
    name: str
    path: str  # the file that holds it, from the repository's root
    cheap: bool  # reruns in seconds: the test suite checks it
    make: Callable[[], str]
    # what a rerun may change without the block being stale (a time), replaced before
    # comparing: a pattern's match, or its group 1 where it has one
    volatile: tuple[str, ...] = ()


def _run(args: list[str], cwd: Path = ROOT, check: bool = True, timeout: float = 900) -> str:
    env = {**os.environ, "COLUMNS": COLUMNS, "CI": "true", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode not in (0, 1):
        raise RuntimeError(f"{shlex.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def _console(command: str, output: str) -> str:
    return f"```console\n$ {command}\n{output.rstrip()}\n```"


# --- the report's excerpts --------------------------------------------------------------

SUMMARY_ROWS = (  # the README's: one row per kind of finding the paragraph below it names
    ("elu (causal)", "chunked"),
    ("performer-trig (causal)", "chunked"),
    ("taylor (causal)", "recurrent"),
)
EXCERPT_ROWS = (  # docs/report.md's: the rows its paragraph discusses
    ("elu (causal)", "quadratic"),
    ("elu (causal)", "recurrent"),
    ("elu (causal)", "chunked"),
    ("performer-trig (causal)", "chunked"),
    ("taylor (causal)", "quadratic"),
    ("taylor (causal)", "recurrent"),
    ("taylor (causal)", "chunked"),
)
GRADIENT_ROWS = tuple(
    (spec, form)
    for spec in ("elu (causal)", "performer-positive (causal)", "taylor (causal)")
    for form in ("quadratic", "recurrent", "chunked")
)


@functools.cache
def _report_rows() -> tuple[list[dict], list[dict]]:
    """The report's accuracy rows at its largest N and its gradient rows, for the specs the
    excerpts show, as `python -m linattn_verify report` computes them (CPU, seed 0)."""
    from linattn_verify.cli.options import DTYPES  # the report command's default
    from linattn_verify.report.accuracy import Sweep, accuracy_rows
    from linattn_verify.report.build import DEFAULT_NS, ReportOptions, make_plan
    from linattn_verify.report.gradients import gradient_rows
    from linattn_verify.specs import FEATURE_MAPS

    judged = {s for s, _ in SUMMARY_ROWS + EXCERPT_ROWS}
    graded = judged | {s for s, _ in GRADIENT_ROWS}
    names = tuple(n for n in FEATURE_MAPS if any(s.startswith(f"{n} (") for s in graded))
    options = ReportOptions(specs=names, dtypes=tuple(DTYPES), devices=("cpu",))
    sweep = Sweep((max(DEFAULT_NS),), options.dtypes, "cpu", h=1, seed=options.seed)
    rows, gradients = [], []
    for spec, impls in make_plan(options).groups:
        if str(spec) in judged:
            rows += accuracy_rows(spec, impls, sweep, lambda _: None)[0]
        if str(spec) in graded:
            gradients += gradient_rows(spec, impls, sweep, lambda _: None)
    return rows, gradients


def _pick(lines: list[str], wanted: tuple[tuple[str, str], ...]) -> str:
    """The table's header and the rows of `wanted` (spec, form), in the table's order."""
    keep = {f"| {spec} | {form} |" for spec, form in wanted}
    body = [line for line in lines[2:] if any(line.startswith(k) for k in keep)]
    assert len(body) == len(wanted), (wanted, lines)
    return "\n".join(lines[:2] + body)


def report_summary(wanted: tuple[tuple[str, str], ...]) -> str:
    from linattn_verify.report.markdown import summary_table

    return _pick(summary_table(*_report_rows()), wanted)


def report_gradients() -> str:
    from linattn_verify.report.markdown import _gradients

    lines = _gradients({"gradients": {"rows": _report_rows()[1]}})
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("| spec")) :]
    return _pick(table, GRADIENT_ROWS)


def report_figure() -> str:
    """Run the default report and copy its error_vs_n.png to docs/img (the block holds the
    image's line)."""
    with tempfile.TemporaryDirectory() as tmp:
        _run([PYTHON, "-m", "linattn_verify", "report", "--out", f"{tmp}/report", "--quiet"])
        shutil.copyfile(f"{tmp}/report/error_vs_n.png", ROOT / "docs/img/report_error_vs_n.png")
    return (
        "![max error against N: a panel per feature map and dtype, each fast form with its "
        "budget and a-priori bound](img/report_error_vs_n.png)"
    )


# --- other commands ---------------------------------------------------------------------

ACCURACY = ["accuracy", "--specs", "softmax", "elu", "--dtypes", "float16", "bfloat16", "float32"]


def accuracy_excerpt() -> str:
    """The table of `accuracy` (its first line, the shape and seed, is in the page's text;
    its last, a count and a time, left out)."""
    out = _run([PYTHON, "-m", "linattn_verify", *ACCURACY, "--quiet"])
    return "\n".join(line for line in out.splitlines() if line.startswith("|"))


def cli_help() -> str:
    out = _run([PYTHON, "-m", "linattn_verify", "--help"])
    return _console("python -m linattn_verify --help", out)


PYTEST = [
    "properties/test_causality.py",
    "--impl",
    "tests.zoo.broken:causal_mask_off_by_one",
    "--feature-map",
    "elu",
    "--causal",
    "-q",
    "--tb=line",
]


def pytest_example() -> str:
    """A kernel whose causal mask lets query i see key i + 1 (the zoo's), under the property
    suite: the failure's message, case and reproduce line, and pytest's summary."""
    out = _run([PYTHON, "-m", "pytest", *PYTEST, "-p", "no:cacheprovider"]).splitlines()
    first = next(i for i, line in enumerate(out) if line.startswith("E   AssertionError"))
    shown = [out[0], "...", *out[first : first + 3]]
    shown += ["...", out[-1]]
    return _console(f"pytest {shlex.join(PYTEST)}", "\n".join(shown))


def pytest_options() -> str:
    """The pytest plugin's options (and the property suite's own), from `pytest --help`."""
    out = _run([PYTHON, "-m", "pytest", "--help", "-p", "no:cacheprovider"]).splitlines()
    start = out.index("linattn-verify:")
    end = next(i for i in range(start, len(out)) if not out[i].strip())
    return "```text\n" + "\n".join(out[start:end]) + "\n```"


def walkthrough_kernel() -> str:
    return "```python\n" + (ROOT / "docs/examples/mykernels.py").read_text().rstrip() + "\n```"


def vet_walkthrough() -> dict[str, str]:
    """docs/vet.md's walkthrough: vet on docs/examples/mykernels.py, the reproduce line
    with --save, and numpy on the saved case."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copyfile(ROOT / "docs/examples/mykernels.py", Path(tmp) / "mykernels.py")
        vet = "vet mykernels.py:attn --feature-map elu --dtypes float32 --long 0 --quiet"
        out = _run([PYTHON, "-m", "linattn_verify", *shlex.split(vet)], cwd=Path(tmp))
        reproduce = next(
            line.strip().removeprefix("reproduce: ")
            for line in out.splitlines()
            if line.strip().startswith("reproduce: python -m linattn_verify check reference")
        )
        check = reproduce.removeprefix("python ") + " --save case.npz"
        saved = _run([PYTHON, *shlex.split(check)], cwd=Path(tmp))
        script = (ROOT / "docs/examples/find_the_bug.py").read_text()
        found = _run([PYTHON, "find_the_bug.py"], cwd=_with(Path(tmp), "find_the_bug.py", script))
    return {
        "vet-walkthrough-vet": _console(f"python -m linattn_verify {vet}", out),
        "vet-walkthrough-check": _console(f"python {check}", saved),
        "vet-walkthrough-python": "```python\n"
        + script.rstrip()
        + "\n```\n\n"
        + _console("python find_the_bug.py", found),
    }


def _with(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder


VET_EXAMPLE = "vet tests.zoo.textbook:elu_cumsum --feature-map elu --causal"


def vet_example() -> str:
    """The README's vet run: the textbook causal elu+1 kernel with cumulative sums, vet's
    default plan (about a minute)."""
    out = _run([PYTHON, "-m", "linattn_verify", *shlex.split(VET_EXAMPLE), "--quiet"])
    return _console(f"python -m linattn_verify {VET_EXAMPLE}", out)


def bench_vet() -> str:
    """benchmarks/bench_vet.py's table (some ten minutes: run it with nothing else running)."""
    return _run([PYTHON, "benchmarks/bench_vet.py"]).rstrip()


TRITON_KERNEL = (
    "vet tests.zoo.triton_kernels:triton_chunked --feature-map identity --causal "
    "--no-normalize --triton interpret --smallest --dtypes float32 --tf32"
)


def triton_tf32(declared: bool) -> str:
    """docs/triton.md's TF32 example: the zoo's chunk kernel in Triton's interpreter with TF32
    products, undeclared (the finding names them) and declared (seconds)."""
    command = TRITON_KERNEL + " --dot-precision tf32" * declared
    out = _run([PYTHON, "-m", "linattn_verify", *shlex.split(command), "--quiet"])
    return _console(f"python -m linattn_verify {command}", out)


def bench_triton() -> str:
    """benchmarks/bench_triton.py's table (some 40 minutes: nothing else running)."""
    return _run([PYTHON, "benchmarks/bench_triton.py"], timeout=4 * 3600).rstrip()


# docs/vet.md's table of where each check applies: a column a claim, the vet arguments
# that make it (every one with APPLIES_ALWAYS, so that what those options add shows)
APPLIES_TARGET = "mykernels.py:attn"
APPLIES_ALWAYS = "--grad --kat"
APPLIES_COLUMNS = (
    f"{APPLIES_TARGET} --feature-map elu",
    f"{APPLIES_TARGET} --feature-map elu --causal --varlen",
    "--form chunked --feature-map elu --causal --state",
    f"{APPLIES_TARGET} --feature-map performer-positive",
    f"{APPLIES_TARGET} --feature-map softmax --causal",
    f"{APPLIES_TARGET} --feature-map identity --causal --no-normalize --decay gates --state S",
    f"{APPLIES_TARGET} --feature-map identity --causal --no-normalize --scale d^-0.5 "
    "--decay channel-gates --state S",
    f"{APPLIES_TARGET} --feature-map identity --causal --no-normalize --scale d^-0.5 "
    "--delta-rule --decay gates --value-heads 2 --varlen",
    f"{APPLIES_TARGET} --feature-map identity --causal --no-normalize --family iplr --state S",
    f"{APPLIES_TARGET} --feature-map identity --causal --no-normalize --decay gates --step S",
    f"{APPLIES_TARGET} --feature-map relu --causal --triton interpret --smallest",
)


def applicability_table() -> str:
    """Where each check applies, from vet's own rules (vet.applicability) on the claims of
    APPLIES_COLUMNS: a row a check, a column a claim; a reason (not applicable, skipped)
    given once, by number, below the table."""
    from linattn_verify.cli import vet as vet_cli
    from linattn_verify.vet import applicability

    columns = []
    for argv in APPLIES_COLUMNS:
        args = vet_cli.parse(shlex.split(f"{argv} {APPLIES_ALWAYS}"))
        impl, options = vet_cli.planned(args, load=args.target is None)  # a form's stream
        columns.append(applicability(impl, options))
    names = list(dict.fromkeys([*_every_task(), *(n for found in columns for n in found)]))
    reasons: dict[tuple[str, str], int] = {}

    def cell(found: dict[str, tuple[str, str]], name: str) -> str:
        if name not in found:
            return "–"
        status, detail = found[name]
        if status == "runs":
            return f"yes, N to {detail}" if detail else "yes"
        detail = detail.replace(f"{ROOT}{os.sep}", "")  # a path from the repository's root
        number = reasons.setdefault((status, detail), len(reasons) + 1)
        return f"{'no' if status == 'not applicable' else 'skipped'} ({number})"

    letters = [chr(ord("A") + i) for i in range(len(columns))]
    lines = [f"| check | {' | '.join(letters)} |", "| --- |" + " :-: |" * len(columns)]
    lines += [f"| {n} | {' | '.join(cell(c, n) for c in columns)} |" for n in names]
    lines += ["", f"The columns, each with `{APPLIES_ALWAYS}`:", ""]
    lines += [f"- {x}: `vet {a}`" for x, a in zip(letters, APPLIES_COLUMNS, strict=True)]
    legend = (
        "yes: in the plan (N to: its longest length); –: not in this claim's plan; no, skipped:"
    )
    lines += ["", f"{legend} why, by number:", ""]
    lines += [f"{i}. {status}: {detail}" for (status, detail), i in reasons.items()]
    return "\n".join(lines)


def _every_task() -> list[str]:
    """The names of vet's plan in its order, with every option and kind of task on."""
    from linattn_verify.specs import Spec
    from linattn_verify.vet import VetOptions, plan

    spec = Spec("performer-positive", causal=True)  # a projection: the rate's task
    whole = {"spec": spec, "cost": "linear", "triton": "interpret", "not_applicable": {}}
    options = VetOptions(kat=True, grad=True, sampler="m:draw", claim="iid")
    return [task.name for task in plan(whole, options)]


_walkthrough = functools.cache(vet_walkthrough)
TIME = r"in \d+(?:\.\d+)?s"  # pytest's summary line ends with the run's time
# The float64 cell of a Performer row: torch's float64 exp, sin and cos differ in the last
# bits between CPUs' vector units (AVX2, AVX-512), and so do those rows' float64 errors
PERFORMER_FLOAT64 = r"(?m)^\| performer-[^|]*\|(?:[^|]*\|){4}([^|]*)\|"

BLOCKS = {
    b.name: b
    for b in (
        Block(
            "report-summary",
            "README.md",
            True,
            lambda: report_summary(SUMMARY_ROWS),
            volatile=(PERFORMER_FLOAT64,),
        ),
        Block("pytest-example", "README.md", True, pytest_example, volatile=(TIME,)),
        Block("vet-example", "README.md", False, vet_example, volatile=(r"time: .*",)),
        Block("bench-vet", "docs/performance.md", False, bench_vet),
        Block(
            "triton-tf32",
            "docs/triton.md",
            False,
            lambda: triton_tf32(False),
            volatile=(r"time: .*",),
        ),
        Block(
            "triton-tf32-declared",
            "docs/triton.md",
            False,
            lambda: triton_tf32(True),
            volatile=(r"time: .*",),
        ),
        Block("bench-triton", "docs/performance.md", False, bench_triton),
        Block(
            "report-excerpt",
            "docs/report.md",
            True,
            lambda: report_summary(EXCERPT_ROWS),
            volatile=(PERFORMER_FLOAT64,),
        ),
        Block(
            "report-gradients",
            "docs/gradients.md",
            True,
            report_gradients,
            volatile=(PERFORMER_FLOAT64,),
        ),
        Block("report-figure", "docs/report.md", False, report_figure),
        Block("accuracy-excerpt", "docs/accuracy.md", True, accuracy_excerpt),
        Block("cli-help", "docs/cli.md", True, cli_help),
        Block("pytest-options", "docs/properties.md", True, pytest_options),
        Block("vet-walkthrough-kernel", "docs/vet.md", True, walkthrough_kernel),
        Block("vet-applicability", "docs/vet.md", True, applicability_table),
        *(
            Block(name, "docs/vet.md", False, lambda name=name: _walkthrough()[name])
            for name in ("vet-walkthrough-vet", "vet-walkthrough-check", "vet-walkthrough-python")
        ),
    )
}
MARKER = re.compile(r"^<!-- ([a-z0-9-]+) -->$\n(.*?)^<!-- /\1 -->$", re.M | re.S)


def current(block: Block) -> str:
    """What the file holds between the block's markers."""
    text = (ROOT / block.path).read_text()
    found = {m.group(1): m.group(2) for m in MARKER.finditer(text)}
    if block.name not in found:
        raise SystemExit(f"{block.path}: no <!-- {block.name} --> ... <!-- /{block.name} -->")
    return found[block.name].rstrip("\n")


def paste(block: Block, content: str) -> None:
    path = ROOT / block.path
    text = path.read_text()
    start, end = f"<!-- {block.name} -->\n", f"<!-- /{block.name} -->"
    head, rest = text.split(start)
    _, tail = rest.split(end)
    path.write_text(f"{head}{start}{content}\n{end}{tail}")


def same(block: Block, a: str, b: str) -> bool:
    for pattern in block.volatile:
        a, b = _blanked(pattern, a), _blanked(pattern, b)
    return a.strip() == b.strip()


def _blanked(pattern: str, text: str) -> str:
    """text with each match of pattern, or its group 1 where it has one, as <volatile>."""

    def blank(match: re.Match) -> str:
        if not match.re.groups:
            return "<volatile>"
        start, end = (i - match.start() for i in match.span(1))
        return match.group(0)[:start] + "<volatile>" + match.group(0)[end:]

    return re.sub(pattern, blank, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--update", nargs="*", metavar="NAME", help="rerun and paste")
    what.add_argument("--check", nargs="*", metavar="NAME", help="rerun and compare")
    args = parser.parse_args(argv)
    if args.update is None and args.check is None:
        for b in BLOCKS.values():
            print(f"{b.name:24} {b.path:20} {'cheap' if b.cheap else 'expensive'}")
        return 0
    chosen = args.update if args.update is not None else args.check
    default = [n for n, b in BLOCKS.items() if args.update is not None or b.cheap]
    unknown = sorted(set(chosen) - set(BLOCKS))
    if unknown:
        parser.error(f"no such block: {', '.join(unknown)} (known: {', '.join(BLOCKS)})")
    stale = []
    for name in chosen or default:
        block = BLOCKS[name]
        made, held = block.make(), current(block)
        if args.update is not None:
            paste(block, made)
            print(f"{block.path}: {name} {'unchanged' if same(block, made, held) else 'written'}")
        elif not same(block, made, held):
            stale.append(name)
            print(f"{block.path}: {name} is stale: python scripts/doc_blocks.py --update {name}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
