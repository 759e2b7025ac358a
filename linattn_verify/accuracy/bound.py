"""The a-priori floating-point error bound, and the scale errors are measured against.

Standard model (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., sec. 2.2
and 3.1): fl(a op b) = (a op b)(1 + delta), |delta| <= u, no underflow or overflow; a sum
or dot product of n terms in any order has error <= gamma_n sum |terms|, gamma_n =
n u / (1 - n u) (Lemma 3.1 and eq. 3.5); elementary functions return within C_LIB units.

For attention out_i = N_i / (eps + D_i), N_i = sum_j a_ij v_j, D_i = sum_j a_ij:
- each weight a_ij = phi(q_i).phi(k_j) is computed from features with absolute errors
  psi(q_i), psi(k_j) (per feature map below) and summed over m features; then N and D sum
  over Nk keys and eps is added: in any order (quadratic, linear, chunked), with
  gamma = gamma_{m + Nk + 1}, |dN_ic| <= (1 + gamma) F_ic + gamma A_ic and
  |dD_i| <= (1 + gamma) F_i + gamma A_i, where A sums |phi(q)|.|phi(k)| |v| (resp. 1)
  and F sums (psi(q).|phi(k)| + |phi(q)|.psi(k) + psi(q).psi(k)) |v| (resp. 1);
- softmax is a single exponential (m = 1): a_ij = exp(s_ij), s = q.k / sqrt(d), with
  |ds| <= gamma_{d + C_LIB + 2} sum_l |q_l k_l| / sqrt(d) + u (|s_ij| + max_j |s_ij|)
  (the last term: a stabilising max subtraction), so |da_ij| <= a_ij (e^{|ds|}(1 +
  gamma_{C_LIB}) - 1);
- the quotient: |d out| <= (|dN| + |out| |dD|) / (|eps + D| - |dD|) (1 + u) + u |out|.
Feature models (FEATURE_MODEL): "standard" admits every sane evaluation of each map, the
textbook ones included: elu(x) + 1 as F.elu(x) + 1 = (exp(x) - 1) + 1, whose error is
absolute (C_LIB u) rather than relative, the usual max stabilisers of the exponential maps,
any summation order. "relative" (vet --strict) holds elu features to relative accuracy in
entirely negative rows too, as a shifted evaluation attains (the golden implementation's).
The bound is reported in units of u * s_ic, s_ic = sum_j |a_ij| |v_jc| / |eps + D_i| (for
the signed performer-trig map: |phi(q)|.|phi(k)| in place of |a|), the magnitude the
computation works at (DESIGN "Accuracy"). All sums are evaluated in arb balls, so the bound
itself carries no rounding error of its own; it is infinite where n u >= 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from flint import arb, arb_mat

from ..inputs import AttentionInputs
from ..reference.balls import (
    Head,
    balls,
    direct_sims,
    features,
    kernel_sums,
    masked,
    performer_arguments,
    working_precision,
)
from ..reference.common import MAX_PREC
from ..specs import Spec

# Elementary functions (exp, expm1, sin, cos, sqrt) are within 1 ulp = 2u in glibc, SLEEF
# and CUDA's libdevice for these arguments; C_LIB = 2 units of roundoff.
C_LIB = 2
BOUND_PREC = 64  # bits for the bound's own arithmetic: balls keep it rigorous
# ln of float32's largest value: an unshifted exp(x) below -88 underflows float32, so any
# working elu implementation shifts rows that negative (float64 ones may not: 745 there,
# and their extra error |r| u beyond 88 u is charged to them)
ELU_UNSHIFTED_MAX = 88.0


FEATURE_MODELS = ("standard", "relative")
FEATURE_MODEL: ContextVar[str] = ContextVar("feature_model", default="standard")


@contextmanager
def feature_model(model: str) -> Iterator[None]:
    """Bounds computed inside the block assume `model` (FEATURE_MODELS) for the features."""
    if model not in FEATURE_MODELS:
        raise ValueError(f"feature model {model!r}; known: {', '.join(FEATURE_MODELS)}")
    token = FEATURE_MODEL.set(model)
    try:
        yield
    finally:
        FEATURE_MODEL.reset(token)


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u) (Higham eq. 3.5); inf when n u >= 1."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def _grow(rel: arb, g: float) -> arb:
    """(1 + rel)(1 + g) - 1: relative errors compose."""
    return (1 + rel) * (1 + arb(g)) - 1


def feature_errors(
    x: np.ndarray, positions: range, head: Head, name: str, u: float, stab: arb
) -> tuple[list[list[arb]], list[list[arb]]]:
    """(phi(x_i), psi(x_i)): features and bounds on their absolute evaluation error.

    stab bounds the magnitude of the stabiliser a Performer implementation may subtract from
    its exponents (the largest exponent of the head).
    """
    phi = features(x, positions, head, name)
    ua = arb(u)
    # x + 1 (one rounding), or exp(x) for x <= 0 without cancellation: directly (C_LIB
    # relative), as exp2(x log2 e) (absolute |x| e^x u), or shifted by the row's largest
    # coordinate r < 0, exp(x - r) e^r (absolute |x - r| e^(x - r) u <= u / e, times e^r).
    # |x| e^x <= e^r (|r| e^(x - r) + 1/e), and no implementation leaves a row unshifted
    # below -ELU_UNSHIFTED_MAX (exp underflows there): within u (C_LIB e^r + phi + min(|r|,
    # ELU_UNSHIFTED_MAX) phi). In a row with a positive coordinate (r = 0) this is u (C_LIB +
    # phi) and admits expm1(x) + 1; in an entirely negative row the relative model does not:
    # expm1(x) + 1 cancels there (to exactly 0 below -17 in float32). The standard model
    # admits it there too: its error is within (e^x + C_LIB (1 - e^x)) u (1 + u), so the
    # absolute term is C_LIB u whatever the row.
    if name == "elu":
        psi = []
        textbook = FEATURE_MODEL.get() == "standard"
        for r, fr in zip(x.tolist(), phi, strict=True):
            top = min(max(r), 0.0)
            big = arb(C_LIB) * (1 if textbook else arb(top).exp())
            lift = 1 + min(-top, ELU_UNSHIFTED_MAX)
            psi.append(
                [
                    f * ua * (1 + ua) if t > 0 else (big + lift * f) * ua * (1 + ua)
                    for t, f in zip(r, fr)
                ]
            )
        return phi, psi
    if name == "relu":
        return phi, [[arb(0)] * len(r) for r in phi]
    if name == "cosformer":
        # theta = pi i / 2M after 3 roundings: |d theta| <= 3 u theta; cos and sin add C_LIB u
        # (absolute, not relative: cos is small near pi/2); the product with relu(x) one more
        psi = []
        for i, r, fr in zip(positions, x.tolist(), phi, strict=True):
            theta = arb.pi() * i / (2 * head.big_m)
            trig_err = (3 * theta + C_LIB) * ua
            rel = [max(t, 0.0) * trig_err * (1 + ua) for t in r]
            psi.append([e + abs(f) * ua for e, f in zip(rel + rel, fr, strict=True)])
        return phi, psi
    if name == "taylor":
        # 1 exact; x' = x / d^(1/4): the root (C_LIB) and the division (1); x'_a x'_b / sqrt(2):
        # two such factors, their product, sqrt(2) (C_LIB) and the division: 3 C_LIB + 4
        d = x.shape[1]
        lin, quad = gamma(C_LIB + 1, u), gamma(3 * C_LIB + 4, u)
        rel = [arb(0)] + [arb(lin)] * d + [arb(quad)] * (d * d)
        return phi, [[abs(f) * r for f, r in zip(fr, rel, strict=True)] for fr in phi]
    _, half_sq = performer_arguments(x, head.w)
    d = x.shape[1]
    norms = (arb_mat(balls(np.abs(x))) * arb_mat(balls(np.abs(head.w))).transpose()).tolist()
    scale = arb(d).rsqrt().sqrt()
    # exponent: the dot product over d, x' = x d^(-1/4) (C_LIB + 1), subtracting |x'|^2/2 and
    # a stabiliser (2), exp as exp2(x log2 e) (1); then the value: a feature may be formed
    # as exp(a - max a) exp(scale - shift) (two exps, 2 C_LIB, and their product, 1) and
    # divided by sqrt(m) (1)
    g_arg, g_lib = gamma(d + C_LIB + 4, u), gamma(2 * C_LIB + 2, u)
    psi = []
    for fr, nr, hs in zip(phi, norms, half_sq, strict=True):
        if name == "performer-trig":  # exp(|x'|^2/2)/sqrt(m) times sin/cos of W x'
            rel_e = _grow((g_arg * (hs + stab)).exp() - 1, g_lib)
            m = len(nr)
            e = hs.exp() * arb(m).rsqrt()
            row = []
            for f, n in zip(fr, nr + nr, strict=True):
                dtheta = g_arg * n * scale + C_LIB * ua
                row.append(abs(f) * rel_e + e * dtheta * (1 + rel_e))
            psi.append(row)
        else:  # exp(+-W x' - |x'|^2/2) / sqrt(m or 2m)
            dalpha = [g_arg * (n * scale + hs + stab) for n in nr]
            if name == "performer-hyperbolic":
                dalpha = dalpha + dalpha
            psi.append([f * _grow(da.exp() - 1, g_lib) for f, da in zip(fr, dalpha, strict=True)])
    return phi, psi


def _stabiliser(head: Head, name: str) -> arb:
    """Largest |exponent| over the head's queries and keys for the Performer maps."""
    if not name.startswith("performer"):
        return arb(0)
    tops = [arb(0)]
    for rows in (head.q, head.k):
        proj, half_sq = performer_arguments(rows, head.w)
        tops += [(abs(p) + hs).upper() for pr, hs in zip(proj, half_sq, strict=True) for p in pr]
    return max(tops)


