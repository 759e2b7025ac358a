"""Speed of the exact reference engines (the foundation issue's target: elu, B=H=1,
N=4096, d=dv=64, non-causal and causal, <= 10 s on one core).

    python benchmarks/bench_reference.py [--json PATH]

Times the arb engine on the target case (median of 3) and the mpmath engine at small N,
extrapolated to N=4096 by its N^2 cost (fitted on the measured points). Prints Markdown.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from timing import median_seconds

from linattn_verify.families import validate
from linattn_verify.families.kernelised.reference import KERNELISED
from linattn_verify.reference.arb import arb_attention
from linattn_verify.reference.mp import mp_attention
from linattn_verify.specs import Spec

TARGET_N, D = 4096, 64
MP_NS = (16, 32, 64)


def _inputs(n: int, spec: Spec):
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 1, n, D))
    return validate(q, k, v, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    rows = []
    for causal in (False, True):
        spec = Spec("elu", causal=causal)
        x = _inputs(TARGET_N, spec)
        arb_s = median_seconds(
            lambda x=x, spec=spec: arb_attention(x, spec, KERNELISED), 3, warmup=False
        )
        mp_points = []
        for n in MP_NS:
            xs = _inputs(n, spec)
            mp_points.append(
                (
                    n,
                    median_seconds(
                        lambda xs=xs, spec=spec: mp_attention(xs, spec, KERNELISED), 1, warmup=False
                    ),
                )
            )
        # cost ~ c N^2: least squares for c on the measured points
        ns, ts = np.array(mp_points).T
        c = float(np.sum(ts * ns**2) / np.sum(ns**4))
        rows.append(
            {
                "case": f"elu {'causal' if causal else 'non-causal'} N={TARGET_N} d=dv={D}",
                "arb_seconds": arb_s,
                "mp_seconds_measured": mp_points,
                "mp_seconds_extrapolated": c * TARGET_N**2,
            }
        )
    print("| case | arb engine (s) | mpmath engine (s, extrapolated N^2) | mpmath measured |")
    print("|---|---:|---:|---|")
    for r in rows:
        measured = ", ".join(f"N={n}: {t:.2f} s" for n, t in r["mp_seconds_measured"])
        print(
            f"| {r['case']} | {r['arb_seconds']:.2f} | {r['mp_seconds_extrapolated']:.0f} | "
            f"{measured} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
