"""Scaling of every built-in implementation: counted FLOPs and bytes, timed growth with its
noise gate, the crossover against SDPA, and a log-log plot.

    python benchmarks/bench_scaling.py [--out DIR] [--repeats 5]

fp32, B=1, H=4 (timing) / H=1 (counting), d=dv=64 (taylor: 8); counted over
N = 2^8 ... 2^16 (quadratic forms 2^8 ... 2^12), timed over 2^6 ... 2^16 (2^8 ... 2^12);
slopes over the larger half.
Writes scaling.json and scaling.png under --out (default reports/scaling/).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import linattn_verify as lv
from linattn_verify.scaling import plot_scaling, scaling_result

LINEAR_COST = [2**i for i in range(8, 17)]
LINEAR_TIME = [2**i for i in range(6, 17)]
QUADRATIC = [2**i for i in range(8, 13)]


def implementations():
    for name, fm in lv.FEATURE_MAPS.items():
        d = 8 if name == "taylor" else 64
        w = lv.sample_projection_torch(d, d, "orthogonal") if fm.needs_projection else None
        for causal in (False, True):
            forms = ["quadratic"]
            if fm.kernelised:
                forms.append("chunked" if causal else "linear")
            for form in forms:
                label = f"{name} {form}{' causal' if causal else ''}"

                def impl(q, k, v, name=name, causal=causal, form=form, w=w):
                    return lv.attention(q, k, v, name, causal, form, w)

                yield label, impl, form, causal, d


def _crossover(result) -> str:
    """The crossover N, or 'none' / '<= first N' when it lies outside the timed range."""
    n = result.crossover_vs_sdpa
    if result.sdpa_timing is None:
        return "not timed"
    if n is None:
        return f"none up to {result.sdpa_timing.ns[-1]}"
    return f"<= {n}" if n == result.sdpa_timing.ns[0] else str(n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="reports/scaling")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for label, impl, form, causal, d in implementations():
        quadratic = form == "quadratic"
        result = scaling_result(
            label,
            impl,
            "quadratic" if quadratic else "linear",
            QUADRATIC if quadratic else LINEAR_COST,
            QUADRATIC if quadratic else LINEAR_TIME,
            causal=causal,
            repeats=args.repeats,
            d=d,
            dv=d,
        )
        results.append(result)
        print(f"{label}: {result.growth.message}; time {result.timing.status}", file=sys.stderr)
    print(
        "| implementation | FLOPs slope | bytes slope | time slope | timing | max spread | "
        "worst off fit | crossover vs SDPA |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for r in results:
        s = r.summary()
        print(
            f"| {s['name']} | {s['flops_slope']:.3f} | {s['bytes_slope']:.3f} | "
            f"{s['time_slope']:.2f} | {s['time_status']} | {s['time_noise']['max_spread']:.2f} | "
            f"{s['time_noise']['worst_factor_off_fit']:.2f} | {_crossover(r)} |"
        )
    (out / "scaling.json").write_text(json.dumps([r.summary() for r in results], indent=2))
    chosen = [r for r in results if r.name.startswith(("elu", "softmax"))]
    plot_scaling(
        {r.name: r.timing for r in chosen},
        {r.name: r.costs for r in chosen},
        out / "scaling.png",
    )


if __name__ == "__main__":
    main()
