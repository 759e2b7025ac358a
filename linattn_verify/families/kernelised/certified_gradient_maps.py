"""The per-map part of the certified gradients at length (certified_gradients.py): for
one side's rows x (queries or keys) the features phi(x) with their error bounds psi
(certified.float_features), magnitudes phiM >= grad.py's M(phi) (Kernel._feature_mags) up
to the last bits, and the step through J_phi^T: dL/dx_i = J_phi(x_i)^T y_i for y_i =
dL/dphi(x_i) within E_i, with a rigorous bound, and the magnitude M' through |J^T|
(grad_maps.py's Kernel.jt evaluated on magnitudes). Formulas and sources of the maps:
specs.FEATURE_MAPS; their derivatives: grad.py's module docstring. Bounds: Higham 2002, eq.
3.2's (1 + delta) products, eq. 3.5 for dots in any order; gradual underflow (a result below
2^-1022 errs by half a SUBNORMAL at most); every bound times SAFETY for its own roundings.

Elementwise maps (elu + 1, relu, identity: phi_m depends on x_m alone, J diagonal):
dx = phi'(x) y, phi' exact (1 or 0) but elu's exp(x) = phi^(x) within psi: error (phi'^ +
psi) E + psi |y^| and the product's rounding; M' = phi' M'(dphi). An elu row whose every
entry is <= 0 adds the row's M' to its largest entry's (grad_maps.py's Kernel.jt: the row
taken as exp(x - top) exp(top) for range, top's gradient landing there).

cosFormer (Qin et al. 2022, eq. 9-11), phi(x_i) = relu(x_i) [cos t_i, sin t_i], t_i = pi i /
2M: dx_i = relu'(x_i) (cos t_i y^c_i + sin t_i y^s_i), two products and a sum (gamma_2 of
their magnitudes; cos^, sin^ within their bounds, certified._angles); M' = relu'(x_i)
(cos t_i M'^c + sin t_i M'^s), which is grad.py's sum_j M(b_ij) cos(t_i - t_j) relu(k_j)
for M'(dphi) = c sum_j M'(b_ij) phi(k_j).

Taylor (Arora et al. 2024, sec. 3), phi(x) = [1, x', vec(x' x'^T) / sqrt(2)], x' = c x, c =
d^(-1/4): dx = c (y^lin + (Y + Y^T) x' / sqrt(2)), Y the quadratic part of y as a d x d
matrix. Computed as fl(c^ fl(y^lin + fl(fl((Y^ + Y^T^) xs^) s2^))), s2^ = fl(sqrt(1/2))
within u, xs^ = fl(x c^) (relative LIB + u, a SUBNORMAL): each step's error from its
inputs' (the product rule as above; a dot of d terms gamma_d) plus its rounding. M' = c
(M'^lin + (M'^Y + M'^Y^T) |xs^| s2), grad.py's sum_j M(b_ij) (1 + |q_i| . |k_j| / sqrt(d))
|k_j| / sqrt(d) for M'(dphi) = c_s sum_j M'(b_ij) |phi(k_j)|.

Performer (Choromanski et al. 2021, Lemma 1 and sec. 2.3), with x' = c x, c = d^(-1/4),
h = |x'|^2 / 2 and the rows w_r of W: J^T y = c (W_F^T z + sigma x' s), s = y . phi,
z = P(phi) * y * signs, with

    positive     W_F = W,        P = identity,        signs +1,              sigma = -1,
    hyperbolic   W_F = [W; -W],  P = identity,        signs +1,              sigma = -1,
    trig         W_F = [W; W],   P swaps sin and cos, signs [+1, ..., -1],   sigma = +1,

grad.py's z_r = y_r phi_r, y^+_r phi^+_r - y^-_r phi^-_r and y^s_r phi^c_r - y^c_r phi^s_r.
With phi^ within psi, y^ within E and xs^ = fl(x c^) as certified.performer_arguments forms
x' (relative LIB + u, and a SUBNORMAL):
- z^ = fl(P(phi^) y^) signs: e_z = (|P(phi^)| + P(psi)) E + P(psi) |y^| + u (1 + u) |z^| +
  SUBNORMAL; p^ = fl(phi^ y^) alike;
- t^ = fl(W_F^T z^) (d dots of F terms): e_t = |W_F|^T e_z + gamma_F |W_F|^T |z^| + F SUBNORMAL;
- s^ = fl(sum_r p^_r): e_s = sum_r e_p + gamma_F sum_r |p^_r|;
- i^ = fl(t^ + sigma fl(xs^ s^)) within e_i = e_t + |xs^| e_s + e_x (|s^| + e_s) + gamma_2
  (|t^| + |xs^ s^|) + 2 SUBNORMAL (e_x = r_x |xs^| + SUBNORMAL, r_x the relative error of
  x' over 1 - itself);
- dx^ = fl(c^ i^): c^ (1 + r_c) e_i + r_c c^ |i^| (r_c = LIB / (1 - LIB)) and the product's
  rounding, u (1 + u) |dx^| + SUBNORMAL.
Magnitudes: phiM = (|phi^| + psi) (1 + |W_F| |xs^| + h^) for positive and hyperbolic (grad.py's
phi_r (1 + |w_r| . |x'| + h)); trig: (1 + h^) (|phi^| + psi + exp(h^) / sqrt(m) |W_F| |xs^|)
(grad.py's (1 + h) (|phi_r| + exp(h) / sqrt(m) |w_r| . |x'|)); through |J^T| as Kernel.jt
does, M' = c (|W_F|^T (M'(dphi) * P(phiM)) + |xs^| (M'(dphi) . phiM)).

Large x makes the Performer features overflow or underflow, an elu row's exp underflow:
their bounds are then infinite, or the denominators they feed not resolved
(certified_gradients.py settles those rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...reference.certified import (
    LIB,
    SAFETY,
    SUBNORMAL,
    U64,
    Features,
    _angles,
    _rounding,
    float_features,
    gamma64,
)
from ...reference.certified_quotients import _times_c

ELEMENTWISE = ("elu", "relu", "identity")
PROJECTED = ("performer-positive", "performer-hyperbolic", "performer-trig")


@dataclass(frozen=True)
class MapRows:
    """One side's rows x (n, d) of a feature map: the features f (values and bounds),
    magnitudes phiM (n, F) and what J^T needs (the projection W, the rows' positions)."""

    name: str
    x: np.ndarray
    f: Features
    phi_m: np.ndarray
    w: np.ndarray | None = None
    positions: np.ndarray | None = None
    big_m: int = 0

    @classmethod
    def of(cls, name: str, x: np.ndarray, w: np.ndarray | None, big_m: int) -> MapRows:
        """The rows x at positions 0 .. n-1 of a sequence of big_m (cosFormer's M)."""
        positions = np.arange(x.shape[0])
        f = float_features(x, positions, big_m, w, name)
        rows = cls(name, x, f, np.abs(f.phi), w, positions, big_m)
        if name in PROJECTED:
            rows = cls(name, x, f, _projected_magnitudes(rows), w, positions, big_m)
        return rows

    def through(self, y: np.ndarray, e_y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(J_phi(x_i)^T y_i row by row, its bound) for y within e_y (module docstring)."""
        if self.name in ELEMENTWISE:
            return _through_derivative(self, y, e_y)
        if self.name == "cosformer":
            return _through_cosformer(self, y, e_y)
        if self.name == "taylor":
            return _through_taylor(self, y, e_y)
        return _through_projection(self, y, e_y)

    def through_magnitudes(self, m: np.ndarray) -> np.ndarray:
        """M' through |J^T| for the magnitudes m of dL/dphi (module docstring)."""
        x, name = self.x, self.name
        if name in ELEMENTWISE:
            below = self.f.phi * m if name == "elu" else 0.0 * m
            out = m if name == "identity" else np.where(x > 0, m, below)
            return _row_scale(x, out) if name == "elu" else out
        if name == "cosformer":
            cos, sin, e_c, e_s = (t[:, None] for t in _angles(self.positions, self.big_m))
            d = x.shape[1]
            return np.where(x > 0, (cos + e_c) * m[:, :d] + (sin + e_s) * m[:, d:], 0.0)
        c, xs = _scaling(x)
        if name == "taylor":
            d = x.shape[1]
            lin, quad = m[:, 1 : 1 + d], m[:, 1 + d :].reshape(-1, d, d)
            sym = quad + quad.swapaxes(1, 2)
            return c * (lin + np.einsum("nab,nb->na", sym, np.abs(xs)) * math.sqrt(0.5))
        w_f, perm, _, _ = _projection(self)
        with np.errstate(over="ignore", invalid="ignore"):
            zm = m * self.phi_m[:, perm]
            return c * (zm @ np.abs(w_f) + np.abs(xs) * np.sum(m * self.phi_m, 1, keepdims=True))


def _scaling(x: np.ndarray) -> tuple[float, np.ndarray]:
    """(c^ = fl(d^(-1/4)), xs^ = fl(x c^)) as float_features forms x'."""
    c = x.shape[1] ** -0.25
    return c, x * c


def _scaled_error(xs: np.ndarray) -> np.ndarray:
    """e_x: |xs^ - x'| for xs^ = fl(x c^), c^ within LIB of d^(-1/4)."""
    rel_x = (1 + LIB) * (1 + U64) - 1
    return rel_x / (1 - rel_x) * np.abs(xs) + SUBNORMAL


def _product(a, e_a, b, e_b) -> tuple[np.ndarray, np.ndarray]:
    """(fl(a^ b^), |fl(a^ b^) - a b|) for a^ within e_a, b^ within e_b."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b
        err = (np.abs(a) + e_a) * e_b + e_a * np.abs(b) + U64 * (1 + U64) * np.abs(p) + SUBNORMAL
    return p, err


def _through_derivative(rows: MapRows, y, e_y):
    """(phi'(x) y, its bound) elementwise (module docstring)."""
    grad, bound = y.copy(), e_y.copy()
    if rows.name == "identity":
        return grad, bound
    below = rows.x <= 0
    if rows.name == "relu":
        grad[below], bound[below] = 0.0, 0.0
        return grad, bound
    f = rows.f
    with np.errstate(over="ignore", invalid="ignore"):
        prod = f.phi * y
        err = (f.phi + f.err) * e_y + f.err * np.abs(y)
        err = (err * (1 + U64) + _rounding(prod, err)) * SAFETY
    err[~np.isfinite(err)] = np.inf
    grad[below], bound[below] = prod[below], err[below]
    return grad, bound


def _row_scale(x: np.ndarray, mags: np.ndarray) -> np.ndarray:
    """M of elu rows whose every entry is <= 0: their first largest entry's plus the row's
    (module docstring)."""
    rows = np.flatnonzero(np.all(x <= 0, axis=1))
    out = mags.copy()
    out[rows, np.argmax(x[rows], axis=1)] += mags[rows].sum(axis=1)
    return out


def _through_cosformer(rows: MapRows, y, e_y):
    """(relu'(x) (cos y^c + sin y^s), its bound) (module docstring)."""
    d = rows.x.shape[1]
    cos, sin, e_c, e_s = (t[:, None] for t in _angles(rows.positions, rows.big_m))
    with np.errstate(over="ignore", invalid="ignore"):
        a, b = cos * y[:, :d], sin * y[:, d:]
        grad = a + b
        err = (cos + e_c) * e_y[:, :d] + e_c * np.abs(y[:, :d])
        err += (sin + e_s) * e_y[:, d:] + e_s * np.abs(y[:, d:])
        inexact = (y[:, :d] != 0) | (y[:, d:] != 0) | (e_y[:, :d] > 0) | (e_y[:, d:] > 0)
        err = (err + gamma64(2) * (np.abs(a) + np.abs(b)) + 2 * SUBNORMAL * inexact) * SAFETY
    err[~np.isfinite(err) | ~np.isfinite(grad)] = np.inf
    off = rows.x <= 0
    grad[off], err[off] = 0.0, 0.0
    return grad, err


def _through_taylor(rows: MapRows, y, e_y):
    """(c (y^lin + (Y + Y^T) x' / sqrt(2)), its bound) (module docstring)."""
    n, d = rows.x.shape
    c, xs = _scaling(rows.x)
    e_x = _scaled_error(xs)
    lin, e_lin = y[:, 1 : 1 + d], e_y[:, 1 : 1 + d]
    quad, e_quad = y[:, 1 + d :].reshape(n, d, d), e_y[:, 1 + d :].reshape(n, d, d)
    with np.errstate(over="ignore", invalid="ignore"):
        sym = quad + quad.swapaxes(1, 2)
        e_sym = e_quad + e_quad.swapaxes(1, 2) + U64 * np.abs(sym) + SUBNORMAL
        t = np.einsum("nab,nb->na", sym, xs)
        a_sym, a_xs = np.abs(sym), np.abs(xs)
        e_t = np.einsum("nab,nb->na", a_sym, e_x) + np.einsum("nab,nb->na", e_sym, a_xs + e_x)
        e_t += gamma64(d) * np.einsum("nab,nb->na", a_sym, a_xs) + d * SUBNORMAL
        s2 = math.sqrt(0.5)
        r, e_r = _product(t, e_t, s2, U64 * s2 * (1 + U64))
        inner = lin + r
        e_inner = e_lin + e_r + U64 * np.abs(inner) + SUBNORMAL
    return _times_c(c, inner, e_inner)


def _projection(rows: MapRows):
    """(W_F, P as a permutation of the features, the signs, sigma) (module docstring)."""
    w, m = rows.w, rows.w.shape[0]
    if rows.name == "performer-positive":
        return w, np.arange(m), np.ones(m), -1.0
    if rows.name == "performer-hyperbolic":
        return np.concatenate([w, -w]), np.arange(2 * m), np.ones(2 * m), -1.0
    swap = np.concatenate([np.arange(m, 2 * m), np.arange(m)])
    return np.concatenate([w, w]), swap, np.concatenate([np.ones(m), -np.ones(m)]), 1.0


def _through_projection(rows: MapRows, y, e_y):
    """(J_phi(x_i)^T y_i row by row, its bound) for the Performer maps (module docstring)."""
    w_f, perm, signs, sigma = _projection(rows)
    n_features = w_f.shape[0]
    c, xs = _scaling(rows.x)
    f = rows.f
    aw = np.abs(w_f)
    with np.errstate(over="ignore", invalid="ignore"):
        z, e_z = _product(f.phi[:, perm], f.err[:, perm], y, e_y)
        z *= signs
        t = z @ w_f
        e_t = e_z @ aw + gamma64(n_features) * (np.abs(z) @ aw) + n_features * SUBNORMAL
        p, e_p = _product(f.phi, f.err, y, e_y)
        s = np.sum(p, axis=1, keepdims=True)
        e_s = np.sum(e_p, 1, keepdims=True) + gamma64(n_features) * np.sum(np.abs(p), 1)[:, None]
        px = xs * s
        inner = t + sigma * px
        axs = np.abs(xs)
        e_x = _scaled_error(xs)
        e_inner = e_t + axs * e_s + e_x * (np.abs(s) + e_s)
        e_inner += gamma64(2) * (np.abs(t) + np.abs(px)) + 2 * SUBNORMAL
    return _times_c(c, inner, e_inner)


def _projected_magnitudes(rows: MapRows) -> np.ndarray:
    """phiM of the Performer maps (module docstring)."""
    w_f, _, _, _ = _projection(rows)
    _, xs = _scaling(rows.x)
    f = rows.f
    half_sq = np.sum(xs * xs, axis=1, keepdims=True) / 2
    spread = np.abs(xs) @ np.abs(w_f).T
    with np.errstate(over="ignore", invalid="ignore"):
        if rows.name == "performer-trig":
            scale = np.exp(half_sq) / math.sqrt(rows.w.shape[0])
            return (1 + half_sq) * (np.abs(f.phi) + f.err + scale * spread)
        return (f.phi + f.err) * (1 + spread + half_sq)
