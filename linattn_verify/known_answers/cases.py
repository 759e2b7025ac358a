"""The cases each spec's vectors are built from (linattn_verify.cases.Case: the few numbers
that rebuild one input): a family's own (Family.known_answer_cases: families/delta/
vectors.py), else the canonical shapes and dtypes with the adversarial ones of a spec that
does not forget (vector_cases) or the decay check's rates of one that does
(gated_vector_cases); spec_cases picks them."""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..cases import Case
from ..families import Family
from ..regimes import magnitude_range
from ..specs import Spec


def _magnitude(exponent: float, dtype: str) -> float:
    """10^exponent to 6 significant digits, at most the dtype's largest value: a number
    every platform parses to the same double (libm's pow may differ in the last bit)."""
    return float(f"{min(10.0**exponent, torch.finfo(getattr(torch, dtype)).max):.6g}")


def _extreme(spec: Spec) -> Case:
    """float16 at the edge of the spec's regime: elu rows of -65504 (features underflow),
    large Performer norms, a dominant key with the largest logits otherwise."""
    name = spec.feature_map
    if name == "elu":
        kind = "negative-rows"
    elif name.startswith("performer"):
        kind = "large-norm"
    else:
        kind = "dominant"
    magnitude = _magnitude(magnitude_range(spec, kind, "float16")[1], "float16")
    return Case(1, 2, 16, 4, 4, "float16", kind, magnitude, seed=7, m=_m(spec, 4))


def _m(spec: Spec, d: int) -> int | None:
    return d if spec.info.needs_projection else None  # d = m for random features


def _relative_denominator(spec: Spec, case: Case) -> float:
    """The smallest |den_i| / sum_j |a_ij| |...| over rows with a non-zero denominator, in
    float64 (a selection score, not a reference): for relu and cosformer relative to
    sum_j |q_i| |k_j| (their weights are never negative), for performer-trig to sum_j |a_ij|."""
    q, k, _, w = case.tensors()
    q, k = q.double().numpy()[0, 0], k.double().numpy()[0, 0]
    n = q.shape[0]
    if spec.feature_map == "performer-trig":

        def phi(x: np.ndarray) -> np.ndarray:
            xs = x * x.shape[1] ** -0.25
            proj = xs @ w.double().numpy().T
            scale = np.exp(0.5 * (xs * xs).sum(1, keepdims=True)) / np.sqrt(len(w))
            return scale * np.concatenate([np.sin(proj), np.cos(proj)], 1)

        a = phi(q) @ phi(k).T
        size = np.abs(a)
    else:
        a = np.maximum(q, 0) @ np.maximum(k, 0).T
        if spec.feature_map == "cosformer":
            a = a * np.cos(np.pi * np.subtract.outer(np.arange(n), np.arange(n)) / (2 * n))
        size = np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(k, axis=1))
    if spec.causal:
        a, size = np.tril(a), np.tril(size)
    den, total = np.abs(a.sum(1)), size.sum(1)
    rel = den[den > 0] / total[den > 0]
    return float(rel.min()) if rel.size else np.inf


NEAR_ZERO_SEEDS = 400  # seeds searched for the smallest relative denominator


def _near_zero(spec: Spec) -> Case:
    """Of NEAR_ZERO_SEEDS seeded float32 cases, the one whose denominator is smallest
    relative to its terms: nearly no positive similarity (relu, cosformer) or near-total
    cancellation (performer-trig)."""
    shape = {"b": 1, "h": 1, "n": 16, "d": 4, "dv": 4, "dtype": "float32", "m": _m(spec, 4)}
    seeds = range(NEAR_ZERO_SEEDS)
    best = min(seeds, key=lambda seed: _relative_denominator(spec, Case(**shape, seed=seed)))
    return Case(**shape, seed=best)


def vector_cases(spec: Spec) -> list[tuple[str, Case]]:
    """The vectors of one spec: (label, case). Canonical shapes (N = 1, ragged N, d != dv,
    every dtype) and adversarial ones (cancellation in V, the regime's extreme, tiny inputs,
    zero rows: 0/0 for relu and cosformer, near-zero denominators for relu, cosformer and
    performer-trig, N = 512)."""
    m = functools.partial(_m, spec)
    cases = [
        ("n1-float32", Case(1, 1, 1, 4, 3, "float32", seed=1, m=m(4))),
        ("ragged-float32", Case(2, 3, 7, 5, 3, "float32", seed=2, m=m(5))),
        ("float16", Case(1, 2, 33, 8, 8, "float16", seed=3, m=m(8))),
        ("bfloat16", Case(1, 2, 17, 4, 6, "bfloat16", seed=4, m=m(4))),
        ("float64", Case(2, 1, 9, 3, 2, "float64", seed=5, m=m(3))),
        ("cancel-float32", Case(1, 2, 16, 4, 4, "float32", "cancel", seed=6, m=m(4))),
        ("extreme-float16", _extreme(spec)),
        ("tiny-float32", Case(1, 2, 9, 3, 2, "float32", magnitude=1e-15, seed=10, m=m(3))),
        ("zero-rows-float32", Case(1, 2, 9, 3, 2, "float32", "zero-rows", seed=8, m=m(3))),
        ("long-float32", Case(1, 1, 512, 8, 8, "float32", seed=9, m=m(8))),
    ]
    if spec.feature_map in ("relu", "cosformer", "performer-trig"):
        cases.append(("near-zero-float32", _near_zero(spec)))
    return cases


def gated_vector_cases(spec: Spec) -> list[tuple[str, Case]]:
    """The vectors of a decayed spec: the canonical shapes, cancellation in V, a long
    sequence, and the decay check's three rates (checks/decay.py): gates next to 1
    (e^-(2^-22) a token), next to 0 (e^-20: the state erased in a token) and of about e^-1
    (prefix sums spanning tens)."""
    return [
        ("n1-float32", Case(1, 1, 1, 4, 3, "float32", seed=1)),
        ("ragged-float32", Case(2, 3, 7, 5, 3, "float32", seed=2)),
        ("float16", Case(1, 2, 33, 8, 8, "float16", seed=3)),
        ("bfloat16", Case(1, 2, 17, 4, 6, "bfloat16", seed=4)),
        ("float64", Case(2, 1, 9, 3, 2, "float64", seed=5)),
        ("cancel-float32", Case(1, 2, 16, 4, 4, "float32", "cancel", seed=6)),
        ("decay-near-one-float32", Case(1, 2, 16, 4, 4, "float32", seed=7, decay_rate=2.0**-22)),
        ("decay-near-zero-float32", Case(1, 2, 16, 4, 4, "float32", seed=8, decay_rate=20.0)),
        ("decay-wide-float32", Case(1, 2, 64, 4, 4, "float32", seed=9, decay_rate=1.0)),
        ("long-float32", Case(1, 1, 512, 8, 8, "float32", seed=10)),
    ]


def spec_cases(family: Family, spec: Spec) -> list[tuple[str, Case]]:
    """(label, case) of each vector of `spec`, one of `family`'s known-answer specs: its own
    cases (Family.known_answer_cases), else the decay check's rates where it forgets
    (gated_vector_cases) and vector_cases' otherwise."""
    if family.known_answer_cases is not None:
        return family.known_answer_cases(spec)
    return gated_vector_cases(spec) if family.forgets(spec) else vector_cases(spec)
