"""Known-answer vectors: inputs stored exactly, outputs exact to 34 significant digits.

Layout, under the package linattn_verify.known_answers (its package data; its README.md says
how to read them without this package):
- vectors/NAME.json, one vector each: the spec, the case it was built from,
  the inputs q, k, v (and the projection W, the decay's gamma or g, the delta rule's beta
  and g) as IEEE bit patterns in their dtype, and the output as decimal strings of
  KAT_DIGITS significant digits ("nan" where it is 0/0);
- manifest.json: generator version and, per vector, its spec, shape, dtype and
  the sha256 of its file.
`build` writes them deterministically (the same bytes twice); `check` verifies every hash
and recomputes a sample with the arb engine (the delta rule's for its specs); `run_vectors`
runs an implementation on them and reports its error per vector in units of u s of its
dtype (docs/accuracy.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .accuracy.bound import scale_and_bound
from .cases import DELTA_KINDS, Case
from .families import case_arguments, validate
from .families.delta.inputs import delta_arguments, pack_delta
from .families.delta.reference import arb_delta_decimal
from .inputs import UNIT_ROUNDOFF, AttentionInputs
from .reference.arb import arb_decimal
from .regimes import magnitude_range, regime_of
from .specs import (
    DECAY_ARGUMENTS,
    DECAY_SOURCES,
    DELTA_SOURCE,
    FEATURE_MAPS,
    QK_L2NORM_EPS,
    RSQRT_D,
    Spec,
    SpecError,
)
from .under_test import Implementation, ImplementationFailure

GENERATOR_VERSION = 1
KAT_DIGITS = 34  # 34 decimal digits: 112 bits, beyond the 100 the vectors promise
AGREE_BITS = 100  # a recomputed value agrees with a stored one to this many bits
FORMAT = "linattn-verify known-answer vector"
BITS = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}


# the vectors' folder: the package linattn_verify.known_answers beside this module, with its
# package data (a wheel's, or the checkout's in an editable install), found from any folder
DEFAULT_DIR = Path(__file__).resolve().with_name("known_answers")


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


def delta_vector_cases(spec: Spec) -> list[tuple[str, Case]]:
    """The vectors of a delta-rule spec (B = 1, H = 2, d = 4, dv = 3, N <= 16): N = 1, ragged
    N = 11, every dtype, the delta rule's stress kinds (cases.DELTA_KINDS: beta next to 2, keys
    of norm 0.37 to 2.7, nearly parallel keys) and, gated, gates next to 1 (e^-(2^-22) a
    token) and next to 0 (about e^-20: the state erased in a token)."""
    shape = (1, 2, 16, 4, 3)
    cases = [
        ("n1-float32", Case(1, 2, 1, 4, 3, "float32", seed=1)),
        ("ragged-float32", Case(1, 2, 11, 4, 3, "float32", seed=2)),
        ("float16", Case(*shape, "float16", seed=3)),
        ("bfloat16", Case(*shape, "bfloat16", seed=4)),
        ("float64", Case(*shape, "float64", seed=5)),
    ]
    for seed, kind in enumerate(DELTA_KINDS, 6):
        cases.append((f"{kind}-float32", Case(*shape, "float32", kind, seed=seed)))
    if spec.gated:
        cases += [
            ("decay-near-one-float32", Case(*shape, "float32", seed=9, decay_rate=2.0**-22)),
            ("decay-near-zero-float32", Case(*shape, "float32", seed=10, decay_rate=20.0)),
        ]
    return cases


# the maps with published vectors of their plain specs (identity, added after them, has none
# yet); the decayed specs with vectors: GLA's channel gates (fla's, and elu's normalised),
# and as fla calls them simple GLA / Mamba2's scalar gates and retention's constant decay
KAT_MAPS = tuple(name for name in FEATURE_MAPS if name != "identity")
_FLA = Spec("identity", causal=True, normalize=False, scale=RSQRT_D)
DECAYED_KAT_SPECS = (
    replace(_FLA, decay="channel-gates"),
    Spec("elu", causal=True, decay="channel-gates"),
    replace(_FLA, decay="gates"),
    replace(_FLA, decay="constant"),
)
# the denominator eps of shipped kernels: 1e-6 (fast-transformers' elu, performer-pytorch's
# causal relu and FAVOR+, fla's based), and fla's linear attention (1e-10, scale d^-0.5)
EPS_KAT_SPECS = (
    Spec("elu", eps=1e-6),
    Spec("elu", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-6),
    Spec("performer-positive", causal=True, eps=1e-6),
    Spec("taylor", causal=True, eps=1e-6),
    Spec("relu", causal=True, eps=1e-10, scale=RSQRT_D),
)
# the delta rule as fla's layers call it (scale d^-0.5): DeltaNet, Gated DeltaNet, KDA, and
# DeltaNet with q and k normalised inside the kernel
_DELTA = replace(_FLA, delta_rule=True)
DELTA_KAT_SPECS = (
    _DELTA,
    replace(_DELTA, decay="gates"),
    replace(_DELTA, decay="channel-gates"),
    replace(_DELTA, qk_l2norm=True),
)
# the specs other than the KAT_MAPS' plain ones (eps 0) that have vectors
OTHER_KAT_SPECS = DECAYED_KAT_SPECS + EPS_KAT_SPECS + DELTA_KAT_SPECS


def spec_label(spec: Spec) -> str:
    """The part of a vector's name that names its spec: map, causality, and where they are
    not the plain spec's eps, unnormalised, scaled, delta, its decay, l2norm."""
    words = [spec.feature_map, "causal" if spec.causal else "full"]
    words += [f"eps{spec.eps:g}"] * (spec.eps != 0)
    words += ["unnormalised"] * (not spec.normalize) + ["scaled"] * (spec.scale != 1.0)
    words += ["delta"] * spec.delta_rule + [spec.decay] * (spec.decay is not None)
    return "-".join(words + ["l2norm"] * spec.qk_l2norm)


