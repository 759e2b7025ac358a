"""Exact moments of the Performer kernel estimators, derived from the Gaussian moment
generating function: the expected value exp(x.y) in mpmath, second moments in float64 (they
set statistical tolerances of about 1%, where float64's 1e-16 does not matter).

Notation: x, y are the (already scaled, x' = x d^(-1/4)) inputs; w ~ N(0, I_d) one row of W;
the estimator of SM(x, y) = exp(x.y) is K_hat = (1/m) sum_l h(w_l) with, per row,

- positive   h = exp(w.(x+y) - (|x|^2 + |y|^2)/2)       (FAVOR+, Choromanski et al. 2021, Lemma 1)
- hyperbolic h = cosh(w.(x+y)) exp(-(|x|^2 + |y|^2)/2)  (the same paper, eq. 7: phi of 2m entries)
- trig       h = cos(w.(x-y)) exp((|x|^2 + |y|^2)/2)    (random Fourier features of the Gaussian
  kernel, Rahimi & Recht 2007, times exp((|x|^2 + |y|^2)/2); Choromanski et al. 2021, eq. 6)

Derivation (this module's, checked against Lemma 2 of Choromanski et al. 2021 in tests):
E exp(w.a) = exp(|a|^2/2), so E cosh(w.a) = exp(|a|^2/2), E cos(w.a) = exp(-|a|^2/2), and each
h has mean exp(x.y) (unbiased). Products turn into sums, cosh(s)cosh(t) = (cosh(s+t) +
cosh(s-t))/2 and the same for cos, which gives E[h(x, y1) h(x, y2)] in closed form
(`pair_moment`). With y1 = y2 = y this is E h^2, so for m iid rows

    MSE = (E h^2 - SM^2) / m,

which reproduces Lemma 2: MSE_+ = (1/m) exp(|x+y|^2) SM^2 (1 - exp(-|x+y|^2)),
MSE_trig = (1/(2m)) exp(|x+y|^2) SM^-2 (1 - exp(-|x-y|^2))^2 and
MSE_hyp = (1/2) (1 - exp(-|x+y|^2)) MSE_+.

Orthogonal rows (blocks of d mutually orthogonal rows with independent chi(d) norms): each row
is still N(0, I_d), so the estimator stays unbiased, but two rows of a block are dependent.
h depends on w only through t = w.z (z = x+y, or x-y for trig), so the covariance of two rows
of a block needs the joint law of (w1.z, w2.z) = |z| (r1 v1, r2 v2), with r1, r2 iid chi(d) and
(v1, v2) the first two coordinates of a uniform unit vector in R^d (density proportional to
(1 - v1^2 - v2^2)^((d-4)/2) on the unit disc; Yu et al. 2016, Choromanski et al. 2017 use the
same reduction). E over r of exp(c r), cosh(c r), cos(c r) are Kummer functions (moments of
chi(d)); the remaining integral over the disc is done by Gauss-Legendre x trapezoid quadrature
(`pair_moment_orthogonal`, checked against simulation in tests).
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

KINDS = ("performer-positive", "performer-hyperbolic", "performer-trig")
_DIGITS = 40


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown random-feature kind {kind!r}; known: {', '.join(KINDS)}")


def _dot(a: np.ndarray, b: np.ndarray) -> mpmath.mpf:
    """a.b exactly enough: float64 entries are exact in mpmath."""
    return mpmath.fsum(mpmath.mpf(float(s)) * mpmath.mpf(float(t)) for s, t in zip(a, b))


def softmax_kernel(x: np.ndarray, y: np.ndarray) -> float:
    """SM(x, y) = exp(x.y), in mpmath, rounded to float64."""
    with mpmath.workdps(_DIGITS):
        return float(mpmath.exp(_dot(x, y)))


def _sq(a: np.ndarray) -> np.ndarray:
    return np.einsum("...i,...i->...", a, a)


def pair_moment(kind: str, x: np.ndarray, y1: np.ndarray, y2: np.ndarray) -> np.ndarray:
    """E[h(x, y1) h(x, y2)] for one row w ~ N(0, I_d) (module docstring), in float64;
    x, y1, y2 broadcast over leading axes, the last one is d."""
    _check_kind(kind)
    x, y1, y2 = (np.asarray(a, dtype=np.float64) for a in (x, y1, y2))
    xx, n1, n2, dd = _sq(x), _sq(y1), _sq(y2), _sq(y1 - y2)
    if kind == "performer-trig":
        pair = (np.exp(-_sq(2 * x - y1 - y2) / 2) + np.exp(-dd / 2)) / 2
        return np.exp(xx + (n1 + n2) / 2) * pair
    ss = _sq(2 * x + y1 + y2)
    if kind == "performer-positive":
        return np.exp(ss / 2 - xx - (n1 + n2) / 2)
    return (np.exp(ss / 2 - xx - (n1 + n2) / 2) + np.exp(dd / 2 - xx - (n1 + n2) / 2)) / 2


def raw_moment(kind: str, x: np.ndarray, y: np.ndarray, k: int) -> mpmath.mpf:
    """E h^k for one row, in mpmath: h = A g(w.z) with g = exp, cosh or cos; expanding
    g^k = 2^-k sum_j C(k, j) g((k - 2j) t) (exp: g^k = exp(k t)) and E exp(s w.z) =
    exp(s^2 |z|^2 / 2), E cos(s w.z) = exp(-s^2 |z|^2 / 2)."""
    _check_kind(kind)
    with mpmath.workdps(_DIGITS):
        xx, yy = _dot(x, x), _dot(y, y)
        if kind == "performer-trig":
            z, factor, sign = x - y, mpmath.exp((xx + yy) / 2), -1
        else:
            z, factor, sign = x + y, mpmath.exp(-(xx + yy) / 2), 1
        zz = _dot(z, z)
        if kind == "performer-positive":
            expectation = mpmath.exp(k * k * zz / 2)
        else:
            expectation = (
                mpmath.fsum(
                    mpmath.binomial(k, j) * mpmath.exp(sign * (k - 2 * j) ** 2 * zz / 2)
                    for j in range(k + 1)
                )
                / 2**k
            )
        return factor**k * expectation


def squared_error_variance(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> float:
    """Var (K_hat - SM)^2 for m iid rows: mu4(K_hat) - mu2(K_hat)^2, with mu2 = s^2 / m and
    mu4 = (mu4(h) + 3 (m - 1) s^4) / m^3 (central moments of a mean of m iid terms)."""
    with mpmath.workdps(_DIGITS):
        mu = mpmath.exp(_dot(x, y))
        e2, e3, e4 = (raw_moment(kind, x, y, k) for k in (2, 3, 4))
        s2 = e2 - mu**2
        mu4h = e4 - 4 * mu * e3 + 6 * mu**2 * e2 - 3 * mu**4
        return float((mu4h + 3 * (m - 1) * s2**2) / m**3 - (s2 / m) ** 2)


def mse_iid(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> float:
    """The MSE of K_hat(x, y) with m iid Gaussian rows: (E h^2 - SM^2) / m."""
    return (float(pair_moment(kind, x, y, y)) - softmax_kernel(x, y) ** 2) / m


def _direction(kind: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(|z|, the factor in front of g(w.z)): h(w) = factor * g(w.z)."""
    xx, yy = float(x @ x), float(y @ y)
    if kind == "performer-trig":
        return float(np.linalg.norm(x - y)), math.exp((xx + yy) / 2)
    return float(np.linalg.norm(x + y)), math.exp(-(xx + yy) / 2)


