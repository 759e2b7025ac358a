"""Running an implementation on the vectors of its spec: per vector its largest error in
units of u s of the vector's dtype (the difference to the stored decimal output taken
exactly; docs/accuracy.md), the a-priori bound there, how many elements exceed theirs, or
the broken contract or exception (`problem`) instead."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..accuracy.bound import scale_and_bound
from ..cases import Case
from ..families import validate
from ..inputs import UNIT_ROUNDOFF
from ..regimes import regime_of
from ..specs import SpecError
from ..under_test import Implementation, ImplementationFailure
from .files import DEFAULT_DIR, load_manifest, spec_of, stored_tensors


def run_vectors(
    impl: Implementation, directory: Path = DEFAULT_DIR, device: str = "cpu"
) -> list[dict[str, Any]]:
    """Run the implementation on every vector of its spec (Spec.defining: map, causality,
    eps, normalisation, scale, decay, delta rule) and report, per vector, its largest error
    in units of u s, u the unit roundoff of the vector's input dtype, the difference to the
    34-digit output taken exactly; the a-priori bound there, and how many elements exceed
    their bound. NaN is required where the exact value is 0/0 (a number there is an
    infinite error); an output of the wrong type, shape, dtype or device, or an exception,
    is reported as `problem`; a vector of a head dimension the implementation does not
    take (Implementation.head_dims) is not run, its row `skipped` with why."""
    spec = impl.spec.defining
    rows = []
    for entry in load_manifest(directory)["vectors"]:
        if spec_of({"spec": entry}) != spec:
            continue
        vector = json.loads((Path(directory) / entry["file"]).read_text())
        _, tensors = stored_tensors(vector)
        q, k, v, w, decay = (None if t is None else t.to(device) for t in tensors)
        case = Case(**vector["case"])
        row = {"name": entry["name"], "dtype": entry["dtype"], "regime": regime_of(case, spec)}
        if impl.head_dims.fit(case) != case:
            rows.append({**row, "skipped": f"d = {case.d}, outside its claim ({impl.head_dims})"})
            continue
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
