"""`random-features`: the statistics of a projection sampler."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..stats import CLAIMS, builtin_sampler, check_sampler
from ..stats.plot import plot_attention_error_vs_m, plot_mse_vs_m
from ..target import load_target
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "random-features",
        "statistics of a projection sampler: unbiasedness, MSE, orthogonal features",
        "Check a sampler of Performer projections W (m, d): the kernel estimators of "
        "performer-positive, -hyperbolic and -trig are unbiased, and their MSE matches "
        "Lemma 2 of Choromanski et al. 2021 (claim iid) or the exact MSE of orthogonal rows "
        "with chi(d) norms, below the iid one (claim orthogonal). Each assertion fails a "
        "correct sampler with probability 1e-10. Without --sampler, the project's own. The "
        "sampler is sampler(m, d, generator) -> W, drawing from the torch.Generator.",
        [
            "python -m linattn_verify random-features",
            "python -m linattn_verify random-features --sampler mysampler.py:draw --claim iid",
            "python -m linattn_verify random-features --plots reports/random_features",
        ],
    )
    parser.add_argument("--sampler", help="module:function or path.py:function under test")
    parser.add_argument("--claim", choices=["iid", "orthogonal"], help="what its rows are")
    parser.add_argument("--d", type=int, default=16, help="dimension of the rows (default 16)")
    parser.add_argument("--m", type=int, default=64, help="rows per draw (default 64)")
    parser.add_argument("--replicates", type=int, default=4096, help="draws (default 4096)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plots", help="also write plots of the project's samplers here")
    options.add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sampler:
        if args.claim is None:
            raise options.UsageError("--sampler needs --claim iid or --claim orthogonal")
        runs = [(args.sampler, load_target(args.sampler), args.claim)]
    else:
        runs = [(f"lv.sample_projection_torch {c}", builtin_sampler(c), c) for c in CLAIMS]
    sizes = (("--d", args.d, 1), ("--m", args.m, 1), ("--replicates", args.replicates, 2))
    for name, value, least in sizes:
        if value < least:
            raise options.UsageError(f"{name} must be >= {least}, got {value}")
    if args.replicates < 1000:
        options.progress(
            args.quiet,
            "note: below 1000 replicates the stated false-failure "
            "probabilities do not hold (normal approximation)",
        )
    payload: dict[str, Any] = {"samplers": []}
    failed = False
    for name, sampler, claim in runs:
        options.progress(
            args.quiet,
            f"{name} (claims {claim}): {args.replicates} draws of ({args.m}, {args.d}) ...",
        )
        results = check_sampler(
            sampler, claim, args.d, args.m, args.replicates, args.seed, args.sampler
        )
        print(f"{name}, claimed {claim}:")
        for r in results:
            print(f"  {'pass' if r.passed else 'FAIL'}  {r.check}: {r.message}")
            if not r.passed and r.repro:
                print(f"        reproduce: {r.repro}")
        failed |= not all(r.passed for r in results)
        payload["samplers"].append(
            {"sampler": name, "claim": claim, "checks": [r.to_dict() for r in results]}
        )
    if args.plots:
        out = Path(args.plots)
        options.progress(args.quiet, f"plots under {out} ...")
        payload["plots"] = {
            "mse_vs_m": plot_mse_vs_m(out / "mse_vs_m.png", seed=args.seed),
            "attention_error_vs_m": plot_attention_error_vs_m(
                out / "attention_error_vs_m.png", seed=args.seed
            ),
        }
        print(f"plots: {out / 'mse_vs_m.png'}, {out / 'attention_error_vs_m.png'}")
    print(f"verdict: {'FAIL' if failed else 'pass'}")
    payload["verdict"] = "fail" if failed else "pass"
    options.write_json(args.json, payload)
    return 1 if failed else 0
