"""The value of the delta rule's a-priori bound (families/delta/bound.py) in float32 on
typical inputs at long N: the largest bound over the output, as a share of the output's
scale (bound u), and the time it takes.

    python benchmarks/bench_delta_bound.py [--ns 4096 65536] [--d 64]

Inputs: the checks' typical case (Case.arguments: q ~ N(0, 1), unit-norm keys, v ~ N(0, 1),
beta ~ U(0, 1), gates of mean -1/16, channel gates four octaves apart), B = H = 1, d = dv.
A share below 1 is a bound that says something; a componentwise bound by absolute values
would be (1 + beta)^N. Prints Markdown.
"""

from __future__ import annotations

import argparse
import os
import time

from linattn_verify.families import case_arguments

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    import numpy as np

    from linattn_verify.accuracy.bound import scale_and_bound
    from linattn_verify.cases import Case
    from linattn_verify.families import validate
    from linattn_verify.families.delta.fields import DELTA_DECAYS
    from linattn_verify.specs import RSQRT_D, Spec

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs="+", default=[2**12, 2**16])
    parser.add_argument("--d", type=int, default=64)
    args = parser.parse_args()
    print("| decay | N | d | largest bound u (share of the scale) | median | time |")
    print("|---|---|---|---|---|---|")
    u = 2.0**-24
    for decay in DELTA_DECAYS:
        spec = Spec("identity", True, normalize=False, scale=RSQRT_D, decay=decay, delta_rule=True)
        for n in args.ns:
            q, k, v, _, packed = case_arguments(Case(1, 1, n, args.d, args.d, "float32"), spec)
            x = validate(q, k, v, spec, None, packed)
            start = time.perf_counter()
            _, bound = scale_and_bound(x, spec, None, u)
            took = time.perf_counter() - start
            share = bound * u
            print(
                f"| {decay or 'none'} | {n} | {args.d} | {np.max(share):.3g} | "
                f"{np.median(share):.3g} | {took:.1f} s |"
            )


if __name__ == "__main__":
    main()
