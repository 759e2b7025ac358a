"""Speed and peak memory of the certified engine beside the arb and mpmath engines (the long
context issue's target: B=H=1, d=dv=64, N=2^16 in <= 2 s and N=2^20 in <= 30 s on one core,
causal and not, elu and performer-positive), and on the specs that are not plain (scaled,
unnormalised, decayed; causal) beside the plain float64 pass of the same spec.

    python benchmarks/bench_certified.py [--max-n 1048576] [--only plain|other] [--json PATH]

Inputs: q, k ~ N(0, 1) rounded to float32 (what a float32 kernel is judged on), v ~ N(1, 1),
an orthogonal W with m = d; gamma = 1 - 2^-5 (RetNet's first head), log-gates
g = log(sigmoid(N(0, 1))) / 16 (GLA's, sec. 4.4), float32 too. Per case: the certified
engine's time (one run: at 2^20 a run is the measurement), its peak resident memory above
what the process held with the inputs made (each case in a fresh process: ru_maxrss minus
the resident set before), the largest certified bound as a share of the element's scale,
and the rows it handed to arb. Plain specs: the arb engine timed at N = 2^10 and 2^12 and
extrapolated linearly (its cost is N d^2 in the linear form), mpmath at N = 16, 32 and
extrapolated as N^2. Other specs: the plain float64 pass, the suite's chunked form
(families/kernelised/scaled.py, torch float64: chunks of 64 tokens, 16 for channel gates,
its faster size), same inputs, no bounds, and its peak memory likewise.
One BLAS and one torch thread. Prints Markdown.
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
SPECS = (("elu", False), ("elu", True), ("performer-positive", False), ("performer-positive", True))
# (name, feature map, normalize, scale, decay), all causal
OTHER = (
    ("identity d^-0.5 unnormalised", "identity", False, "d^-0.5", None),
    ("elu constant decay", "elu", True, 1.0, "constant"),
    ("identity d^-0.5 unnormalised gates", "identity", False, "d^-0.5", "gates"),
    ("elu gates", "elu", True, 1.0, "gates"),
    ("identity d^-0.5 unnormalised channel gates", "identity", False, "d^-0.5", "channel-gates"),
)


def _inputs(n: int, name: str, causal: bool):
    import numpy as np

    from linattn_verify.families import validate
    from linattn_verify.sampling import sample_projection
    from linattn_verify.specs import Spec

    other = {case[0]: case for case in OTHER}.get(name)
    if other is None:
        spec = Spec(name, causal=causal)
    else:
        _, fm, normalize, scale, decay = other
        spec = Spec(fm, causal=True, normalize=normalize, scale=scale, decay=decay)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 1, n, D)).astype(np.float32)
    v = (1 + rng.standard_normal((1, 1, n, D))).astype(np.float32)
    w = sample_projection(D, D, "orthogonal", 0) if spec.info.needs_projection else None
    shape = {"gates": (1, 1, n), "channel-gates": (1, 1, n, D)}.get(spec.decay)
    decay = None
    if spec.decay == "constant":
        decay = np.array([1 - 2.0**-5])
    elif shape is not None:  # log(sigmoid(x)) / 16
        decay = (-np.logaddexp(0, -rng.standard_normal(shape)) / 16).astype(np.float32)
    return validate(q, k, v, spec, w, decay), spec


def _float64_pass(x, spec) -> None:
    """The spec's plain float64 chunked form (families/kernelised/scaled.py), no bounds."""
    import torch

    from linattn_verify.families.channel_gates.forms import gated_attention
    from linattn_verify.families.decayed.forms import decayed_attention

    q, k, v = (torch.from_numpy(t) for t in (x.q, x.k, x.v))
    decay = None if x.decay is None else torch.from_numpy(x.decay)
    size = 16 if spec.decay == "channel-gates" else 64
    attend = gated_attention if spec.decay == "channel-gates" else decayed_attention
    attend(q, k, v, spec, "chunked", None, size, decay)


