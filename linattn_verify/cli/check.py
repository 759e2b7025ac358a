"""`check`: one property check (or all) on one case, or a search for a failure."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..accuracy.bound import feature_model
from ..cases import Case
from ..checks import ALL_CHECKS, CHECKS, GRAD_CHECKS, not_applicable
from ..checks.saved import save_case
from ..checks.search import CHECK_EXAMPLES, search_regimes
from ..vet import VetOptions
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "check",
        "run one property check (or all) on one case, or search for a failure",
        "Run a check of linattn_verify.checks on an implementation: on one case (--case, "
        "the JSON a failing check prints), or over the regime's corner cases and --examples "
        "cases drawn by the property suite's strategies, shrinking the first failure. Exit "
        "1 on a failure. Checks: "
        + ", ".join(CHECKS)
        + "; of the backward: "
        + ", ".join(GRAD_CHECKS)
        + ". "
        + options.CONTRACT,
        [
            "python -m linattn_verify check causality --form chunked --feature-map elu --causal",
            "python -m linattn_verify check all --impl mykernels.py:attn --feature-map elu",
            "python -m linattn_verify check reference --impl fla.based-naive",
            "python -m linattn_verify check reference --form linear --feature-map elu \\",
            '    --case \'{"b":1,"h":2,"n":7,"d":4,"dv":3,"dtype":"float16"}\' --save case.npz',
        ],
    )
    parser.add_argument(
        "name",
        choices=[*CHECKS, *GRAD_CHECKS, "all"],
        metavar="NAME",
        help="a check, or all (the forward checks)",
    )
    options.add_implementation(parser, positional=False)
    parser.add_argument("--case", help="the case as JSON (printed by a failing check)")
    parser.add_argument(
        "--save",
        metavar="FILE.npz",
        help="with --case: write its q, k, v (and projection), the output and the exact "
        "reference to this .npz file (numpy.load reads it)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        help="cases to search per regime (default: "
        + ", ".join(f"{n} {regime}" for regime, n in CHECK_EXAMPLES.items())
        + ")",
    )
    parser.add_argument("--device", default="cpu", help="device of the searched cases")
    options.add_policy(parser)
    options.add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    impl = options.implementation(args)
    case = Case.from_json(args.case) if args.case else None
    device = case.device if case is not None else args.device
    options.cuda_check(device)
    if case is not None and (case.m is not None) != impl.spec.info.needs_projection:
        need = "needs" if impl.spec.info.needs_projection else "takes no"
        raise options.UsageError(f'--case: {impl.spec} {need} "m" (the projection\'s rows)')
    if args.save is not None:
        if case is None:
            raise options.UsageError("--save needs --case (the case to write out)")
        options.check_writable(Path(args.save), "--save")
    if args.examples is not None and args.examples < 1:
        raise options.UsageError(f"--examples must be >= 1, got {args.examples}")
    if args.name != "all" and (reason := not_applicable(args.name, impl)):
        raise options.UsageError(f"{args.name} does not apply: {reason}")
    budgets = (
        CHECK_EXAMPLES if args.examples is None else dict.fromkeys(CHECK_EXAMPLES, args.examples)
    )
    failing = VetOptions(fail_on=args.fail_on, strict=args.strict).failing_regimes
    results, rows = [], []
    with feature_model("relative" if args.strict else "standard"):
        for name in list(CHECKS) if args.name == "all" else [args.name]:
            if reason := not_applicable(name, impl):
                print(f"{name}: not applicable: {reason}")
                rows.append({"name": name, "status": "not applicable", "detail": reason})
            elif case is not None:
                results.append(ALL_CHECKS[name](impl, case))
            else:
                options.progress(
                    args.quiet, f"{name}: the corner cases, then searched cases by regime ..."
                )
                found, searched = search_regimes(name, impl, budgets, device, shrink=True)
                if found is None:
                    counts = ", ".join(f"{n} {regime}" for regime, n in searched.items())
                    detail = f"no failure in the corner cases and {counts} searched cases"
                    print(f"{name}: pass: {detail}")
                    rows.append({"name": name, "status": "pass", "detail": detail})
                else:
                    results.append(found)
    for result in results:
        print(result.report())
        if not result.passed and result.regime not in failing:
            print(
                f"  a robustness warning ({result.regime} inputs): --fail-on {result.regime} fails"
            )
    rows += [r.to_dict() for r in results]
    if args.save is not None:
        print(save_case(impl, case, Path(args.save)))
    options.write_json(
        args.json, {"implementation": impl.name, "spec": str(impl.spec), "checks": rows}
    )
    # a by-nature result (relu's zero denominator) is the spec's, not the implementation's
    bad = [r for r in results if not r.passed and not r.by_nature and r.regime in failing]
    return 1 if bad else 0
