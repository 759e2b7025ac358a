"""The a-priori floating-point error bound, and the scale errors are measured against.

Standard model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2.2
and 3.1): fl(a op b) = (a op b)(1 + delta), |delta| <= u, no underflow or overflow; a sum
or dot product of n terms in any order has error <= gamma_n sum |terms|, gamma_n =
n u / (1 - n u) (Lemma 3.1 and eq. 3.5); elementary functions return within C_LIB units.

For attention out_i = N_i / (eps + D_i), N_i = sum_j a_ij v_j, D_i = sum_j a_ij:
- each weight a_ij is computed within the family's error bound (Family.sums_bound: the
  features' psi and a decay's eta, families/kernelised and families/decayed; softmax's
  exponential, families/softmax) and summed over m products; then N and D sum over Nk keys
  and eps is added: in any order (quadratic, linear, chunked), with gamma = gamma_{m + Nk +
  1}, |dN_ic| <= (1 + gamma) F_ic + gamma A_ic and |dD_i| <= (1 + gamma) F_i + gamma A_i,
  where A sums |a_ij| |v| (resp. 1) and F the weights' errors times |v| (resp. 1);
- the quotient: |d out| <= (|dN| + |out| |dD|) / (|eps + D| - |dD|) (1 + u) + u |out|.
The feature models (rounding.FEATURE_MODEL, feature_model) say what psi admits: "standard"
every sane evaluation of each map, the textbook ones included; "relative" (vet --strict)
elu features to relative accuracy in entirely negative rows too.
The bound is reported in units of u * s_ic, s_ic = sum_j |a_ij| |v_jc| / |eps + D_i| (for
the signed performer-trig map: |phi(q)|.|phi(k)| in place of |a|), the magnitude the
computation works at (docs/accuracy.md). The sums are evaluated in arb balls, so that the
bound carries no rounding error of its own, or, for long sequences of a family with a
float64 engine (Family.sums_bound.fast), in float64 with their own rounding bounded
(_fast_sums: within about 1e-9 of the balls', never below); the bound is infinite where n
u >= 1.

Where: ball_sums.py (a head's sums in balls), fast_sums.py (in float64), each from the
family's terms (Family.sums_bound); this module picks the engine, keeps the ball sums, and
turns a head's sums into s and the bound (and asks the family for the denominator's
condition number); the state's bounds are state_bounds.py's.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict

import numpy as np

from ..families import family_of
from ..inputs import AttentionInputs
from ..reference.balls import Head, working_precision
from ..reference.certified import SAFETY
from ..reference.common import MAX_PREC
from ..rounding import FEATURE_MODEL, gamma
from ..rounding import feature_model as feature_model  # re-exported (7 importers)
from ..specs import Spec, SpecError
from .ball_sums import HeadSums, _arb_sums
from .fast_sums import _fast_ratios

BOUND_PREC = 64  # bits for the bound's own arithmetic: balls keep it rigorous
FAST_BOUND_WORK = 2**16  # query-key pairs per head beyond which the sums run in float64
# Bytes of heads' ball sums kept (_head_sums): the checks meet a head again (batch-head and
# layout permute heads, accuracy meets the search's cases), and so do the zoo's and the
# property suite's kernels of one spec; a small case's sums are a few KiB, a long decayed
# head's megabytes (arb bounds them at any N): the least recent go first past this
KEPT_BYTES = 2**28


def gamma_probabilistic(n: int, u: float, lam: float) -> float:
    """Higham & Mary 2019 ("A new approach to probabilistic rounding error analysis", SISC
    41(5), Thm. 3.1): with rounding errors independent and of mean zero, a product of n
    factors (1 + delta) is within exp(lam sqrt(n) u + n u^2 / (1 - u)) - 1 of 1 with
    probability at least 1 - 2 exp(-lam^2 (1 - u)^2 / 2); `probabilistic_lambda` picks lam."""
    return math.expm1(lam * math.sqrt(n) * u + n * u * u / (1 - u))


def probabilistic_lambda(terms: int, failure: float, u: float) -> float:
    """The lam for which `terms` products (each sum's terms, all elements) all hold but with
    probability `failure` at most (a union bound over Higham & Mary's Thm. 3.1)."""
    return math.sqrt(2 * math.log(2 * terms / failure)) / (1 - u)


def _fast_sums(head: Head, spec: Spec, u: float) -> HeadSums:
    """HeadSums in float64 from the family's float64 sums (Family.sums_bound.fast), the same
    quantities as _arb_sums' and in the same way, only with the sums' own rounding bounded
    a posteriori: for long sequences, where ball arithmetic is too slow. Within about 1e-9
    of _arb_sums' (rho and the FEW_ROUNDINGS of certified_decay.py, and the features' upper
    bounds)."""
    a, f, den, m = family_of(spec).sums_bound.fast(head, spec, u)
    return _fast_ratios(a, f, den, spec, head.q.shape[1], u, m)


def _bound_rows(sums: HeadSums, out, u: float, nk: int, tiny: float, lam: float | None):
    """(scale, bound in units of u s) of one head from its sums (module docstring); out is
    |ref| or None (then s stands in for it). NaN where the denominator is exactly 0."""
    g = gamma(sums.m + nk + 1, u)
    if lam is not None:
        g = min(g, gamma_probabilistic(sums.m + nk + 1, u, lam))
    dv = sums.a.shape[1] - 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = sums.a[:, :dv].copy()  # the sums are kept (_head_sums): never written
        out = s if out is None else out
        err_den = (1 + g) * sums.f[:, -1:] + g * sums.a[:, -1:]
        err_num = (1 + g) * sums.f[:, :dv] + g * sums.a[:, :dv]
        err = (err_num + out * err_den) / (1 - err_den) * (1 + u) + u * out + tiny / 2
        err = np.where(err_den < 1, err * SAFETY, np.inf)
        bound = np.where(err == 0, 0.0, np.where(s > 0, err / (u * s), np.inf))
    s[sums.zero], bound[sums.zero] = np.nan, np.nan
    return s, bound


def scale_and_bound(
    x: AttentionInputs,
    spec: Spec,
    ref: np.ndarray | None,
    u: float,
    tiny: float = 0.0,
    engine: str = "auto",
    lam: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound): the scale s_ic and the a-priori error bound in units of u s_ic.

    ref is the exact output (from the reference engines), or None: then |out| <= s stands
    in for it (|sum_j a_ij v_jc| <= sum_j |a_ij| |v_jc|), a bound no smaller and needing no
    reference. Both arrays are (B, H, Nq, dv).
    tiny is the dtype's smallest subnormal: the output's own rounding may lose half of it
    to underflow (an exact 1e-52 is 0 in float32). Underflow inside the computation is
    outside the standard model and this bound.
    engine: "arb" (the sums in balls), "fast" (in float64 with their rounding bounded, for
    a family with a float64 engine, Family.sums_bound.fast: not softmax) or "auto" (fast
    for those past FAST_BOUND_WORK key-query pairs).
    lam: also Higham & Mary's probabilistic bound with that lambda (gamma_probabilistic),
    the smaller of the two; it holds but with the probability its lambda was chosen for.
    """
    family = family_of(spec)
    if own := family.scale_and_bound:  # a family with a model of its own
        return own(x, spec, ref, u, tiny)
    b_, h_, nq, nk, _, dv = x.shape
    fast = family.sums_bound.fast is not None
    if engine == "auto":
        engine = "fast" if fast and nq * nk > FAST_BOUND_WORK else "arb"
    if engine == "fast" and not fast:
        raise SpecError(f"the fast bound is for kernelised specs, not {spec}: engine='arb'")
    scale = np.full((b_, h_, nq, dv), np.nan)
    bound = np.full((b_, h_, nq, dv), np.nan)
    for b in range(b_):
        for h in range(h_):
            head = Head.of(x, b, h)
            sums = _head_sums(head, spec, u) if engine == "arb" else _fast_sums(head, spec, u)
            out = None if ref is None else np.abs(ref[b, h])
            scale[b, h], bound[b, h] = _bound_rows(sums, out, u, nk, tiny, lam)
    return scale, bound


_KEPT: OrderedDict[tuple, HeadSums] = OrderedDict()  # _head_sums' least recent first
_kept_bytes = 0  # what _KEPT holds (_nbytes)


def _head_sums(head: Head, spec: Spec, u: float) -> HeadSums:
    """_arb_sums of the head at the lowest precision that resolves its denominators
    (exponents of 1e39 need more than 64 bits), kept (KEPT_BYTES) per the head's content,
    spec, u and the feature model in force (the features' errors depend on it)."""
    key = (_digest(head), spec, u, FEATURE_MODEL.get())
    if (sums := _KEPT.get(key)) is not None:
        _KEPT.move_to_end(key)
        return sums
    prec = BOUND_PREC
    while sums is None:
        with working_precision(prec):
            sums = _arb_sums(head, spec, u, final=prec >= MAX_PREC)
        prec *= 4
    _KEPT[key] = sums
    global _kept_bytes
    _kept_bytes += _nbytes(sums)
    while _kept_bytes > KEPT_BYTES:
        _kept_bytes -= _nbytes(_KEPT.popitem(last=False)[1])
    return sums


def _nbytes(sums: HeadSums) -> int:
    return sums.a.nbytes + sums.f.nbytes + sums.zero.nbytes


def _digest(head: Head) -> bytes:
    """What the head holds: its arrays' shapes and values, and cosFormer's M."""
    arrays = (head.q, head.k, head.v, head.w, head.decay)
    hasher = hashlib.blake2b(
        repr([head.big_m, *(getattr(a, "shape", None) for a in arrays)]).encode()
    )
    for a in arrays:
        if a is not None:
            hasher.update(np.ascontiguousarray(a, dtype=np.float64).tobytes())
    return hasher.digest()


def denominator_condition(x: AttentionInputs, spec: Spec) -> np.ndarray:
    """kappa_i = c sum_j w_ij |a_ij| / |eps + c D_i| (B, H, Nq, 1), the factor by which
    rounding in the denominator's terms is amplified, from the family's float64 sums (a
    condition number: estimated, not bounded; Family.sums_bound.condition); 1 where the
    terms cannot cancel (non-negative features, softmax) and without a denominator."""
    kappa = family_of(spec).sums_bound.condition(x, spec)
    return np.ones((*x.shape[:3], 1)) if kappa is None else kappa