def _one(engine: str, n: int, name: str, causal: bool) -> dict:
    """Time one engine on one case in this process (the child's side)."""
    import resource
    import time

    import numpy as np
    import torch

    from linattn_verify.families import family_of
    from linattn_verify.reference import certified_attention
    from linattn_verify.reference.arb import arb_attention
    from linattn_verify.reference.mp import mp_attention

    torch.set_num_threads(1)
    x, spec = _inputs(n, name, causal)
    with open("/proc/self/statm") as f:  # resident pages now, not the peak of the set-up
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    start = time.perf_counter()
    if engine == "certified":
        got = certified_attention(x, spec, family_of(spec).similarity)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = float(np.nanmax(got.bound / got.scale))
        extra = {"max_bound_share": share, "recomputed_rows": got.recomputed}
    elif engine == "float64":
        _float64_pass(x, spec)
        extra = {}
    else:
        (arb_attention if engine == "arb" else mp_attention)(x, spec, family_of(spec).similarity)
        extra = {}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {"seconds": seconds, "peak_mib_above_inputs": peak / 1024, **extra}


def _run(engine: str, n: int, name: str, causal: bool) -> dict:
    """_one in a fresh process, so that its peak memory is its own."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", engine, str(n), name, str(int(causal))],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=int, default=max(NS))
    parser.add_argument("--only", choices=("plain", "other"), help="one of the two tables")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, n, name, causal = args.child
        print(json.dumps(_one(engine, int(n), name, causal == "1")))
        return
    ns = [m for m in NS if m <= args.max_n]
    figures = {}
    if args.only != "other":
        figures["plain"] = _plain(ns)
    if args.only != "plain":
        figures["other"] = _other(ns)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


def _plain(ns: list[int]) -> list[dict]:
    """The plain specs beside arb and mpmath: their table, printed, and its rows."""
    rows = []
    for name, causal in SPECS:
        arb = [(n, _run("arb", n, name, causal)["seconds"]) for n in (2**10, 2**12)]
        mp = [(n, _run("mp", n, name, causal)["seconds"]) for n in (16, 32)]
        for n in ns:
            got = _run("certified", n, name, causal)
            kind = "causal" if causal else "non-causal"
            rows.append(
                {
                    "case": f"{name} {kind} N=2^{n.bit_length() - 1}",
                    **got,
                    "arb_seconds_extrapolated": arb[-1][1] * n / arb[-1][0],
                    "arb_measured": arb,
                    "mp_seconds_extrapolated": mp[-1][1] * (n / mp[-1][0]) ** 2,
                    "mp_measured": mp,
                }
            )
            print(f"{rows[-1]['case']}: {got['seconds']:.2f} s", file=sys.stderr, flush=True)
    print("| case (B=H=1, d=dv=64) | certified (s) | peak memory (MiB) | largest bound / s "
          "| rows to arb | arb (s, extrapolated) | mpmath (s, extrapolated) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['seconds']:.2f} | {r['peak_mib_above_inputs']:.0f} | "
            f"{r['max_bound_share']:.2g} | {r['recomputed_rows']} | "
            f"{r['arb_seconds_extrapolated']:.3g} | {r['mp_seconds_extrapolated']:.3g} |"
        )
    print(
        "\narb measured: "
        + "; ".join(f"{r['case']}: " + ", ".join(f"N={n}: {t:.2f} s" for n, t in r["arb_measured"])
                    for r in rows[:: len(ns)])
    )  # fmt: skip
    return rows


def _other(ns: list[int]) -> list[dict]:
    """The other specs (causal) beside their plain float64 pass: the table and its rows."""
    rows = []
    for name, *_ in OTHER:
        for n in ns:
            got = _run("certified", n, name, True)
            plain = _run("float64", n, name, True)
            rows.append({"case": f"{name} N=2^{n.bit_length() - 1}", **got, "float64": plain})
            print(f"{rows[-1]['case']}: {got['seconds']:.2f} s", file=sys.stderr, flush=True)
    print("\n| case (causal, B=H=1, d=dv=64) | certified (s) | float64 pass (s) | ratio | peak "
          "memory (MiB) | float64 peak (MiB) | largest bound / s | rows to arb |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f64 = r["float64"]
        print(
            f"| {r['case']} | {r['seconds']:.2f} | {f64['seconds']:.2f} | "
            f"{r['seconds'] / f64['seconds']:.2f} | {r['peak_mib_above_inputs']:.0f} | "
            f"{f64['peak_mib_above_inputs']:.0f} | {r['max_bound_share']:.2g} | "
            f"{r['recomputed_rows']} |"
        )
    return rows


if __name__ == "__main__":
    main()
