"""The regimes: which inputs a verdict rests on (docs/regimes.md). Every case
the checks draw or build is in exactly one, `regime_of(case, spec)`:

- typical: what trained models feed: kinds TYPICAL_KINDS (coordinates of q and k N(0,
  sigma^2), values with a mean, a channel an order of magnitude larger among at least
  OUTLIER_TYPICAL_D) with sigma in
  TYPICAL_MAGNITUDES, a few units: the scale of the projections of layer-normed
  activations, before the spec's own scaling (x d^(-1/4), q.k / sqrt(d)). For elu, also
  every row of q and k has a coordinate at or above ELU_ROW_FLOOR = -ln(K_BUDGET): below
  it every feature of the row is under 1 / K_BUDGET, and the textbook evaluation F.elu(x)
  + 1, whose feature error is absolute (C_LIB u, families/kernelised/bound.py) where the
  golden one's is relative, may exceed the budget's K_BUDGET-fold margin there. Such rows
  (common with the checks' small d, rare with d = 64) are where whole rows of features
  shrink toward underflow: a stress.
- extreme: the dtype's limits: magnitudes whose products leave its range (above the square
  root of its largest finite value, below that of its smallest normal), and the edge of
  each kind's range (strategies.regime: elu rows of -1e6, the largest Performer norms).
- stress: the rest of what the checks draw: large and tiny magnitudes, one dominant key,
  identical tokens, rows of zeros, cancellation in V, rows of one sign.

The range of magnitudes the checks draw per spec and kind (`magnitude_range`, log10 of the
scale of q and k), whose edge starts the extreme regime:
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

Regimes are about values: shapes (N = 1, ragged N, B and H >= 2, d != dv, strides, long N)
are never a reason for a case to leave typical.
"""

from __future__ import annotations

import functools
import math

import torch

from .accuracy.verdict import K_BUDGET
from .cases import OUTLIER_FACTOR, Case
from .specs import Spec

REGIMES = ("typical", "stress", "extreme")  # mildest first
TYPICAL_KINDS = ("normal", "mean-values", "outlier-channels")
TYPICAL_MAGNITUDES = (0.1, 10**0.5)  # sigma of the coordinates of q and k
# an outlier channel among fewer coordinates is the whole vector an order larger, not an
# outlier: outlier-channels cases of smaller d are stress
OUTLIER_TYPICAL_D = 8
ELU_ROW_FLOOR = -math.log(K_BUDGET)


ADVERSARIAL_KINDS = ("negative-rows", "positive-rows", "large-norm")
# log10 of the largest scale of q and k per spec; see the module docstring
RANDOM_SIGN_TOP = {
    "softmax": 3.0,
    "elu": 1.0,
    "relu": 8.0,
    "identity": 8.0,
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


def magnitude_range(spec: Spec, kind: str, dtype: str) -> tuple[float, float]:
    """(lowest, highest) log10 magnitude of q and k for `spec` and `kind` in `dtype`
    (module docstring)."""
    dtype_top = math.log10(torch.finfo(getattr(torch, dtype)).max) * (1 - 1e-12)  # 10^top finite
    name = spec.feature_map
    if kind in ADVERSARIAL_KINDS:
        return 0.0, min(ONE_SIGNED_TOP.get(kind, {}).get(name, ADVERSARIAL_TOP[name]), dtype_top)
    # an outlier channel stays within the random-sign range too
    outlier = math.log10(OUTLIER_FACTOR) if kind == "outlier-channels" else 0.0
    return LOWEST[dtype], min(RANDOM_SIGN_TOP[name] - outlier, dtype_top)


def dtype_limits(dtype: str) -> tuple[float, float]:
    """(lowest, highest) magnitude whose products stay within the dtype's normal range."""
    info = torch.finfo(getattr(torch, dtype))
    return math.sqrt(info.tiny), math.sqrt(info.max)


@functools.lru_cache(maxsize=4096)
def regime_of(case: Case, spec: Spec) -> str:
    """The regime of `case` for `spec` (module docstring); cached, since every check result
    and every filtered draw asks, and elu's row floor builds the case's tensors."""
    low, high = dtype_limits(case.dtype)
    edge = 10.0 ** magnitude_range(spec, case.kind, case.dtype)[1]
    if not low <= case.magnitude <= high or case.magnitude >= edge * (1 - 1e-9):
        return "extreme"
    lo, hi = TYPICAL_MAGNITUDES
    if case.kind not in TYPICAL_KINDS or not lo <= case.magnitude <= hi * (1 + 1e-12):
        return "stress"
    if case.kind == "outlier-channels" and case.d < OUTLIER_TYPICAL_D:
        return "stress"
    if spec.feature_map == "elu":
        q, k, _, _ = case.tensors()
        rows = torch.cat([q, k], dim=-2).double().amax(dim=-1)
        if bool((rows < ELU_ROW_FLOOR).any()):
            return "stress"
    return "typical"
