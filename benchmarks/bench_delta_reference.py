"""Speed and peak memory of the delta rule's certified float64 engine beside a plain float64
recurrence of the same size (the target: within ~3x of it, B = H = 1, d = dv = 64, N = 2^16
to 2^20, one thread).

    python benchmarks/bench_delta_reference.py [--max-n 1048576] [--repeats 3] [--json PATH]

Inputs: q, k ~ N(0, 1) rounded to float32, normalised inside (qk_l2norm), v ~ N(0, 1),
beta ~ U(0, 1), log-gates ~ -U(0, 0.1) (per token, or per key channel). Per case, each in a
fresh process (its peak resident memory above what it held with the inputs made): the
median time of `repeats` runs of families.certified (the float64 recurrence, its
bounds and arb for rows it cannot certify; one run at 2^20) and of the plain recurrence (S <-
D S; u = beta (v - S^T k); S <- S + k u^T; o = c S^T q, all in numpy float64), their ratio,
the largest bound as a share of the scale, and the rows handed to arb. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

D = 64
NS = (2**16, 2**20)
DECAYS = ("none", "gates", "channel-gates")


def _inputs(n: int, decay: str):
    import numpy as np
    import torch

    from linattn_verify.families import validate
    from linattn_verify.families.delta.inputs import pack_delta
    from linattn_verify.specs import RSQRT_D, Spec

    kind = None if decay == "none" else decay
    spec = Spec("identity", True, normalize=False, scale=RSQRT_D, decay=kind, delta_rule=True,
                qk_l2norm=True)  # fmt: skip
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 1, 1, n, D)).astype(np.float32)
    beta = torch.tensor(rng.uniform(0, 1, (1, 1, n)))
    g = {"none": None, "gates": (1, 1, n), "channel-gates": (1, 1, n, D)}[decay]
    g = None if g is None else torch.tensor(-rng.uniform(0, 0.1, g))
    return validate(q, k, v, spec, None, pack_delta(beta, g)), spec


def _plain(x, spec):
    """The recurrence in numpy float64, token by token (the baseline)."""
    import numpy as np

    q, k = (t[0, 0] / np.sqrt(np.sum(t[0, 0] ** 2, -1, keepdims=True) + 1e-6) for t in (x.q, x.k))
    v, beta, c = x.v[0, 0], x.beta[0, 0], spec.scale_for(D)
    e = None if x.decay is None else np.exp(x.decay[0, 0])
    s, out = np.zeros((D, D)), np.empty_like(v)
    for t in range(v.shape[0]):
        if e is not None:
            s = s * (e[t] if e.ndim == 1 else e[t][:, None])
        u = beta[t] * (v[t] - k[t] @ s)
        s = s + np.outer(k[t], u)
        out[t] = c * (q[t] @ s)
    return out


def _one(engine: str, n: int, decay: str, repeats: int) -> dict:
    """Time one engine on one case in this process (the child's side)."""
    import resource
    import statistics
    import time

    import numpy as np
    from threadpoolctl import threadpool_limits

    from linattn_verify.families.delta.reference import certified_delta

    x, spec = _inputs(n, decay)
    with open("/proc/self/statm") as f:  # resident pages now, not the peak of the set-up
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    times, extra = [], {}
    with threadpool_limits(1):
        for _ in range(repeats):
            start = time.perf_counter()
            got = certified_delta(x, spec) if engine == "certified" else _plain(x, spec)
            times.append(time.perf_counter() - start)
    if engine == "certified":
        extra = {
            "max_bound_share": float(np.max(got.bound / got.scale)),
            "recomputed_rows": got.recomputed,
        }
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {"seconds": statistics.median(times), "peak_mib_above_inputs": peak / 1024, **extra}


def _run(engine: str, n: int, decay: str, repeats: int) -> dict:
    """_one in a fresh process, so that its peak memory is its own."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", engine, str(n), decay, str(repeats)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=int, default=max(NS))
    parser.add_argument("--repeats", type=int, default=3, help="runs per case below 2^20")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, n, decay, repeats = args.child
        print(json.dumps(_one(engine, int(n), decay, int(repeats))))
        return
    rows = []
    for n in (m for m in NS if m <= args.max_n):
        for decay in DECAYS:
            repeats = 1 if n >= 2**20 else args.repeats
            certified = _run("certified", n, decay, repeats)
            plain = _run("plain", n, decay, repeats)
            ratio = certified["seconds"] / plain["seconds"]
            case = {"n": n, "decay": decay, "repeats": repeats}
            rows.append({**case, "certified": certified, "plain": plain, "ratio": ratio})
            print(f"N=2^{n.bit_length() - 1} {decay}: {rows[-1]['ratio']:.2f}x", file=sys.stderr)
    print("| case (B=H=1, d=dv=64, one thread) | certified (s) | plain (s) | ratio | peak MiB "
          "(certified / plain) | largest bound / s | rows to arb |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c, p = r["certified"], r["plain"]
        print(
            f"| N=2^{r['n'].bit_length() - 1}, {r['decay']} (median of {r['repeats']}) | "
            f"{c['seconds']:.2f} | {p['seconds']:.2f} | {r['ratio']:.2f} | "
            f"{c['peak_mib_above_inputs']:.0f} / {p['peak_mib_above_inputs']:.0f} | "
            f"{c['max_bound_share']:.2g} | {c['recomputed_rows']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