def _abs(rows: list[list[arb]]) -> list[list[arb]]:
    return [[abs(t) for t in r] for r in rows]


def _add(*mats: list[list[arb]]) -> list[list[arb]]:
    return [[sum(ts, arb(0)) for ts in zip(*rows, strict=True)] for rows in zip(*mats, strict=True)]


def _head_sums(head: Head, spec: Spec, u: float, x: list[list[arb]]):
    """(num-and-den sums, A sums, F sums, m) for one head; see the module docstring."""
    name, causal = spec.feature_map, spec.causal
    nq, nk = head.q.shape[0], head.k.shape[0]
    if name == "softmax":
        rows = list(range(nq))
        sims = masked(direct_sims(head, rows, name), rows, causal)
        d = head.q.shape[1]
        absdot = arb_mat(balls(np.abs(head.q))) * arb_mat(balls(np.abs(head.k))).transpose()
        s = (arb_mat(balls(head.q)) * arb_mat(balls(head.k)).transpose()) * arb(d).rsqrt()
        g_dot, g_lib = gamma(d + C_LIB + 2, u), gamma(C_LIB, u)
        rel = []
        for i, (ar, sr) in enumerate(zip(absdot.tolist(), s.tolist(), strict=True)):
            big = max(abs(t).upper() for t in (sr[: i + 1] if causal else sr))
            ds = [
                g_dot * a * arb(d).rsqrt() + u * (abs(t) + big) for a, t in zip(ar, sr, strict=True)
            ]
            rel.append([_grow(e.exp() - 1, g_lib) for e in ds])
        f = [[a * r for a, r in zip(ar, rr, strict=True)] for ar, rr in zip(sims, rel, strict=True)]
        xm = arb_mat(x)
        nd = (arb_mat(sims) * xm).tolist()
        return nd, nd, (arb_mat(f) * xm).tolist(), 1
    stab = _stabiliser(head, name)
    pq, sq = feature_errors(head.q, range(nq), head, name, u, stab)
    pk, sk = feature_errors(head.k, range(nk), head, name, u, stab)
    aq, ak = _abs(pq), _abs(pk)
    nd = kernel_sums(pq, pk, x, causal)
    a_sums = nd if spec.info.positive and name != "taylor" else kernel_sums(aq, ak, x, causal)
    f = _add(
        kernel_sums(sq, ak, x, causal),
        kernel_sums(aq, sk, x, causal),
        kernel_sums(sq, sk, x, causal),
    )
    return nd, a_sums, f, len(pq[0])


