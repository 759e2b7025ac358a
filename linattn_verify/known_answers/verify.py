"""Checking the stored vectors: the manifest lists exactly the vectors this generator
builds, each entry as `build` would write it for its file (spec, dtype, shape, size,
sha256), no file missing or unlisted, and every output (or a sample) recomputed with the arb
engine agreeing with the stored one to AGREE_BITS bits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpmath import mp, mpf

from ..families import validate
from .catalogue import all_vectors
from .files import DEFAULT_DIR, load_manifest, spec_of, stored_tensors
from .generate import GENERATOR_VERSION, KAT_DIGITS, exact_decimal, manifest_entry

AGREE_BITS = 100  # a recomputed value agrees with a stored one to this many bits


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
            if entry != manifest_entry(entry["name"], spec, case, data):
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
        spec = spec_of(vector)
        same = (
            vector["name"] == entry["name"]
            and spec == spec_of({"spec": entry})
            and vector["inputs"]["q"]["dtype"] == entry["dtype"]
        )
    except (ValueError, KeyError, TypeError) as err:
        return [f"{path}: not a readable vector ({type(err).__name__}: {err})"]
    return [] if same else [f"{path}: its spec or dtype differs from the manifest entry"]


def _recompute(path: Path) -> list[str]:
    """Problems with one vector's stored output against a fresh arb computation."""
    vector = json.loads(path.read_text())
    spec, (q, k, v, w, decay) = stored_tensors(vector)
    fresh = exact_decimal(validate(q, k, v, spec, w, decay), spec).ravel()
    stored = vector["output"]["values"]
    bad = [i for i, (a, b) in enumerate(zip(fresh, stored, strict=True)) if not _agree(a, b)]
    if bad:
        i = bad[0]
        return [f"{path}: output {i} is {stored[i]}, recomputed {fresh[i]} ({len(bad)} differ)"]
    return []


def _agree(a: str, b: str) -> bool:
    """Two decimal strings equal to AGREE_BITS bits (both "nan", or both 0, counts)."""
    if "nan" in (a, b):
        return a == b
    with mp.workprec(4 * KAT_DIGITS):
        x, y = mpf(a), mpf(b)
        return x == y or abs(x - y) <= abs(x) * mpf(2) ** -AGREE_BITS
