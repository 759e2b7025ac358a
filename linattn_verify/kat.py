"""Known-answer vectors: inputs stored exactly, outputs exact to 34 significant digits.

Layout (references/README.md says how to read it without this package):
- references/vectors/NAME.json, one vector each: the spec, the case it was built from,
  the inputs q, k, v (and the projection W) as IEEE bit patterns in their dtype, and the
  output as decimal strings of KAT_DIGITS significant digits ("nan" where it is 0/0);
- references/manifest.json: generator version and, per vector, its spec, shape, dtype and
  the sha256 of its file.
`build` writes them deterministically (the same bytes twice); `check` verifies every hash
and recomputes a sample with the arb engine; `run_vectors` runs an implementation on them
and reports its error per vector in units of u s of its dtype (DESIGN "Accuracy").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .accuracy.bound import scale_and_bound
from .accuracy.verdict import error_units
from .cases import Case
from .inputs import UNIT_ROUNDOFF, validate
from .reference.arb import arb_decimal
from .specs import FEATURE_MAPS, Spec, SpecError
from .strategies import regime

GENERATOR_VERSION = 1
KAT_DIGITS = 34  # 34 decimal digits: 112 bits, beyond the 100 the vectors promise
AGREE_BITS = 100  # a recomputed value agrees with a stored one to this many bits
FORMAT = "linattn-verify known-answer vector"
BITS = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32, "float64": np.uint64}
DEFAULT_DIR = Path("references")


def _extreme(spec: Spec) -> Case:
    """float16 at the edge of the spec's regime: elu rows of -65504 (features underflow),
    large Performer norms, a dominant key with the largest logits elsewhere."""
    name = spec.feature_map
    if name == "elu":
        kind = "negative-rows"
    elif name.startswith("performer"):
        kind = "large-norm"
    else:
        kind = "dominant"
    top = regime(spec, kind, "float16")[1]
    m = 4 if spec.info.needs_projection else None
    return Case(1, 2, 16, 4, 4, "float16", kind, 10.0**top, seed=7, m=m)


def vector_cases(spec: Spec) -> list[tuple[str, Case]]:
    """The vectors of one spec: (label, case). Canonical shapes (N = 1, ragged N, d != dv,
    every dtype) and adversarial ones (cancellation in V, the regime's extreme, zero rows:
    0/0 for relu and cosformer, near-zero denominators for performer-trig, N = 512)."""

    def m(d: int) -> int | None:
        return d if spec.info.needs_projection else None  # d = m for random features

    return [
        ("n1-float32", Case(1, 1, 1, 4, 3, "float32", seed=1, m=m(4))),
        ("ragged-float32", Case(2, 3, 7, 5, 3, "float32", seed=2, m=m(5))),
        ("float16", Case(1, 2, 33, 8, 8, "float16", seed=3, m=m(8))),
        ("bfloat16", Case(1, 2, 17, 4, 6, "bfloat16", seed=4, m=m(4))),
        ("float64", Case(2, 1, 9, 3, 2, "float64", seed=5, m=m(3))),
        ("cancel-float32", Case(1, 2, 16, 4, 4, "float32", "cancel", seed=6, m=m(4))),
        ("extreme-float16", _extreme(spec)),
        ("zero-rows-float32", Case(1, 2, 9, 3, 2, "float32", "zero-rows", seed=8, m=m(3))),
        ("long-float32", Case(1, 1, 512, 8, 8, "float32", seed=9, m=m(8))),
    ]


def all_vectors() -> Iterator[tuple[str, Spec, Case]]:
    """(name, spec, case) of every vector, in a fixed order."""
    for name in FEATURE_MAPS:
        for causal in (False, True):
            spec = Spec(name, causal=causal)
            for label, case in vector_cases(spec):
                yield f"{name}-{'causal' if causal else 'full'}-{label}", spec, case


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


def make_vector(name: str, spec: Spec, case: Case) -> dict[str, Any]:
    """The vector `name`: inputs from `case`, output from the arb engine."""
    q, k, v, w = case.tensors()
    x = validate(q, k, v, spec, w)
    out = arb_decimal(x, spec, KAT_DIGITS)
    return {
        "format": FORMAT,
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "spec": {
            "feature_map": spec.feature_map,
            "causal": spec.causal,
            "eps": spec.eps,
            "formula": spec.info.source,
        },
        "case": asdict(case),
        "inputs": {"q": _encode(q), "k": _encode(k), "v": _encode(v), "projection": _encode(w)},
        "output": {"shape": list(out.shape), "digits": KAT_DIGITS, "values": out.ravel().tolist()},
    }


def _dumps(payload: Any) -> bytes:
    return (json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n").encode()


def build(
    directory: Path = DEFAULT_DIR,
    only: Callable[[str], bool] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write every vector (or those whose name `only` accepts) and the manifest under
    `directory`; a run that fails leaves the previous vectors in place. Returns the manifest."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / "vectors.building"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    entries = []
    chosen = [t for t in all_vectors() if only is None or only(t[0])]
    for index, (name, spec, case) in enumerate(chosen, 1):
        data = _dumps(make_vector(name, spec, case))
        (staging / f"{name}.json").write_bytes(data)
        b, h, n, d, dv = case.b, case.h, case.n, case.d, case.dv
        entries.append(
            {
                "file": f"vectors/{name}.json",
                "name": name,
                "feature_map": spec.feature_map,
                "causal": spec.causal,
                "eps": spec.eps,
                "dtype": case.dtype,
                "shape_B_H_N_d_dv": [b, h, n, d, dv],
                "m": case.m,
                "kind": case.kind,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        if progress:
            progress(f"[{index}/{len(chosen)}] {name}")
    manifest = {
        "format": "linattn-verify known-answer vectors manifest",
        "generator_version": GENERATOR_VERSION,
        "digits": KAT_DIGITS,
        "vectors": entries,
    }
    final = directory / "vectors"
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    temp = directory / "manifest.json.building"
    temp.write_bytes(_dumps(manifest))
    os.replace(temp, directory / "manifest.json")
    return manifest


def load_manifest(directory: Path = DEFAULT_DIR) -> dict[str, Any]:
    path = Path(directory) / "manifest.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SpecError(f"cannot read {path}: {err}") from None


def check(
    directory: Path = DEFAULT_DIR, sample: int = 8, progress: Callable[[str], None] | None = None
) -> list[str]:
    """Problems with the vectors under `directory` (empty when all is well): every file's
    sha256 against the manifest, no file missing or unlisted, and `sample` vectors
    (spread over the list) recomputed with the arb engine to AGREE_BITS bits."""
    directory = Path(directory)
    manifest = load_manifest(directory)
    problems = []
    listed = {e["file"] for e in manifest["vectors"]}
    for path in sorted((directory / "vectors").glob("*.json")):
        if f"vectors/{path.name}" not in listed:
            problems.append(f"{path}: not in the manifest")
    for entry in manifest["vectors"]:
        path = directory / entry["file"]
        if not path.is_file():
            problems.append(f"{path}: missing (listed in the manifest)")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
            problems.append(f"{path}: sha256 does not match the manifest (file changed)")
    if problems:
        return problems
    entries = manifest["vectors"]
    step = max(1, len(entries) // max(sample, 1))
    for entry in entries[::step][:sample]:
        path = directory / entry["file"]
        if progress:
            progress(f"recomputing {entry['name']}")
        problems += _recompute(path)
    return problems


def _inputs(vector: dict[str, Any]) -> tuple[Spec, tuple[torch.Tensor | None, ...]]:
    s = vector["spec"]
    spec = Spec(s["feature_map"], causal=s["causal"], eps=s["eps"])
    ins = vector["inputs"]
    return spec, tuple(decode(ins[key]) for key in ("q", "k", "v", "projection"))


def _recompute(path: Path) -> list[str]:
    """Problems with one vector's stored output against a fresh arb computation."""
    vector = json.loads(path.read_text())
    spec, (q, k, v, w) = _inputs(vector)
    fresh = arb_decimal(validate(q, k, v, spec, w), spec, KAT_DIGITS).ravel()
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