def _upper(t: arb) -> float:
    return float(t.upper()) if t.is_finite() else math.inf


def scale_and_bound(
    x: AttentionInputs, spec: Spec, ref: np.ndarray | None, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(s, bound): the scale s_ic and the a-priori error bound in units of u s_ic.

    ref is the exact output (from the reference engines), or None: then |out| <= s stands
    in for it (|sum_j a_ij v_jc| <= sum_j |a_ij| |v_jc|), a bound no smaller and needing no
    reference. Both arrays are (B, H, Nq, dv).
    tiny is the dtype's smallest subnormal: the output's own rounding may lose half of it
    to underflow (an exact 1e-52 is 0 in float32). Underflow inside the computation is
    outside the standard model and this bound.
    """
    b_, h_, nq, _, _, dv = x.shape
    scale = np.full((b_, h_, nq, dv), np.nan)
    bound = np.full((b_, h_, nq, dv), np.nan)
    for b in range(b_):
        for h in range(h_):
            prec = BOUND_PREC
            while True:  # exponents of 1e39 need more than 64 bits to stay resolved
                with working_precision(prec):
                    done = _head_bound(
                        Head.of(x, b, h), spec, ref, u, tiny, scale[b, h], bound[b, h], b, h
                    )
                if done or prec >= MAX_PREC:
                    break
                prec *= 4
    return scale, bound


def _head_bound(
    head: Head, spec: Spec, ref, u: float, tiny: float, scale, bound, b: int, h: int
) -> bool:
    """Fill one head's scale and bound rows; False if some denominator was not resolved
    away from zero at the working precision."""
    v = head.v
    nq, nk, dv = head.q.shape[0], head.k.shape[0], v.shape[1]
    cols = balls(np.concatenate([v, np.abs(v), np.ones((nk, 1))], 1))
    nd, a_sums, f, m = _head_sums(head, spec, u, cols)
    g = arb(gamma(m + nk + 1, u))
    resolved = True
    for i in range(nq):
        den = abs(nd[i][-1] + spec.eps)
        if den.is_zero():
            continue
        resolved &= bool(den > 0)
        err_den = ((1 + g) * f[i][-1] + g * a_sums[i][-1]) / den
        for c in range(dv):
            s = a_sums[i][dv + c] / den
            out = s if ref is None else abs(arb(ref[b, h, i, c]))
            err_num = ((1 + g) * f[i][dv + c] + g * a_sums[i][dv + c]) / den
            if not err_den < 1:
                err = arb("inf")
            else:
                err = (err_num + out * err_den) / (1 - err_den) * (1 + u) + u * out
                err = err + tiny / 2
            scale[i, c] = float(s.mid())
            bound[i, c] = 0.0 if err.is_zero() else _upper(err / (u * s)) if s > 0 else math.inf
    return resolved
