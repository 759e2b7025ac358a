"""Building the vectors: each one's inputs (the case's draw, stored exactly) and its output
(the spec's arb engine, KAT_DIGITS significant digits, "nan" where it is 0/0), the manifest's
entry for its file, and `build`, which writes them all deterministically (the same bytes
every time)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cases import Case
from ..families import case_arguments, family_of, validate
from ..inputs import AttentionInputs
from ..specs import Spec, SpecError
from .catalogue import all_vectors
from .files import DEFAULT_DIR, dumps, encode

GENERATOR_VERSION = 1
KAT_DIGITS = 34  # 34 decimal digits: 112 bits, beyond the 100 the vectors promise
FORMAT = "linattn-verify known-answer vector"


def vector_inputs(spec: Spec, case: Case) -> tuple[tuple[torch.Tensor | None, ...], dict]:
    """(q, k, v, projection, decay) as families.case_arguments draws them, and a vector's stored
    inputs: q, k, v, the projection, and the decay's gamma or g, or the delta rule's beta
    (and g) apart, as the kernels take them."""
    q, k, v, w, decay = tensors = case_arguments(case, spec)
    inputs = {"q": encode(q), "k": encode(k), "v": encode(v), "projection": encode(w)}
    if decay is not None:  # the family's arguments, as its kernels take them
        keywords = family_of(spec).keywords(spec, decay, "bhnd")
        inputs |= {key: encode(t) for key, t in keywords.items()}
    return tensors, inputs


def make_vector(name: str, spec: Spec, case: Case) -> dict[str, Any]:
    """The vector `name`: inputs from `case` (vector_inputs), output from the arb engine."""
    (q, k, v, w, decay), inputs = vector_inputs(spec, case)
    out = exact_decimal(validate(q, k, v, spec, w, decay), spec)
    described = {"feature_map": spec.feature_map, "causal": spec.causal, "eps": spec.eps}
    if not spec.plain:  # a plain vector's bytes are those of generator version 1
        described |= _spec_fields(spec)
    return {
        "format": FORMAT,
        "generator_version": GENERATOR_VERSION,
        "name": name,
        "spec": described | family_of(spec).formulas(spec),
        "case": json.loads(case.to_json()),
        "inputs": inputs,
        "output": {"shape": list(out.shape), "digits": KAT_DIGITS, "values": out.ravel().tolist()},
    }


def exact_decimal(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """The exact output as KAT_DIGITS-digit decimal strings, by the spec's arb engine."""
    engine = family_of(spec).exact_decimal
    if engine is None:
        raise SpecError(f"{spec}: its family has no known-answer vectors (Family.exact_decimal)")
    return engine(x, spec, KAT_DIGITS)


def _spec_fields(spec: Spec) -> dict[str, Any]:
    """What a vector's spec and manifest entry say beyond map, causality and eps: its
    normalisation, scale and decay, and its family's own fields (Family.vector_fields)."""
    described = {"normalize": spec.normalize, "scale": spec.scale, "decay": spec.decay}
    return described | family_of(spec).vector_fields(spec)


def manifest_entry(name: str, spec: Spec, case: Case, data: bytes) -> dict[str, Any]:
    """The manifest's entry for the vector `name` whose file holds `data`."""
    return {
        "file": f"vectors/{name}.json",
        "name": name,
        "feature_map": spec.feature_map,
        "causal": spec.causal,
        "eps": spec.eps,
        **_spec_fields(spec),
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
        data = dumps(make_vector(name, spec, case))
        (staging / f"{name}.json").write_bytes(data)
        entries.append(manifest_entry(name, spec, case, data))
        if progress:
            progress(f"[{index}/{len(chosen)}] {name}")
    manifest = {
        "format": "linattn-verify known-answer vectors manifest",
        "generator_version": GENERATOR_VERSION,
        "digits": KAT_DIGITS,
        "vectors": entries,
    }
    (directory / "manifest.json.building").write_bytes(dumps(manifest))
    shutil.rmtree(directory / "vectors", ignore_errors=True)
    staging.rename(directory / "vectors")
    os.replace(directory / "manifest.json.building", directory / "manifest.json")
    return manifest