def run_vectors(
    fn: Callable[..., torch.Tensor],
    feature_map: str,
    causal: bool = False,
    directory: Path = DEFAULT_DIR,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Run fn (DESIGN's contract) on every vector of the spec (feature_map, causal) and
    report, per vector, its largest error in units of u s of the output's dtype (NaN
    required where the exact value is 0/0: a number there is reported as an infinite error)."""
    spec = Spec(feature_map, causal=causal)
    rows = []
    for entry in load_manifest(directory)["vectors"]:
        if entry["feature_map"] != feature_map or entry["causal"] != causal:
            continue
        vector = json.loads((Path(directory) / entry["file"]).read_text())
        _, tensors = _inputs(vector)
        q, k, v, w = (None if t is None else t.to(device) for t in tensors)
        kwargs = {"projection": w} if spec.info.needs_projection else {}
        out = fn(q, k, v, **kwargs)
        ref = np.array([float(t) for t in vector["output"]["values"]]).reshape(out.shape)
        dtype = str(out.dtype).removeprefix("torch.")
        u = UNIT_ROUNDOFF[dtype]
        scale, _ = scale_and_bound(validate(q, k, v, spec, w), spec, None, u)
        got = out.detach().to("cpu", torch.float64).numpy()
        defined = ~np.isnan(ref)
        e = np.where(defined, error_units(got, ref, scale, u), np.where(np.isnan(got), 0, np.inf))
        rows.append(
            {
                "name": entry["name"],
                "dtype": dtype,
                "max_error_units": float(e.max()),
                "worst_index": [int(t) for t in np.unravel_index(int(np.argmax(e)), e.shape)],
                "undefined": int((~defined).sum()),
            }
        )
    if not rows:
        raise SpecError(f"no vector for {spec} under {directory}")
    return rows