def _chi_expectation(kind: str, c: np.ndarray, d: int) -> np.ndarray:
    """E g(c r) for r ~ chi(d): g = exp (positive), cosh (hyperbolic), cos (trig).

    E r^j = 2^(j/2) Gamma((d+j)/2) / Gamma(d/2) summed into Kummer's 1F1."""
    import scipy.special  # deferred: 0.6 s to import, for every vet run

    half = c * c / 2
    if kind == "performer-trig":
        return scipy.special.hyp1f1(d / 2, 0.5, -half)
    even = scipy.special.hyp1f1(d / 2, 0.5, half)
    if kind == "performer-hyperbolic":
        return even
    ratio = math.exp(scipy.special.gammaln((d + 1) / 2) - scipy.special.gammaln(d / 2))
    return even + c * math.sqrt(2) * ratio * scipy.special.hyp1f1((d + 1) / 2, 1.5, half)


def _disc_average(kind: str, norm: float, d: int, nodes: int) -> float:
    """E[g(r1 |z| v1) g(r2 |z| v2)] by quadrature: trapezoid in the angle, Gauss-Legendre in
    phi with rho = sin(phi), where the density rho (1 - rho^2)^((d-4)/2) d rho becomes
    sin cos^(d-3) d phi (smooth for d >= 3); on the unit circle for d = 2."""
    theta = np.arange(2 * nodes) * (np.pi / nodes)
    if d == 2:
        rho, weight = np.ones(1), np.ones(1)
    else:
        t, w = np.polynomial.legendre.leggauss(nodes)
        phi = (t + 1) * np.pi / 4
        rho, weight = np.sin(phi), w * np.sin(phi) * np.cos(phi) ** (d - 3)
    v1 = norm * rho[:, None] * np.cos(theta)
    v2 = norm * rho[:, None] * np.sin(theta)
    values = _chi_expectation(kind, v1, d) * _chi_expectation(kind, v2, d)
    return float(weight @ values.mean(axis=1) / weight.sum())


