"""`accuracy`: the golden implementation judged against the exact reference."""

from __future__ import annotations

import argparse
import time

from ..accuracy import Judgement
from ..families import golden_forms
from ..report.accuracy import Sweep, sweep_inputs
from ..specs import FEATURE_MAPS, Spec
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "accuracy",
        "judge the golden implementation against the exact reference",
        "Run the golden torch implementation of each spec, causal and not, in each dtype on "
        "seeded random inputs, and judge it with the accuracy model: error in units of u s "
        "(roundoff of the dtype times the output's scale), the a-priori bound, the budget, "
        "pass/fail. Exit 1 if any case fails.",
        [
            "python -m linattn_verify accuracy",
            "python -m linattn_verify accuracy --specs elu softmax --dtypes float16 "
            "--shape 1,2,256,32,32",
        ],
    )
    options.add_specs(parser, "specs to judge")
    options.add_dtypes(parser)
    parser.add_argument(
        "--shape",
        type=options.shape,
        default=(1, 2, 64, 16, 16),
        metavar="B,H,N,d,dv",
        help="the inputs' shape (default 1,2,64,16,16)",
    )
    parser.add_argument("--seed", type=int, default=0)
    options.add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    b, h, n, d, dv = args.shape
    rows, start = [], time.perf_counter()
    specs = args.specs or list(FEATURE_MAPS)
    cases = [(s, c, t) for s in specs for c in (False, True) for t in args.dtypes]
    sweep = Sweep((n,), tuple(args.dtypes), "cpu", b, h, d, dv, args.seed)
    for index, (name, causal, dtype) in enumerate(cases, 1):
        spec = Spec(name, causal=causal)
        q, k, v, w, decay = sweep_inputs(spec, sweep, n, dtype)
        judgement = Judgement.of(q, k, v, w, spec, decay)
        for form, golden in zip(golden_forms(spec), judgement.golden, strict=True):
            rows.append({"form": form, **judgement(golden).to_dict()})
        options.progress(args.quiet, f"[{index}/{len(cases)}] {spec} {dtype}")
    failed = [r for r in rows if not r["passed"]]
    print(
        f"golden implementation vs exact reference, shape B,H,N,d,dv = {b},{h},{n},{d},{dv}, "
        f"seed {args.seed}; errors in units of u s (README, 'The accuracy model')\n"
    )
    print("| spec | form | dtype | max error | p99 | bound at worst | budget | verdict |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['spec']} | {r['form']} | {r['dtype']} | {r['max_error']:.3g} | "
            f"{r['p99_error']:.3g} | {r['bound_at_worst']:.3g} | {r['budget']:.3g} | "
            f"{'pass' if r['passed'] else 'FAIL'} |"
        )
    print(
        f"\n{len(rows) - len(failed)} passed, {len(failed)} failed "
        f"in {time.perf_counter() - start:.1f} s"
    )
    options.write_json(args.json, {"shape": list(args.shape), "seed": args.seed, "cases": rows})
    return 1 if failed else 0