def all_vectors() -> Iterator[tuple[str, Spec, Case]]:
    """(name, spec, case) of every vector, in a fixed order."""
    for name in KAT_MAPS:
        for causal in (False, True):
            spec = Spec(name, causal=causal)
            for label, case in vector_cases(spec):
                yield f"{spec_label(spec)}-{label}", spec, case
    for spec in DECAYED_KAT_SPECS:
        for label, case in gated_vector_cases(spec):
            yield f"{spec_label(spec)}-{label}", spec, case
    for spec in EPS_KAT_SPECS:
        for label, case in vector_cases(spec):
            yield f"{spec_label(spec)}-{label}", spec, case
    for spec in DELTA_KAT_SPECS:
        for label, case in delta_vector_cases(spec):
            yield f"{spec_label(spec)}-{label}", spec, case


def _encode(t: torch.Tensor | None) -> dict[str, Any] | None:
    """A tensor as its dtype, shape and IEEE bit patterns (hex, row-major)."""
    if t is None:
        return None
    dtype = str(t.dtype).removeprefix("torch.")
    bits = t.detach().cpu().contiguous().view(getattr(torch, f"int{t.element_size() * 8}"))
    raw = bits.numpy().astype(BITS[dtype]).ravel()
    width = t.element_size() * 2
    return {"dtype": dtype, "shape": list(t.shape), "bits": [f"{b:0{width}x}" for b in raw]}


def decode(entry: dict[str, Any] | None) -> torch.Tensor | None:
    """The tensor a vector stores (its exact values in its dtype)."""
    if entry is None:
        return None
    dtype = entry["dtype"]
    if dtype not in BITS:
        raise SpecError(f"unknown dtype {dtype!r} in a vector")
    raw = np.array([int(b, 16) for b in entry["bits"]], dtype=BITS[dtype])
    signed = torch.from_numpy(raw.view(f"int{raw.itemsize * 8}").copy())
    return signed.view(getattr(torch, dtype)).reshape(entry["shape"])


def vector_inputs(spec: Spec, case: Case) -> tuple[tuple[torch.Tensor | None, ...], dict]:
    """(q, k, v, projection, decay) as Case.arguments draws them, and a vector's stored
    inputs: q, k, v, the projection, and the decay's gamma or g, or the delta rule's beta
    (and g) apart, as the kernels take them."""
    q, k, v, w, decay = tensors = case_arguments(case, spec)
    inputs = {"q": _encode(q), "k": _encode(k), "v": _encode(v), "projection": _encode(w)}
    if spec.delta_rule:
        inputs |= {key: _encode(t) for key, t in delta_arguments(spec, decay).items()}
    elif spec.decay:
        inputs |= {DECAY_ARGUMENTS[spec.decay]: _encode(decay)}
    return tensors, inputs


