"""`reference`: the exact output for given or random inputs."""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..families import exact, validate
from ..report.accuracy import Sweep, sweep_inputs
from ..specs import FEATURE_MAPS, Spec
from . import options


def add(sub) -> None:
    parser = options.command_parser(
        sub,
        "reference",
        "exact attention output for given or random inputs (.npz)",
        "Compute the exact reference output (float64, within one ulp). inputs.npz holds "
        "arrays q, k (B,H,N,d), v (B,H,N,dv) and, for Performer maps, projection (m,d); any "
        "float dtype, taken exactly.",
        [
            "python -m linattn_verify reference inputs.npz --feature-map softmax --out ref.npz",
            "python -m linattn_verify reference --random 1,1,4096,64,64 --feature-map elu --causal",
        ],
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("input", nargs="?", help=".npz file with q, k, v [, projection]")
    source.add_argument(
        "--random", type=options.shape, metavar="B,H,N,d,dv", help="random N(0,1) inputs"
    )
    parser.add_argument(
        "--feature-map",
        required=True,
        choices=list(FEATURE_MAPS),
        metavar="NAME",
        help="the spec: " + ", ".join(FEATURE_MAPS),
    )
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--eps", type=float, default=0.0, help="denominator eps (default 0)")
    parser.add_argument(
        "--engine",
        choices=("auto", "mp", "arb", "certified"),
        default="auto",
        help="certified: float64 with a rigorous bound per element (within 2^-34 of its "
        "scale, not correctly rounded), for long N",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    parser.add_argument("--out", help="write the output to this .npz (array 'out')")
    options.add_output(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    spec = Spec(args.feature_map, causal=args.causal, eps=args.eps)
    if args.input:
        try:
            with np.load(args.input) as f:
                arrays = {name: f[name] for name in f.files}
        except (OSError, ValueError) as err:
            raise options.UsageError(f"cannot read {args.input}: {err}") from None
        missing = {"q", "k", "v"} - set(arrays)
        if missing:
            raise options.UsageError(f"{args.input} lacks arrays {sorted(missing)} (need q, k, v)")
        tensors = arrays["q"], arrays["k"], arrays["v"], arrays.get("projection")
    else:
        b, h, n, d, dv = args.random
        sweep = Sweep((n,), ("float64",), "cpu", b, h, d, dv, args.seed)
        tensors = sweep_inputs(spec, sweep, n, "float64")
    x = validate(*tensors[:3], spec, tensors[3])
    options.progress(args.quiet, f"computing the exact {spec} reference for shape {x.shape} ...")
    start = time.perf_counter()
    out = exact(x, spec, args.engine)
    seconds = time.perf_counter() - start
    if args.out:
        np.savez(args.out, out=out)
    print(
        f"{spec}: exact output {out.shape} in {seconds:.2f} s"
        + (f" -> {args.out}" if args.out else "")
    )
    summary = {
        "spec": str(spec),
        "shape_B_H_Nq_Nk_d_dv": list(x.shape),
        "engine": args.engine,
        "seconds": seconds,
        "output": args.out,
        "undefined_0_over_0": int(np.isnan(out).sum()),
    }
    options.write_json(args.json, summary)
    return 0
