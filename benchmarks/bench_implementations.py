"""Speed and memory of the built-in forms, side by side with SDPA and the third-party
libraries behind linattn_verify.adapters.

    python benchmarks/bench_implementations.py [--max-n 65536] [--json PATH]

fp32 on one CPU thread (with two, any other busy process makes each op wait a scheduler
tick and flattens the curves), B=1, H=4, d=dv=64. Per N, for the elu feature map: the
median of `--repeats` runs, GFLOP/s of the matmul FLOPs counted by torch.utils.flop_counter,
the ratio to this machine's fp32 matmul peak measured in the same run (best of square
products), the ratio of SDPA's time (same causality) to ours, and the peak bytes of tensors
alive at once during our call (a dispatch mode that tracks every tensor an op creates until
it is freed). Then each installed CPU adapter against the built-in form of the spec it
claims (same causality, eps and projection): its time over ours. An adapter whose call
takes longer than PEER_CAP_SECONDS (a Python loop over tokens) is not timed at larger N.
The header names whether the elu features came from the C kernel (families/kernelised/native.c)
and whether torch gave large tensors huge pages (THP_MEM_ALLOC_ENABLE=1 in the
environment): on a virtual machine whose page faults are slow, the first touch of a fresh
64 MiB output costs as much as the attention (README).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from timing import median_seconds

import linattn_verify as lv
from linattn_verify.adapters import ADAPTERS, AdapterUnavailable
from linattn_verify.families.kernelised import native
from linattn_verify.implementations import sample_projection_torch
from linattn_verify.scaling import measure_cost
from linattn_verify.under_test import Implementation, ImplementationFailure, resolve

B, H, D = 1, 4, 64
SDPA_MAX_N = 16384  # O(N^2) time: 16k already takes seconds a call on one core
PEER_CAP_SECONDS = 2.0  # beyond this a call is a loop over tokens: not timed at larger N


def peers() -> dict[str, tuple[Implementation, Implementation]]:
    """(adapter, our form of the spec it claims) for every adapter that loads on the CPU."""
    out = {}
    for name, adapter in ADAPTERS.items():
        if adapter.triton:  # seconds a call in the interpreter: not a speed to compare
            continue
        try:
            out[name] = (resolve(name), resolve(spec=adapter.spec))
        except AdapterUnavailable as err:
            print(f"{name}: not timed ({err})", file=sys.stderr)
    return out


def matmul_peak(repeats: int) -> float:
    """Best GFLOP/s of square fp32 products (1024, 2048), one thread."""
    best = 0.0
    for n in (1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        best = max(best, 2 * n**3 / median_seconds(lambda a=a, b=b: a @ b, repeats) / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-n", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    peak = matmul_peak(args.repeats)
    print(f"fp32 matmul peak, one thread: {peak:.1f} GFLOP/s", file=sys.stderr)
    rows = []
    n = 1024
    while n <= args.max_n:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
        for causal, form in ((False, "linear"), (True, "chunked")):

            def ours(q=q, k=k, v=v, causal=causal, form=form):
                return lv.attention(q, k, v, "elu", causal, form)

            seconds = median_seconds(ours, args.repeats)
            cost = measure_cost(ours, n)
            flops = cost.flops
            row = {
                "N": n,
                "form": form,
                "ms": seconds * 1e3,
                "gflops": flops / seconds / 1e9,
                "peak_ratio": flops / seconds / 1e9 / peak,
                "peak_bytes": cost.peak_bytes,
                "vs": {},
            }
            if n <= SDPA_MAX_N:

                def sdpa(q=q, k=k, v=v, causal=causal):
                    return torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal
                    )

                row["vs"]["sdpa"] = median_seconds(sdpa, max(1, args.repeats // 2)) / seconds
            rows.append(row)
            print(f"N={n} {form}: {row['ms']:.1f} ms", file=sys.stderr)
        n *= 2
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "0")
    print(
        f"fp32, one thread, B={B}, H={H}, d=dv={D}, elu; matmul peak {peak:.1f} GFLOP/s; "
        f"THP_MEM_ALLOC_ENABLE={thp}; C kernel {native.status().split(' (')[0]}\n"
    )
    names = sorted({name for r in rows for name in r["vs"]})
    print(
        "| N | form | ms | GFLOP/s | / peak | peak MiB | "
        + " | ".join(f"{x} / ours" for x in names)
        + " |"
    )
    print("|---:|---|---:|---:|---:|---:|" + "---:|" * len(names))
    for r in rows:
        ratios = " | ".join(f"{r['vs'][x]:.2f}" if x in r["vs"] else "" for x in names)
        print(
            f"| {r['N']} | {r['form']} | {r['ms']:.1f} | {r['gflops']:.1f} | "
            f"{r['peak_ratio']:.2f} | {r['peak_bytes'] / 2**20:.1f} | {ratios} |"
        )
    peer_rows = time_peers(args.max_n, args.repeats)
    print("\n| N | adapter | claims | ms | ours (same spec) ms | adapter / ours |")
    print("|---:|---|---|---:|---:|---:|")
    for r in peer_rows:
        print(
            f"| {r['N']} | {r['adapter']} | {r['spec']} | {r['ms']:.1f} | {r['ours_ms']:.1f} | "
            f"{r['ms'] / r['ours_ms']:.2f} |"
        )
    if args.json:
        meta = {"peak_gflops": peak, "thp": thp, "native": native.status()}
        payload = {**meta, "rows": rows, "peers": peer_rows}
        Path(args.json).write_text(json.dumps(payload, indent=2))


def time_peers(max_n: int, repeats: int) -> list[dict]:
    """Each adapter's median time and our same-spec form's, per N from 1024 up, until the
    adapter's call takes longer than PEER_CAP_SECONDS or raises."""
    rows, active = [], peers()
    w = sample_projection_torch(D, D, "orthogonal", torch.Generator().manual_seed(0))
    n = 1024
    while n <= max_n and active:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g) for _ in range(3))
        for name, (adapter, ours) in list(active.items()):
            try:
                seconds = median_seconds(lambda a=adapter, x=(q, k, v, w): a(*x), repeats)
            except ImplementationFailure as err:
                print(f"{name}: stopped at N={n} ({err})", file=sys.stderr)
                del active[name]
                continue
            ours_seconds = median_seconds(lambda o=ours, x=(q, k, v, w): o(*x), repeats)
            spec = str(adapter.spec)
            rows.append({"N": n, "adapter": name, "spec": spec, "ms": seconds * 1e3,
                         "ours_ms": ours_seconds * 1e3})  # fmt: skip
            print(f"N={n} {name}: {seconds * 1e3:.1f} ms", file=sys.stderr)
            if seconds > PEER_CAP_SECONDS:
                del active[name]
        n *= 2
    return rows


if __name__ == "__main__":
    main()