def make_vector(name: str, spec: Spec, case: Case) -> dict[str, Any]:
    """The vector `name`: inputs from `case` (vector_inputs), output from the arb engine."""
    (q, k, v, w, decay), inputs = vector_inputs(spec, case)
    out = _exact_decimal(validate(q, k, v, spec, w, decay), spec)
    described = {"feature_map": spec.feature_map, "causal": spec.causal, "eps": spec.eps}
    formula = spec.info.source
    if spec.delta_rule:
        described |= _decayed_fields(spec) | _delta_fields(spec)
        l2norm = f"; q and k first x / sqrt(|x|^2 + {QK_L2NORM_EPS:g})" * spec.qk_l2norm
        formula = DELTA_SOURCE + l2norm
    elif not spec.plain:  # a plain vector's bytes are those of generator version 1
        described |= _decayed_fields(spec)
    if spec.decay and not spec.delta_rule:
        described |= {"decay_formula": DECAY_SOURCES[spec.decay]}
    return {
        "format": FORMAT,
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "spec": described | {"formula": formula},
        "case": json.loads(case.to_json()),
        "inputs": inputs,
        "output": {"shape": list(out.shape), "digits": KAT_DIGITS, "values": out.ravel().tolist()},
    }


def _exact_decimal(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """The exact output as KAT_DIGITS-digit decimal strings, by the spec's arb engine."""
    engine = arb_delta_decimal if spec.delta_rule else arb_decimal
    return engine(x, spec, KAT_DIGITS)


def _decayed_fields(spec: Spec) -> dict[str, Any]:
    """What a vector's spec and manifest entry say beyond map, causality and eps."""
    return {"normalize": spec.normalize, "scale": spec.scale, "decay": spec.decay}


def _delta_fields(spec: Spec) -> dict[str, Any]:
    """What a delta-rule vector's spec and manifest entry say besides (none for the others,
    whose bytes are those of generator version 1)."""
    return {"delta_rule": True, "qk_l2norm": spec.qk_l2norm} if spec.delta_rule else {}


def _dumps(payload: Any) -> bytes:
    return (json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _entry(name: str, spec: Spec, case: Case, data: bytes) -> dict[str, Any]:
    """The manifest's entry for the vector `name` whose file holds `data`."""
    return {
        "file": f"vectors/{name}.json",
        "name": name,
        "feature_map": spec.feature_map,
        "causal": spec.causal,
        "eps": spec.eps,
        **_decayed_fields(spec),
        **_delta_fields(spec),
        "dtype": case.dtype,
        "shape_B_H_N_d_dv": [case.b, case.h, case.n, case.d, case.dv],
        "m": case.m,
        "kind": case.kind,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def build(
    directory: Path = DEFAULT_DIR,
    only: Callable[[str], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write every vector and the manifest under `directory` (`only`: just the vectors whose
    name it accepts, into a folder that holds no vectors yet). The vectors are written
    aside first: a run that fails leaves the previous ones in place. Returns the manifest."""
    directory = Path(directory)
    if only is not None and (directory / "manifest.json").exists():
        raise SpecError(f"a partial build would overwrite the vectors in {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / "vectors.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    entries = []
    chosen = [t for t in all_vectors() if only is None or only(t[0])]
    for index, (name, spec, case) in enumerate(chosen, 1):
        data = _dumps(make_vector(name, spec, case))
        (staging / f"{name}.json").write_bytes(data)
        entries.append(_entry(name, spec, case, data))
        if progress:
            progress(f"[{index}/{len(chosen)}] {name}")
    manifest = {
        "format": "linattn-verify known-answer vectors manifest",
        "generator_version": GENERATOR_VERSION,
        "digits": KAT_DIGITS,
        "vectors": entries,
    }
    (directory / "manifest.json.building").write_bytes(_dumps(manifest))
    shutil.rmtree(directory / "vectors", ignore_errors=True)
    staging.rename(directory / "vectors")
    os.replace(directory / "manifest.json.building", directory / "manifest.json")
    return manifest


def load_manifest(directory: Path = DEFAULT_DIR) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        if not all(isinstance(e, dict) for e in manifest["vectors"]):
            raise TypeError("vectors must be a list of entries")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SpecError(f"cannot read {path}: {type(err).__name__}: {err}") from None
    return manifest


def check(
    directory: Path = DEFAULT_DIR,
    sample: int | None = None,
    progress: Callable[[str], None] | None = None,
    only: Callable[[str], bool] | None = None,
) -> list[str]:
    """Problems with the vectors under `directory` (empty when all is well):
    - the manifest lists exactly the vectors this generator version builds, each entry as
      build would write it for its file (spec, dtype, shape, size, sha256);
    - no vector file missing or unlisted;
    - every vector (or `sample` of them, spread over the list) recomputed with the arb
      engine agrees with its stored output to AGREE_BITS bits (`only`: just the vectors
      whose name it accepts)."""
    directory = Path(directory)
    manifest = load_manifest(directory)
    problems = []
    if (manifest.get("generator_version"), manifest.get("digits")) != (
        GENERATOR_VERSION,
        KAT_DIGITS,
    ):
        problems.append(f"{directory / 'manifest.json'}: generator version or digits differ")
    expected = {name: (spec, case) for name, spec, case in all_vectors()}
    listed = [e.get("name") for e in manifest["vectors"]]
    if sorted(listed) != sorted(expected):
        missing, extra = set(expected) - set(listed), set(listed) - set(expected)
        problems.append(
            f"{directory / 'manifest.json'}: does not list the generator's vectors exactly "
            f"once (missing {sorted(missing)[:3]}, unknown {sorted(extra)[:3]})"
        )
    files = {f"vectors/{p.name}" for p in (directory / "vectors").glob("*.json")}
    for name in sorted(files - {e.get("file") for e in manifest["vectors"]}):
        problems.append(f"{directory / name}: not in the manifest")
    for entry in manifest["vectors"]:
        path = directory / str(entry.get("file"))
        if not path.is_file():
            problems.append(f"{path}: missing (listed in the manifest)")
            continue
        data = path.read_bytes()
        if entry.get("name") in expected:
            spec, case = expected[entry["name"]]
            if entry != _entry(entry["name"], spec, case, data):
                problems.append(f"{path}: sha256 or manifest entry does not match the file")
        problems += _fields_match(path, entry, data)
    if problems:
        return problems
    entries = [e for e in manifest["vectors"] if only is None or only(e["name"])]
    chosen = entries if sample is None else entries[:: max(1, len(entries) // max(sample, 1))]
    for entry in chosen[: len(entries) if sample is None else sample]:
        if progress:
            progress(f"recomputing {entry['name']}")
        problems += _recompute(directory / entry["file"])
    return problems


def _fields_match(path: Path, entry: dict[str, Any], data: bytes) -> list[str]:
    """The vector file's own fields against its manifest entry."""
    try:
        vector = json.loads(data)
        spec = _spec_of(vector)
        same = (
            vector["name"] == entry["name"]
            and spec == _spec_of({"spec": entry})
            and vector["inputs"]["q"]["dtype"] == entry["dtype"]
        )
    except (ValueError, KeyError, TypeError) as err:
        return [f"{path}: not a readable vector ({type(err).__name__}: {err})"]
    return [] if same else [f"{path}: its spec or dtype differs from the manifest entry"]


def _spec_of(vector: dict[str, Any]) -> Spec:
    """The spec a vector (or a manifest entry, as {"spec": entry}) states: a plain one where
    it says nothing of normalisation, scale, decay or the delta rule."""
    s = vector["spec"]
    keys = ("normalize", "scale", "decay", "delta_rule", "qk_l2norm")
    extra = {key: s[key] for key in keys if key in s}
    return Spec(s["feature_map"], causal=s["causal"], eps=s["eps"], **extra)


def _inputs(vector: dict[str, Any]) -> tuple[Spec, tuple[torch.Tensor | None, ...]]:
    """The vector's spec and its tensors (q, k, v, projection, decay: None where absent; for
    the delta rule beta and its gates packed, inputs.pack_delta)."""
    spec = _spec_of(vector)
    ins = vector["inputs"]
    tensors = tuple(decode(ins.get(key)) for key in ("q", "k", "v", "projection"))
    if spec.delta_rule:
        return spec, (*tensors, pack_delta(decode(ins["beta"]), decode(ins.get("g"))))
    return spec, (*tensors, decode(ins.get(DECAY_ARGUMENTS.get(spec.decay))))


def _recompute(path: Path) -> list[str]:
    """Problems with one vector's stored output against a fresh arb computation."""
    vector = json.loads(path.read_text())
    spec, (q, k, v, w, decay) = _inputs(vector)
    fresh = _exact_decimal(validate(q, k, v, spec, w, decay), spec).ravel()
    stored = vector["output"]["values"]
    bad = [i for i, (a, b) in enumerate(zip(fresh, stored, strict=True)) if not _agree(a, b)]
    if bad:
        i = bad[0]
        return [f"{path}: output {i} is {stored[i]}, recomputed {fresh[i]} ({len(bad)} differ)"]
    return []


def _agree(a: str, b: str) -> bool:
    """Two decimal strings equal to AGREE_BITS bits (both "nan", or both 0, counts)."""
    from mpmath import mp, mpf

    if "nan" in (a, b):
        return a == b
    with mp.workprec(4 * KAT_DIGITS):
        x, y = mpf(a), mpf(b)
        return x == y or abs(x - y) <= abs(x) * mpf(2) ** -AGREE_BITS


def not_applicable(spec: Spec) -> str | None:
    """Why the known-answer vectors do not judge a kernel of `spec`, or None."""
    defining = spec.defining
    if defining in OTHER_KAT_SPECS:
        return None
    if defining.plain and defining.eps == 0 and defining.feature_map in KAT_MAPS:
        return None
    return f"no known-answer vectors for {spec}; {DEFAULT_DIR / 'README.md'} lists the specs"


def run_vectors(
    impl: Implementation, directory: Path = DEFAULT_DIR, device: str = "cpu"
) -> list[dict[str, Any]]:
    """Run the implementation on every vector of its spec (Spec.defining: map, causality,
    eps, normalisation, scale, decay, delta rule) and report, per vector, its largest error
    in units of u s, u the unit roundoff of the vector's input dtype, the difference to the
    34-digit output taken exactly; the a-priori bound there, and how many elements exceed
    their bound. NaN is required where the exact value is 0/0 (a number there is an
    infinite error); an output of the wrong type, shape, dtype or device, or an exception,
    is reported as `problem`."""
    spec = impl.spec.defining
    rows = []
    for entry in load_manifest(directory)["vectors"]:
        if _spec_of({"spec": entry}) != spec:
            continue
        vector = json.loads((Path(directory) / entry["file"]).read_text())
        _, tensors = _inputs(vector)
        q, k, v, w, decay = (None if t is None else t.to(device) for t in tensors)
        regime = regime_of(Case(**vector["case"]), spec)
        row = {"name": entry["name"], "dtype": entry["dtype"], "regime": regime}
        try:
            out = impl(q, k, v, w, decay)
            problem = _contract_problem(out, q, v)
        except ImplementationFailure as err:  # the implementation's failure is a finding
            problem = str(err)
        if problem:
            rows.append({**row, "max_error_units": math.inf, "problem": problem})
            continue
        exact = np.array(vector["output"]["values"], dtype=object).reshape(tuple(out.shape))
        got = out.detach().to("cpu", torch.float64).numpy()
        u = UNIT_ROUNDOFF[entry["dtype"]]
        scale, bound = scale_and_bound(validate(q, k, v, spec, w, decay), spec, None, u)
        e = _error_units(got, exact, scale, u)
        worst = np.unravel_index(int(np.argmax(e)), e.shape)
        rows.append(
            {
                **row,
                "max_error_units": float(e.max()),
                "bound_units": float(bound[worst]),
                "outside_bound": int((e > bound).sum()),
                "worst_index": [int(t) for t in worst],
                "undefined": int(sum(t == "nan" for t in vector["output"]["values"])),
            }
        )
    if not rows:
        raise SpecError(f"no known-answer vector for {spec} under {directory}")
    return rows


def _contract_problem(out: Any, q: torch.Tensor, v: torch.Tensor) -> str | None:
    want = (*q.shape[:3], v.shape[-1])
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a torch tensor"
    if tuple(out.shape) != want or out.dtype != q.dtype or out.device != q.device:
        return (
            f"returned {tuple(out.shape)} {out.dtype} on {out.device}, expected {want} "
            f"{q.dtype} on {q.device}"
        )
    return None


def _error_units(got: np.ndarray, exact: np.ndarray, scale: np.ndarray, u: float) -> np.ndarray:
    """|got - exact| / (u s), exact given as decimal strings. Below float64 the reference
    rounded to float64 (error 2^-53 |exact| <= 2^-29 u s for u >= 2^-24) serves; for
    float64 the difference is formed exactly, element by element."""
    undefined = exact == "nan"
    if u > 2.0**-53:
        ref = np.where(undefined, np.nan, exact).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(got == ref, 0.0, np.abs(got - ref) / (u * scale))
    else:
        e = np.zeros(got.shape)
        for index, text in np.ndenumerate(exact):
            if text != "nan" and np.isfinite(got[index]):
                diff = abs(Fraction(got[index]) - Fraction(Decimal(text)))
                e[index] = 0.0 if diff == 0 else float(diff) / (u * scale[index])
    e = np.where(~undefined & ~np.isfinite(got), np.inf, e)
    return np.where(undefined, np.where(np.isnan(got), 0.0, np.inf), e)
