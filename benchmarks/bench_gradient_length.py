"""Time of vet --grad's gradient-length check on the built-in forms of every feature map
(checks/gradient_length.py: the backward at N = 256, 1024, 4096, or 1024 for softmax, in
float16, bfloat16 and float32, against certified gradients), and of the certified
gradients alone at N = 4096 per map (one head, d = dv = 16, m = 32).

    python benchmarks/bench_gradient_length.py [--only NAME ...]

One torch thread (the certified gradients run with one BLAS thread). Prints Markdown: per
form its seconds, whether it passed and its largest error in units of u M.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from linattn_verify.checks.gradient_length import default_longest, gradient_length
from linattn_verify.families import family_of, validate
from linattn_verify.specs import Spec
from linattn_verify.under_test import resolve

DTYPES = ("float16", "bfloat16", "float32")
FORMS = (  # (form, claim)
    ("chunked", dict(feature_map="elu", causal=True)),
    ("chunked", dict(feature_map="identity", causal=True)),
    ("linear", dict(feature_map="identity")),
    ("recurrent", dict(feature_map="cosformer", causal=True)),
    ("linear", dict(feature_map="cosformer")),
    ("chunked", dict(feature_map="taylor", causal=True)),
    ("linear", dict(feature_map="taylor")),
    ("chunked", dict(feature_map="performer-trig", causal=True)),
    ("linear", dict(feature_map="performer-trig")),
    ("linear", dict(feature_map="performer-positive")),
    ("linear", dict(feature_map="performer-hyperbolic")),
    ("chunked", dict(feature_map="performer-trig", causal=True, decay="gates", scale="d^-0.5")),
    ("chunked", dict(feature_map="taylor", causal=True, normalize=False, decay="gates")),
    ("quadratic", dict(feature_map="softmax", causal=True)),
)
MAPS = ("elu", "identity", "cosformer", "taylor", "performer-trig", "performer-positive",
        "softmax")  # fmt: skip


def certified_seconds(name: str, n: int = 4096) -> float:
    """certified_gradients' time on one causal head of `name` (q, k ~ N(0, 0.5); N(1, 0.5)
    for identity, whose denominators then stay away from 0)."""
    rng = np.random.default_rng(0)
    spec = Spec(name, causal=True)
    q, k = rng.normal(1.0 if name == "identity" else 0.0, 0.5, size=(2, 1, 1, n, 16))
    v, g = rng.normal(size=(2, 1, 1, n, 16))
    w = torch.tensor(rng.normal(size=(32, 16))) if spec.info.needs_projection else None
    x = validate(*(torch.tensor(t) for t in (q, k, v)), spec, w, None)
    start = time.perf_counter()
    family_of(spec).certified_gradients(x, spec, g)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="feature maps to run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| form | spec | gradient-length s | passed | largest error (u M) |")
    print("| --- | --- | ---: | --- | ---: |")
    for form, claim in FORMS:
        if args.only and claim["feature_map"] not in args.only:
            continue
        impl = resolve(form=form, **claim)
        start = time.perf_counter()
        result = gradient_length(impl, DTYPES, longest=default_longest(False, impl.spec))
        seconds = time.perf_counter() - start
        largest = max(result.figures.values(), default=float("nan"))
        row = (form, impl.spec, f"{seconds:.1f}", result.passed, f"{largest:.3g}")
        print("| " + " | ".join(map(str, row)) + " |", flush=True)
    print("\n| map (causal, N = 4096) | certified gradients s |\n| --- | ---: |")
    for name in MAPS:
        if not args.only or name in args.only:
            print(f"| {name} | {certified_seconds(name):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
