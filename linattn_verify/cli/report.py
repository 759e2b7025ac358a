"""`report`: the error and scaling report, Markdown, JSON and plots."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..families import default_arguments
from ..implementations import sample_projection_torch
from ..jsonable import dumps
from ..report import (
    SCHEMA,
    ReportOptions,
    compare,
    counts,
    make_plan,
    publish,
    render,
    run_report,
    staging,
    units,
    write_json_atomically,
)
from ..scaling import attention_inputs
from ..specs import FEATURE_MAPS
from ..under_test import Implementation, ImplementationFailure
from ..under_test.claim import CLAIM
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "report",
        "the error and scaling report: Markdown, JSON and plots",
        "Judge every form of every spec in every dtype against the exact reference (errors in "
        "units of u s, bound, budget), with accuracy vs N and the denominators' margins; the "
        "project's random-feature samplers (unbiasedness, MSE vs theory); counted cost growth and "
        "timings against SDPA. With TARGET (--impl) or --form, one implementation instead of the "
        "built-in forms, of any spec vet takes (scaled, unnormalised, decayed, the delta rule: "
        "its decay and beta drawn as vet's checks draw them). Writes report.md, report.json and "
        "PNG plots to --out, atomically (a failed run leaves the previous report as it was); "
        "README 'The report' gives the time of a run. Exit 0 when everything passes, 1 on a "
        "failed judgement or a regression against --compare, 2 on usage errors. "
        + options.CONTRACT,
        [
            "python -m linattn_verify report",
            "python -m linattn_verify report --specs elu performer-positive --dtypes float16",
            "python -m linattn_verify report --compare reports/baseline/report.json",
            "python -m linattn_verify report --impl mykernels.py:attn --feature-map elu \\",
            "    --causal --out reports/mykernel",
            "python -m linattn_verify report --impl fla.based-naive --out reports/fla-based",
            "python -m linattn_verify report --form chunked --causal --feature-map identity \\",
            "    --no-normalize --scale d^-0.5 --decay gates --out reports/gla",
        ],
    )
    parser.add_argument("--full", action="store_true", help="the wide sweep (N to 1024, all timed)")
    options.add_specs(parser, "built-in specs to report")
    options.add_dtypes(parser)
    parser.add_argument("--device", help="cpu or cuda (default: cpu, and cuda when present)")
    options.add_implementation(parser, positional=False)
    parser.add_argument("--out", default="reports/latest", help="folder (default reports/latest)")
    parser.add_argument("--compare", metavar="OLD.json", help="report regressions against it")
    parser.add_argument(
        "--no-grad", action="store_true", help="skip the gradients (a forward-only implementation)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every input (default 0)")
    options.add_output(parser)
    parser.set_defaults(func=run)


def _options(args: argparse.Namespace) -> ReportOptions:
    """ReportOptions from the arguments; UsageError for a bad combination."""
    impl = None
    if args.target is not None or args.form is not None:
        impl = options.implementation(args)
        if args.specs is not None:
            raise options.UsageError("--specs chooses built-in specs; --impl reports its own claim")
        options.triton_check(impl, args.device)
    else:
        defaults = {o.name: o.default for o in CLAIM}
        given = [
            f
            for f in ("feature_map", "causal", "eps", "layout", "cost", "chunk_size")
            if getattr(args, f) not in (None, False, defaults.get(f))
        ]
        if given:
            flag = given[0].replace("_", "-")
            raise options.UsageError(f"--{flag} describes --impl or --form, and neither is given")
    options.cuda_check(args.device)
    if args.device is None:
        devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    else:
        devices = (args.device,)
    return ReportOptions(
        specs=tuple(dict.fromkeys(args.specs or FEATURE_MAPS)),
        dtypes=tuple(dict.fromkeys(args.dtypes)),
        devices=devices,
        full=args.full,
        seed=args.seed,
        impl=impl,
        grad=not args.no_grad,
    )


def _old_report(path: str) -> dict[str, Any]:
    """An earlier report.json for --compare, or a UsageError that says what is wrong."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise options.UsageError(f"--compare {path}: cannot read a report: {err}") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise options.UsageError(f"--compare {path}: not a report.json of this tool ({SCHEMA!r})")
    return document


