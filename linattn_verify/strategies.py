"""Hypothesis strategies for attention inputs: `cases(spec)` draws a Case (cases.py).

Shapes include N = 1, ragged N (not multiples of 2, 16 or 64 chunk sizes), B and H up to 3,
d != dv, and m = d among the projection sizes. Every draw of tensors comes from a drawn
seed through a torch.Generator (Hypothesis does not seed torch). The magnitudes and the
regimes they belong to are regimes.py's; `regimes=` draws from some of them.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import numpy as np
from hypothesis import strategies as st

from .cases import KINDS, Case, Pair
from .families import family_of
from .inputs import UNIT_ROUNDOFF
from .regimes import REGIMES, TYPICAL_KINDS, TYPICAL_MAGNITUDES, magnitude_range, regime_of
from .specs import Spec

DTYPES = tuple(UNIT_ROUNDOFF)
RAGGED_N = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33)


def magnitudes(
    spec: Spec, kind: str, dtype: str, regimes: Collection[str] = REGIMES
) -> st.SearchStrategy[float]:
    """10^e for e in the range of `spec` and `kind` (regimes.magnitude_range), its ends
    included; the part of the range that `regimes` can hold."""
    low, top = magnitude_range(spec, kind, dtype)
    if set(regimes) == {"typical"}:
        low, top = (math.log10(t) for t in TYPICAL_MAGNITUDES)
        top = min(top, magnitude_range(spec, kind, dtype)[1] - 1e-9)  # below the edge
    ends = (st.just(low), st.just(top)) if "extreme" in regimes else ()
    middle = () if set(regimes) == {"extreme"} else (st.floats(low, top),)
    one = (st.just(0.0),) if "typical" in regimes else ()
    return st.one_of(*one, *middle, *ends).map(lambda e: float(10.0**e))


# (kind, log10 magnitude or "top" / "low": the ends of its range) of the corner cases
CORNERS = (
    ("normal", 0.0), ("normal", 0.45), ("mean-values", 0.25),
    ("outlier-channels", 0.0), ("identical", 0.0), ("dominant", 0.5), ("cancel", 0.0),
    ("zero-rows", 0.0), ("normal", "low"), ("normal", "top"), ("negative-rows", "top"),
    ("positive-rows", "top"), ("large-norm", "top"),
)  # fmt: skip


def corner_cases(
    spec: Spec,
    dtypes_allowed: tuple[str, ...] = DTYPES,
    device: str = "cpu",
    regimes: Collection[str] = REGIMES,
) -> list[Case]:
    """Cases random draws reach rarely, for each dtype (B = H = 2, ragged N = 9, dv = 2 and
    d = m = 3, or 8 for the typical kinds, whose rows then have a coordinate above elu's
    ELU_ROW_FLOOR): one of each typical kind, the structured stress kinds (the delta
    rule's too), and the ends of the range (random signs at the smallest and largest
    magnitude, each one-signed kind at its largest); those of `regimes`."""
    out = []
    corners = CORNERS + tuple((kind, 0.0) for kind in family_of(spec).kinds)
    for dtype in dtypes_allowed:
        for kind, at in corners:
            low, top = magnitude_range(spec, kind, dtype)
            exponent = {"low": low, "top": top}.get(at, at)
            d = 8 if kind in TYPICAL_KINDS and at not in ("low", "top") else 3
            m = d if spec.info.needs_projection else None
            case = Case(2, 2, 9, d, 2, dtype, kind, 10.0**exponent, 1, m, device)
            if set(regimes) == set(REGIMES) or regime_of(case, spec) in regimes:
                out.append(case)
    return out


@st.composite
def _random_cases(draw: st.DrawFn, spec: Spec, dtypes_allowed, kinds, max_n, device, regimes):
    """A Case for `spec`: shape, dtype, kind, magnitude, seed (and m for Performer maps),
    drawn where `regimes` lie (cases() keeps those in them)."""
    n = draw(st.sampled_from([n for n in RAGGED_N if n <= max_n]))
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    dv = draw(st.integers(1, 5))
    m = draw(st.sampled_from((1, 2, d, 2 * d, 8))) if spec.info.needs_projection else None
    dtype = draw(st.sampled_from(dtypes_allowed))
    if set(regimes) == {"typical"}:
        kinds = tuple(k for k in kinds if k in TYPICAL_KINDS) or kinds
    kind = draw(st.sampled_from(kinds))
    magnitude = draw(magnitudes(spec, kind, dtype, regimes))
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(b, h, n, d, dv, dtype, kind, magnitude, seed, m, device)


def cases(
    spec: Spec,
    dtypes_allowed: tuple[str, ...] = DTYPES,
    kinds: tuple[str, ...] | None = None,
    max_n: int = max(RAGGED_N),
    device: str = "cpu",
    regimes: Collection[str] = REGIMES,
) -> st.SearchStrategy[Case]:
    """Random cases and, about as often, a corner case, of `regimes` (all by default);
    kinds: those drawn (default KINDS, and the spec's family's own: Family.kinds)."""
    kinds = kinds or KINDS + family_of(spec).kinds
    corners = corner_cases(spec, dtypes_allowed, device, regimes)
    corners = [c for c in corners if c.kind in kinds]
    randoms = _random_cases(spec, dtypes_allowed, kinds, max_n, device, regimes)
    if set(regimes) != set(REGIMES):
        randoms = randoms.filter(lambda case: regime_of(case, spec) in regimes)
    return st.one_of(randoms, st.sampled_from(corners)) if corners else randoms


@st.composite
def kernel_pairs(
    draw: st.DrawFn, kind: str, d: int, norm: tuple[float, float], offset: float = 0.5
) -> Pair:
    """Inputs (x, y) of a random-feature kernel estimate with |x + y| (|x - y| for trig) in
    `norm` and a common offset of norm <= `offset` (so |x|, |y| <= norm + offset)."""
    r = draw(st.floats(*norm), label="norm")
    t = draw(st.floats(0.0, 1.0), label="split")
    s = draw(st.floats(0.0, offset), label="offset")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="direction seed"))
    u, p = rng.standard_normal((2, d))
    u /= np.linalg.norm(u)
    p *= s / max(np.linalg.norm(p), 1e-300)
    sign = -1.0 if kind == "performer-trig" else 1.0  # x - y = r u for trig, else x + y
    return Pair(t * r * u + p, sign * ((1 - t) * r * u - p))
