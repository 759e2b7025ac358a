"""`scaling`: does an implementation's cost grow as it claims?"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..families import default_arguments
from ..implementations import sample_projection_torch
from ..scaling import attention_inputs, plot_scaling, scaling_result
from ..under_test import ImplementationFailure
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "scaling",
        "does an implementation's cost grow as it claims (linear in N)?",
        "Count FLOPs and peak live bytes over N = 256 ... --max-n (exact), fit log-log "
        "slopes over the larger half and check them against the claimed growth (--cost); "
        "with --time, also time it (one thread, noise gate) against torch's SDPA and plot. "
        "Exit 1 when the counted growth is not the claimed one. " + options.CONTRACT,
        [
            "python -m linattn_verify scaling --feature-map elu --causal --time",
            "python -m linattn_verify scaling mykernels.py:linear_attn --feature-map elu",
            "python -m linattn_verify scaling performer-pytorch.linear-attention",
        ],
    )
    options.add_implementation(parser, positional=True)
    parser.add_argument("--max-n", type=int, default=2**16, help="largest N (default 65536)")
    parser.add_argument("--d", type=int, default=64, help="head dimension d = dv (default 64)")
    parser.add_argument("--time", action="store_true", help="also time it and plot")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per N (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", choices=options.DTYPES, default="float32", help="the inputs' dtype (float32)"
    )
    parser.add_argument("--out", default="reports/scaling", help="folder of the plot")
    options.add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    impl = options.implementation(args)
    top = args.max_n.bit_length() - 1
    if top < 10:
        raise options.UsageError(f"--max-n must be at least 1024 to fit a slope, got {args.max_n}")
    if args.repeats < 1 or args.d < 1:
        raise options.UsageError(
            f"--repeats and --d must be positive, got {args.repeats}, {args.d}"
        )
    w = None
    if impl.spec.info.needs_projection:
        generator = torch.Generator().manual_seed(args.seed)
        w = sample_projection_torch(args.d, args.d, "orthogonal", generator)

    def fn(q, k, v):
        return impl(q, k, v, w, default_arguments(impl.spec, q))

    try:  # one small call first: an implementation that fails at all fails here, by name
        fn(*attention_inputs(256, d=args.d, dv=args.d, dtype=args.dtype))
    except ImplementationFailure as err:
        print(f"{impl.name}: {err} on a first small call -> FAIL")
        return 1
    cost_ns = [2**i for i in range(8, top + 1)]
    time_ns = [2**i for i in range(max(8, top - 6), top + 1)] if args.time else None
    options.progress(
        args.quiet, f"counting FLOPs and bytes of {impl.name} over N = 256 ... {2**top}"
    )
    try:
        result = scaling_result(
            impl.name,
            fn,
            impl.cost,
            cost_ns,
            time_ns,
            impl.spec.causal,
            args.repeats,
            d=args.d,
            dv=args.d,
            dtype=args.dtype,
        )
    except (ImplementationFailure, RuntimeError, MemoryError) as err:  # out of memory, say
        print(f"{impl.name}: failed while measured: {err} -> FAIL")
        return 1
    print(f"{impl.name}: {result.growth.message} -> {'pass' if result.growth.passed else 'FAIL'}")
    if result.timing is not None:
        t = result.timing
        print(
            f"time ~ N^{t.fit.slope:.2f} over N={t.ns[len(t.ns) // 2]}..{t.ns[-1]} ({t.status}"
            f"{': ' + t.reason if t.reason else ''}); crossover vs SDPA: "
            f"{result.crossover_vs_sdpa or 'none measured'}"
        )
        Path(args.out).mkdir(parents=True, exist_ok=True)
        timed = {impl.name: t} | ({"sdpa": result.sdpa_timing} if result.sdpa_timing else {})
        png = plot_scaling(timed, {impl.name: result.costs}, Path(args.out) / "scaling.png")
        print(f"plot: {png}")
    options.write_json(args.json, result.summary())
    return 0 if result.growth.passed else 1
