"""`known-answers`: the known-answer vectors: build, check, or run an implementation on them.
`references`, its former name, still runs it: a deprecated alias, not listed by --help,
that says so in one line on stderr."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .. import known_answers
from . import options

NAME = "known-answers"
FORMER = "references"  # the command's name until issue 49: users' scripts still call it
DESCRIPTION = (
    "The known-answer vectors shipped with the package (linattn_verify/known_answers/; its "
    "README.md says how to read them without this package), or those under --dir: build "
    "regenerates them (the same bytes every time), check verifies every sha256 and "
    "recomputes the outputs with the arb engine (exit 1 naming a bad file), run reports an "
    "implementation's error per vector in units of u s of its dtype. " + options.CONTRACT
)
EXAMPLES = [
    f"python -m linattn_verify {NAME} check",
    f"python -m linattn_verify {NAME} build",
    f"python -m linattn_verify {NAME} run mykernels.py:attn --feature-map elu --causal",
    f"python -m linattn_verify {NAME} run fla.based-naive",
]


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        NAME,
        "known-answer vectors: build, check, or run an implementation on them",
        DESCRIPTION,
        EXAMPLES,
    )
    _arguments(parser)
    parser.set_defaults(func=run)
    # no help=: argparse lists a subcommand under --help only when it has one
    former = sub.add_parser(
        FORMER,
        description=f"Deprecated: the former name of `{NAME}`. " + DESCRIPTION,
        epilog="Examples:\n" + "\n".join(f"  {e}" for e in EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _arguments(former)
    former.set_defaults(func=run_former)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["build", "check", "run"])
    options.add_implementation(parser, positional=True)
    parser.add_argument(
        "--dir", help="the vectors' folder (default: the package's own, from any folder)"
    )
    parser.add_argument("--sample", type=int, help="check: recompute this many (default: all)")
    options.add_output(parser)


def run_former(args: argparse.Namespace) -> int:
    """`references ACTION ...`: one line on stderr, then the command under its name."""
    print(
        f"warning: `{FORMER}` is now `{NAME}` (python -m linattn_verify {NAME} {args.action})",
        file=sys.stderr,
    )
    return run(args)


def run(args: argparse.Namespace) -> int:
    directory = Path(args.dir) if args.dir else known_answers.DEFAULT_DIR
    say = None if args.quiet else (lambda text: options.progress(False, text))
    if args.action == "build":
        if args.dir is None and "site-packages" in known_answers.DEFAULT_DIR.parts:
            raise options.UsageError(
                f"{NAME} build rewrites the installed package's vectors: give --dir"
            )
        start = time.perf_counter()
        manifest = known_answers.build(directory, progress=say)
        size = sum(e["bytes"] for e in manifest["vectors"])
        print(
            f"{len(manifest['vectors'])} vectors, {size / 2**20:.1f} MiB, under {directory} "
            f"in {time.perf_counter() - start:.1f} s"
        )
        options.write_json(args.json, manifest)
        return 0
    if args.action == "check":
        if args.sample is not None and args.sample < 0:
            raise options.UsageError(f"--sample must be >= 0, got {args.sample}")
        problems = known_answers.check(directory, args.sample, progress=say)
        for problem in problems:
            print(f"FAIL {problem}")
        count = len(known_answers.load_manifest(directory)["vectors"])
        done = "all" if args.sample is None else f"up to {args.sample}"
        verdict = f"FAIL ({len(problems)} problem(s))" if problems else f"ok, {done} recomputed"
        print(f"{count} vectors: {verdict}")
        options.write_json(args.json, {"vectors": count, "problems": problems})
        return 1 if problems else 0
    if args.target is None and args.form is None:
        raise options.UsageError(f"{NAME} run needs TARGET (or a built-in --form)")
    impl = options.implementation(args)
    rows = known_answers.run_vectors(impl, directory)
    print(f"{impl.name} claiming {impl.spec}")
    print("| vector | dtype | max error (u s) |\n|---|---|---:|")
    for row in rows:
        figure = row.get("problem") or row.get("skipped") or f"{row['max_error_units']:.3g}"
        print(f"| {row['name']} | {row['dtype']} | {figure} |")
    options.write_json(args.json, {"implementation": impl.name, "vectors": rows})
    return 1 if any("problem" in row for row in rows) else 0
