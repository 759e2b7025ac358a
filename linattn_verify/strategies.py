"""Hypothesis strategies for attention inputs: `cases(spec)` draws a Case (cases.py).

Shapes include N = 1, ragged N (not multiples of 2, 16 or 64 chunk sizes), B and H up to 3,
d != dv, and m = d among the projection sizes. Every draw of tensors comes from a drawn
seed through a torch.Generator (Hypothesis does not seed torch).

Magnitudes (the regime each spec is checked in, log10 of the scale of q and k):
- random-sign kinds (normal, identical, dominant, zero-rows, cancel): from LOWEST[dtype]
  (1e-4 in float16, 1e-15 in bfloat16 and float32, 1e-100 in float64) up to
  RANDOM_SIGN_TOP[spec]. Above it the exact output is still defined but no evaluation in
  float32 can resolve it: elu features exp(q_l) exp(k_l) of opposite-signed coordinates
  underflow pair by pair (e^-100 below float32's range) while each row's own largest
  feature is moderate; softmax, Performer and taylor exponents or squares leave float32;
- negative-rows, positive-rows and large-norm (adversarial rows): up to
  ADVERSARIAL_TOP[spec]; elu's negative rows up to 1e6, float16's whole range (rows of
  -60000: features exp(x) underflow unless shifted, and nothing can overflow; beyond 1e6
  a shift x - max x is exact only with care, e.g. x + n ln 2 with ln 2 split in two parts
  holds to ~1.4e6, so the checks do not claim more), its
  positive rows up to 1e8 (features x + 1 whose sums overflow float16), its large-norm
  rows mix signs and stay within the random-sign limit. Performer norms up to 10^0.8 ~ 6:
  there an unstabilised exp(W x' - |x'|^2/2) leaves float16's range both ways (e^11 and
  e^-17 are its limits). Beyond about 7, a query and a key whose largest features sit on
  different random features have every product exp(a_ql + a_kl) below float32's range
  once each row is scaled by its own largest feature (spreads 2 |w| |x'| > 44 each), so
  their similarity underflows; resolving it needs a scale per feature column of the
  keys, which the built-in forms do not have (a known limit, not a regime the checks
  claim).
Both are capped by the dtype's largest finite value (values are clipped there).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st

from .cases import KINDS, Case, Pair
from .inputs import UNIT_ROUNDOFF
from .specs import Spec

DTYPES = tuple(UNIT_ROUNDOFF)
ADVERSARIAL_KINDS = ("negative-rows", "positive-rows", "large-norm")
RAGGED_N = (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 23, 31, 33)
# log10 of the largest scale of q and k per spec; see the module docstring
RANDOM_SIGN_TOP = {
    "softmax": 3.0,
    "elu": 1.0,
    "relu": 8.0,
    "performer-positive": 0.5,
    "performer-hyperbolic": 0.5,
    "performer-trig": 0.5,
    "cosformer": 8.0,
    "taylor": 2.0,
}
ADVERSARIAL_TOP = {**RANDOM_SIGN_TOP, "performer-positive": 0.8}
ADVERSARIAL_TOP |= {"performer-hyperbolic": 0.8, "performer-trig": 1.0}
# rows of one sign: elu's negative ones have features exp(x) (nothing overflows, all may
# underflow), its positive ones x + 1 (products stay within float32 up to 1e8 x 1e8)
ONE_SIGNED_TOP = {"negative-rows": {"elu": 6.0}, "positive-rows": {"elu": 8.0}}
# log10 of the smallest scale per dtype: feature products of such values (1e-8 in float32
# compute for float16 inputs, 1e-30 for bfloat16/float32, 1e-200 for float64) stay far
# above the compute dtype's smallest normal, so no significant term underflows
LOWEST = {"float16": -4.0, "bfloat16": -15.0, "float32": -15.0, "float64": -100.0}


def regime(spec: Spec, kind: str, dtype: str) -> tuple[float, float]:
    """(lowest, highest) log10 magnitude of q and k for `spec` and `kind` in `dtype`
    (module docstring)."""
    dtype_top = math.log10(torch.finfo(getattr(torch, dtype)).max) * (1 - 1e-12)  # 10^top finite
    name = spec.feature_map
    if kind in ADVERSARIAL_KINDS:
        return 0.0, min(ONE_SIGNED_TOP.get(kind, {}).get(name, ADVERSARIAL_TOP[name]), dtype_top)
    return LOWEST[dtype], min(RANDOM_SIGN_TOP[name], dtype_top)


def magnitudes(spec: Spec, kind: str, dtype: str) -> st.SearchStrategy[float]:
    """10^e for e in the regime of `spec` and `kind`, its ends included."""
    low, top = regime(spec, kind, dtype)
    exponents = st.one_of(st.just(0.0), st.floats(low, top), st.just(top))
    return exponents.map(lambda e: float(10.0**e))


def corner_cases(
    spec: Spec, dtypes_allowed: tuple[str, ...] = DTYPES, device: str = "cpu"
) -> list[Case]:
    """The edges of the regime, which random draws reach rarely: for each dtype, random
    signs at the smallest and the largest magnitude and each adversarial kind at its
    largest (B = H = 2, ragged N = 9, d = 3 != dv = 2, m = d)."""
    m = 3 if spec.info.needs_projection else None
    edges = [("normal", 0)] + [(kind, 1) for kind in ("normal", *ADVERSARIAL_KINDS)]
    return [
        Case(2, 2, 9, 3, 2, dtype, kind, 10.0 ** regime(spec, kind, dtype)[end], 1, m, device)
        for dtype in dtypes_allowed
        for kind, end in edges
    ]


@st.composite
def random_cases(
    draw: st.DrawFn,
    spec: Spec,
    dtypes_allowed: tuple[str, ...] = DTYPES,
    kinds: tuple[str, ...] = KINDS,
    max_n: int = max(RAGGED_N),
    device: str = "cpu",
) -> Case:
    """A Case for `spec`: shape, dtype, kind, magnitude, seed (and m for Performer maps)."""
    n = draw(st.sampled_from([n for n in RAGGED_N if n <= max_n]))
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    d = draw(st.integers(1, 6))
    dv = draw(st.integers(1, 5))
    m = draw(st.sampled_from((1, 2, d, 2 * d, 8))) if spec.info.needs_projection else None
    dtype = draw(st.sampled_from(dtypes_allowed))
    kind = draw(st.sampled_from(kinds))
    magnitude = draw(magnitudes(spec, kind, dtype))
    seed = draw(st.integers(0, 2**32 - 1))
    return Case(b, h, n, d, dv, dtype, kind, magnitude, seed, m, device)


def cases(
    spec: Spec,
    dtypes_allowed: tuple[str, ...] = DTYPES,
    kinds: tuple[str, ...] = KINDS,
    max_n: int = max(RAGGED_N),
    device: str = "cpu",
) -> st.SearchStrategy[Case]:
    """Random cases and, about as often, a corner case of the regime."""
    corners = [c for c in corner_cases(spec, dtypes_allowed, device) if c.kind in kinds]
    randoms = random_cases(spec, dtypes_allowed, kinds, max_n, device)
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
