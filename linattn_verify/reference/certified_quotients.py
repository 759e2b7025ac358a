"""The quotient rule's float64 steps shared by the certified gradients of the kernelised
specs (families/kernelised/certified_gradients.py) and of softmax
(families/softmax/certified_gradients.py): out^, Dt^ and the quotient rule's inputs with
their bounds from the forward's sums, as certified._finish forms and bounds them; the
products by c^; their bounds' sources are in those modules' docstrings."""

from __future__ import annotations

import numpy as np

from ..specs import RSQRT_D, Spec
from .certified import LIB, SAFETY, SUBNORMAL, U64, _finish, _rounding, gamma64


def _scaled_terms(g_out, spec: Spec, d: int):
    """_quotient_terms' tuple for an unnormalised spec: D = 1 (no row unresolved), Gt^ =
    fl(c^ G) within xi, tbar = h = 0 (module docstring)."""
    n = g_out.shape[0]
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    gt = c * g_out
    yy = (np.abs(gt) + SUBNORMAL) * (1 + 2 * U64)
    xi = (yy * (U64 + c_rel / (1 - c_rel)) + SUBNORMAL) * SAFETY
    ones, nothing, none = np.ones(n), np.zeros(n), np.zeros(n, dtype=bool)
    return ones, nothing, none, none, ones, ones, gt, xi, nothing, nothing, nothing, nothing


def _quotient_terms(value, total, mag, g_out, spec: Spec, d: int, eps=None, eps_rel=0.0):
    """The forward's out^ and Dt^ (e_D) from its sums, and the quotient rule's inputs with
    their bounds (module docstring: Gt^ within xi, tbar^ within tau, h^ within eta), 0 on
    rows whose denominator is not resolved (0/0 ones too): (den, e_den, zero, lost,
    safe_den, safe_slack, gt, xi, tbar, tau, h, eta). eps: spec.eps, or one per row within
    eps_rel of its value (softmax's shifted one)."""
    dv = g_out.shape[1]
    eps = spec.eps if eps is None else eps
    out, e_out, _ = _finish(value, total, mag, eps, eps_rel, spec, d)
    den, e_den = _denominator(value, total, spec, d, eps, eps_rel)
    with np.errstate(invalid="ignore"):
        slack = np.abs(den) - e_den
    zero = (den == 0) & (e_den == 0) & spec.info.positive  # 0/0 rows
    lost = ~(slack > 0)  # rows whose denominator is not resolved (0/0 ones too)
    safe_den = np.where(lost, 1.0, den)
    safe_slack = np.where(lost, 1.0, slack)
    rel_d = np.where(lost, 0.0, e_den / safe_slack)[:, None]
    out_ok = np.where(lost[:, None], 0.0, out)
    e_out_ok = np.where(lost[:, None], 0.0, e_out)

    ag = np.abs(g_out)
    gt = g_out / safe_den[:, None]
    yy = (np.abs(gt) + SUBNORMAL) * (1 + 2 * U64)
    xi = (yy * (U64 + rel_d) + SUBNORMAL) * SAFETY
    tbar = np.sum(g_out * out_ok, axis=1)
    tau = np.sum(ag * e_out_ok, axis=1) + gamma64(dv + 1) * np.sum(ag * np.abs(out_ok), axis=1)
    tau = (tau + 2 * dv * SUBNORMAL) * SAFETY
    h = tbar / safe_den
    hh = (np.abs(h) + SUBNORMAL) * (1 + 2 * U64)
    eta = (hh * U64 + tau / safe_slack + hh * rel_d[:, 0] + SUBNORMAL) * SAFETY
    gt[lost], xi[lost], tbar[lost], tau[lost], h[lost], eta[lost] = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return den, e_den, zero, lost, safe_den, safe_slack, gt, xi, tbar, tau, h, eta


def _denominator(value, total, spec: Spec, d: int, eps, eps_rel: float):
    """(Dt^ = S^ + eps / c, a bound on its error) as certified._finish forms them (eps
    within eps_rel of its value)."""
    c, c_rel = spec.scale_for(d), LIB if spec.scale == RSQRT_D else 0.0
    eps_c = eps / c if c != 1.0 else eps
    eps_rel = (1 + eps_rel) * (1 + U64) / (1 - c_rel) - 1 if c != 1.0 else eps_rel
    den = value[:, -1] + eps_c
    err = total[:, -1] + np.abs(eps_c) * eps_rel * SAFETY + U64 * np.abs(den)
    return den, err


def _quotient(num, e_num, den, e_den, slack):
    """(fl(num / den), its bound) for num within e_num, den within e_den (slack = |den| -
    e_den > 0), as certified._finish bounds out."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = num / den[:, None]
        bound = (e_num + np.abs(out) * (1 + U64) * e_den[:, None]) * (
            (1 + U64) * SAFETY / slack[:, None]
        )
        bound += _rounding(out, bound)
    bound[~np.isfinite(bound) | ~np.isfinite(out)] = np.inf
    return out, bound


def _scaled(num, e_num, spec: Spec, d: int):
    """(fl(c^ num), its bound) for num within e_num, as certified._finish scales an
    unnormalised out."""
    pad = np.zeros((num.shape[0], 1))
    value, total = np.concatenate([num, pad], 1), np.concatenate([e_num, pad], 1)
    out, bound, _ = _finish(value, total, np.abs(value), 0.0, 0.0, spec, d)
    return out, bound


def _times_c(c: float, inner: np.ndarray, e_inner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fl(c^ inner^), its bound) for c^ (a power of d) within LIB of c, inner^ within
    e_inner."""
    r_c = LIB / (1 - LIB)
    with np.errstate(over="ignore", invalid="ignore"):
        grad = c * inner
        bound = c * (1 + r_c) * e_inner + r_c * c * np.abs(inner)
        bound += U64 * (1 + U64) * np.abs(grad) + SUBNORMAL
        bound *= SAFETY
    bound[~np.isfinite(bound) | ~np.isfinite(grad)] = np.inf
    return grad, bound