def _probe(impl: Implementation, device: str) -> str | None:
    """One small float32 call (N = 16, d = dv = 16; a decay and beta as the scaling runs
    give them, families.default_arguments) before the run: why the implementation fails at all,
    or None."""
    w = None
    if impl.spec.info.needs_projection:
        w = sample_projection_torch(16, 16, "orthogonal", torch.Generator().manual_seed(0))
        w = w.to(device)
    q, k, v = attention_inputs(16, d=16, dv=16, device=device)
    try:
        impl(q, k, v, w, default_arguments(impl.spec, q))
    except ImplementationFailure as err:
        return f"{impl.name} {err}"
    return None


LINE_EVERY = 30.0  # seconds between progress lines when stderr is not a terminal


class _Lines:
    """Progress as a line on stderr at most every LINE_EVERY seconds ("report: 12/40 units,
    42 s: accuracy elu float16"), for a log file."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.done = total, quiet, 0
        self.start = self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        self.done += 1
        now = time.monotonic()
        if self.quiet or (now - self.last < LINE_EVERY and self.done < self.total):
            return
        self.last = now
        elapsed = now - self.start
        print(f"report: {self.done}/{self.total} units, {elapsed:.0f} s: {what}", file=sys.stderr)


_TERMINATED: list[int] = []  # the SIGTERMs received (_terminate)


def _terminate(signum: int, frame) -> None:
    """SIGTERM's handler: exit 128 + signum, and remember it, so that an exit raised where
    an exception is ignored (a callback of a C library) still stops the report unpublished."""
    _TERMINATED.append(signum)
    sys.exit(128 + signum)


def run(args: argparse.Namespace) -> int:
    report_options = _options(args)
    old = _old_report(args.compare) if args.compare else None
    if args.json:
        options.check_writable(Path(args.json))
    plan = make_plan(report_options)
    if report_options.impl is not None and (
        failure := _probe(report_options.impl, report_options.devices[0])
    ):
        print(f"error: {failure}; no report written", file=sys.stderr)
        return 1
    out = Path(args.out)
    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C: the staging folder is removed and
    # the previous report stays as it was
    signal.signal(signal.SIGTERM, _terminate)
    with staging(out) as folder:
        total = units(report_options, plan)
        # a bar on a terminal; redirected to a file, a plain line now and then (a bar's
        # carriage returns would make one line of the whole run)
        bar_shown = not args.quiet and sys.stderr.isatty()
        with tqdm(total=total, disable=not bar_shown, file=sys.stderr) as bar:
            lines = _Lines(total, quiet=args.quiet or bar_shown)

            def step(done: str) -> None:
                bar.set_postfix_str(done, refresh=False)
                bar.update()
                lines(done)

            document = run_report(report_options, folder, step)
        document = json.loads(dumps(document))  # the form --compare reads back (str keys)
        comparison = compare(old, document, args.compare) if old is not None else None
        if comparison is not None:
            document["comparison"] = comparison.to_dict()
        (folder / "report.json").write_text(dumps(document))
        (folder / "report.md").write_text(render(document, comparison and comparison.markdown()))
        if _TERMINATED:  # a SIGTERM whose SystemExit a library's callback swallowed
            sys.exit(128 + _TERMINATED[0])
        publish(folder, out)
    if args.json:
        write_json_atomically(Path(args.json), document)
    print(
        f"report: {out / 'report.md'} (+ report.json, plots); verdict {document['verdict']}: "
        f"{counts(document)}; {document['environment']['seconds']:.0f} s"
    )
    regressed = bool(comparison and comparison.regressions)
    if comparison is not None:
        print("\n".join(comparison.markdown()[2:]))
    return 1 if document["verdict"] != "pass" or regressed else 0