QUADRATURE_TOLERANCE = 1e-9  # relative to the covariance, between two node counts


def pair_moment_orthogonal(kind: str, x: np.ndarray, y: np.ndarray) -> float:
    """E[h(w1) h(w2)] for two rows of one orthogonal block (chi(d) norms), d >= 2. The node
    count doubles from 64 until the covariance E[h1 h2] - SM^2 agrees to
    QUADRATURE_TOLERANCE with the previous count (large d and |z| need more nodes);
    ValueError if 1024 nodes do not get there (d and |z| in the hundreds)."""
    _check_kind(kind)
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    d = x.shape[0]
    if d < 2:
        raise ValueError("a block of orthogonal rows has two rows only when d >= 2")
    norm, factor = _direction(kind, x, y)
    mean = softmax_kernel(x, y) / factor  # E g(w.z)
    previous = _disc_average(kind, norm, d, 32) - mean**2
    for nodes in (64, 128, 256, 512, 1024):
        covariance = _disc_average(kind, norm, d, nodes) - mean**2
        if abs(covariance - previous) <= QUADRATURE_TOLERANCE * abs(covariance) or covariance == 0:
            return factor**2 * (covariance + mean**2)
        previous = covariance
    raise ValueError(f"the orthogonal covariance did not converge for d = {d}, |z| = {norm:.3g}")


def block_sizes(m: int, d: int) -> list[int]:
    """Rows per orthogonal block when m rows are stacked from blocks of d."""
    return [d] * (m // d) + ([m % d] if m % d else [])


def mse_orthogonal(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> float:
    """The MSE of K_hat(x, y) with m rows from stacked orthogonal blocks (chi(d) norms):
    (m Var h + sum over blocks b(b-1) Cov(h(w1), h(w2))) / m^2; rows of different blocks
    are independent."""
    d = len(x)
    sm = softmax_kernel(x, y)
    variance = float(pair_moment(kind, x, y, y)) - sm**2
    pairs = sum(b * (b - 1) for b in block_sizes(m, d))
    covariance = pair_moment_orthogonal(kind, x, y) - sm**2 if pairs else 0.0
    return (m * variance + pairs * covariance) / m**2
