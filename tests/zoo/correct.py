"""Correct implementations, written differently from linattn_verify.implementations.

Each computes in float64 on the inputs' device and returns the inputs' dtype. Exponential
features are scaled per feature for keys (a common or running scale) and per row for
queries, so that no sum underflows to 0/0 or overflows even for extreme inputs; the scales
cancel between numerator and denominator (every spec here has eps = 0). elu features are
scaled by exact powers of two, and only where unscaled ones would leave float64's range,
so that ordinary inputs are computed exactly as the definition reads.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from itertools import pairwise

import torch
from torch import Tensor

from . import Entry

LN2 = math.log(2.0)
# ln 2 = LN2_HI + LN2_LO with LN2_HI to 32 bits (fdlibm's split): n LN2_HI is exact for
# |n| < 2^21, so x + n ln 2 is formed exactly where it is small, for |x| up to about 1.4e6.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
# Scales within 2^(+-SAFE_EXPONENT) are left alone: a product of two such features and its
# sums stay far inside float64's range (2^-1022 ... 2^1024).
SAFE_EXPONENT = 256


def _f64(*ts: Tensor) -> tuple[Tensor, ...]:
    return tuple(t.to(torch.float64) for t in ts)


def _log_elu(x: Tensor) -> Tensor:
    """log(elu(x) + 1): log1p(x) above 0, x below."""
    return torch.log1p(torch.relu(x)) + torch.clamp(x, max=0.0)


def _exponent(log_scale: Tensor) -> Tensor:
    """n such that exp(log_scale) 2^-n lies in [1, 2), or 0 where exp(log_scale) is safe."""
    n = torch.floor(log_scale / LN2)
    return torch.where(n.abs() < SAFE_EXPONENT, 0.0, n)


def _elu_scaled(x: Tensor, n: Tensor) -> Tensor:
    """(elu(x) + 1) 2^n: (x + 1) 2^n exactly above 0, exp(x + n ln 2) below."""
    return torch.where(x > 0, torch.ldexp(1 + x, n), torch.exp((x + n * LN2_HI) + n * LN2_LO))


def elu_einsum(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal elu by einsum; key feature l scaled by 2^-n_l (n_l from its largest key),
    query row i by 2^(n_l - m_i) (m_i from its largest scaled feature)."""
    qd, kd, vd = _f64(q, k, v)
    key_n = _exponent(_log_elu(kd).amax(dim=-2, keepdim=True))
    query_n = _exponent((_log_elu(qd) + key_n * LN2).amax(dim=-1, keepdim=True))
    fq, fk = _elu_scaled(qd, key_n - query_n), _elu_scaled(kd, -key_n)
    state = torch.einsum("bhjl,bhjc->bhlc", fk, vd)
    num = torch.einsum("bhil,bhlc->bhic", fq, state)
    den = torch.einsum("bhil,bhl->bhi", fq, fk.sum(dim=-2))
    return (num / den.unsqueeze(-1)).to(q.dtype)


def elu_masked_quadratic(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu from the explicit masked weights phi(q_i).phi(k_j), j <= i, with key
    feature l scaled by a power of two from its running maximum over the keys j <= i: one
    matmul per run of queries sharing that scale (a single run unless inputs are extreme)."""
    qd, kd, vd = _f64(q, k, v)
    n = qd.shape[-2]
    key_n = _exponent(torch.cummax(_log_elu(kd), dim=-2).values)  # (B, H, N, d), per query
    query_n = _exponent((_log_elu(qd) + key_n * LN2).amax(dim=-1, keepdim=True))
    fq = _elu_scaled(qd, key_n - query_n)
    changed = (key_n[..., 1:, :] != key_n[..., :-1, :]).any(dim=-1).flatten(0, -2).any(dim=0)
    starts = [0, *(torch.nonzero(changed).flatten() + 1).tolist(), n]
    positions = torch.arange(n, device=qd.device)
    outs = []
    for start, stop in pairwise(starts):
        fk = _elu_scaled(kd[..., :stop, :], -key_n[..., start : start + 1, :])
        visible = positions[:stop] <= positions[start:stop, None]
        # keys after a query may overflow its scale: masked out, never summed
        weights = torch.where(visible, fq[..., start:stop, :] @ fk.mT, 0.0)
        outs.append((weights @ vd[..., :stop, :]) / weights.sum(dim=-1, keepdim=True))
    return torch.cat(outs, dim=-2).to(q.dtype)


class EluStream:
    """Causal elu token by token: carries S = sum_j phi(k_j) v_j^T, z = sum_j phi(k_j) and
    the running power-of-two scale of each key feature from one piece to the next."""

    def __init__(self) -> None:
        self.s: Tensor | None = None
        self.z: Tensor | None = None
        self.key_n: Tensor | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        qd, kd, vd = _f64(q, k, v)
        if self.s is None:
            b, h, _, d = qd.shape
            self.s = qd.new_zeros(b, h, d, vd.shape[-1])
            self.z = qd.new_zeros(b, h, d)
            self.key_n = qd.new_full((b, h, d), -math.inf)
        outs = []
        for t in range(qd.shape[-2]):
            key_n = torch.maximum(self.key_n, _exponent(_log_elu(kd[..., t, :])))
            decay = torch.pow(2.0, self.key_n - key_n)  # exact; 0 for the empty state
            fk = _elu_scaled(kd[..., t, :], -key_n)
            self.s = self.s * decay.unsqueeze(-1) + fk.unsqueeze(-1) * vd[..., t, None, :]
            self.z = self.z * decay + fk
            self.key_n = key_n
            query_n = _exponent((_log_elu(qd[..., t, :]) + key_n * LN2).amax(-1, keepdim=True))
            fq = _elu_scaled(qd[..., t, :], key_n - query_n)
            num = (fq.unsqueeze(-2) @ self.s).squeeze(-2)
            outs.append(num / (fq * self.z).sum(dim=-1, keepdim=True))
        return torch.stack(outs, dim=-2).to(q.dtype)


def elu_token_recurrence(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal elu: EluStream over the whole sequence in one piece."""
    return EluStream()(q, k, v)


def relu_bmm(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal relu with (B H) flattened into one batch of bmm; 0/0 rows stay NaN."""
    b, h, nq = q.shape[:3]
    qd, kd, vd = (t.reshape(b * h, t.shape[-2], t.shape[-1]) for t in _f64(q, k, v))
    fq, fk = torch.relu(qd), torch.relu(kd)
    num = torch.bmm(fq, torch.bmm(fk.mT, vd))
    den = torch.bmm(fq, fk.sum(dim=-2).unsqueeze(-1))
    return (num / den).reshape(b, h, nq, -1).to(q.dtype)


def _rsqrt_split(d: int) -> tuple[float, float]:
    """1/sqrt(d) = hi + lo to twice float64's precision: a rounded 1/sqrt(d) would scale
    every logit by the same 1 + delta and so skew weights by delta |s_ij - s_ik|."""
    hi = d**-0.5
    return hi, float(Fraction(hi) * (1 - d * Fraction(hi) ** 2) / 2)


def softmax_logsumexp(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Softmax as exp(s - logsumexp(s)) on masked logits; dividing by the weights' sum
    cancels the rounding of the log-sum-exp, which is common to a row."""
    qd, kd, vd = _f64(q, k, v)
    scores = qd @ kd.mT
    hi, lo = _rsqrt_split(q.shape[-1])
    logits = scores * hi + scores * lo
    if causal:
        visible = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~visible, -math.inf)
    weights = torch.exp(logits - torch.logsumexp(logits, dim=-1, keepdim=True))
    return ((weights @ vd) / weights.sum(dim=-1, keepdim=True)).to(q.dtype)


def performer_feature_shifts(q: Tensor, k: Tensor, v: Tensor, projection: Tensor) -> Tensor:
    """Non-causal FAVOR+ with key feature r shifted by its largest exponent over the keys and
    query rows by their largest; the per-query factor exp(-|q'|^2/2) and 1/sqrt(m) cancel."""
    qd, kd, vd, w = _f64(q, k, v, projection)
    scale = q.shape[-1] ** -0.25
    ks = kd * scale
    key_exp = ks @ w.mT - 0.5 * (ks * ks).sum(dim=-1, keepdim=True)
    key_shift = key_exp.amax(dim=-2, keepdim=True)
    query_exp = (qd * scale) @ w.mT + key_shift
    fq = torch.exp(query_exp - query_exp.amax(dim=-1, keepdim=True))
    fk = torch.exp(key_exp - key_shift)
    num = fq @ (fk.mT @ vd)
    den = fq @ fk.sum(dim=-2).unsqueeze(-1)
    return (num / den).to(q.dtype)


def cosformer_prefix_sums(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal cosFormer: cos(a_i - a_j) = cos a_i cos a_j + sin a_i sin a_j, a_i = pi i / (2N),
    with the prefix sums of phi(k_j) v_j^T and phi(k_j) over j <= i taken by cumsum."""
    qd, kd, vd = _f64(q, k, v)
    angle = torch.arange(q.shape[-2], dtype=torch.float64, device=q.device)
    angle = angle * (math.pi / (2 * q.shape[-2]))
    trig = torch.stack([angle.cos(), angle.sin()], dim=-1).unsqueeze(-1)  # (N, 2, 1)
    fq = (torch.relu(qd).unsqueeze(-2) * trig).flatten(-2)  # (B, H, N, 2d)
    fk = (torch.relu(kd).unsqueeze(-2) * trig).flatten(-2)
    s = torch.cumsum(fk.unsqueeze(-1) * vd.unsqueeze(-2), dim=-3)  # (B, H, N, 2d, dv)
    z = torch.cumsum(fk, dim=-2)
    num = torch.einsum("bhnf,bhnfc->bhnc", fq, s)
    den = (fq * z).sum(dim=-1, keepdim=True)
    return (num / den).to(q.dtype)


def taylor_completed_square(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Non-causal taylor as ((1 + s)^2 + 1) / 2 = 1 + s + s^2/2, positive with no cancellation."""
    qd, kd, vd = _f64(q, k, v)
    s = qd @ kd.mT / math.sqrt(q.shape[-1])
    weights = ((1 + s) ** 2 + 1) / 2
    return ((weights @ vd) / weights.sum(dim=-1, keepdim=True)).to(q.dtype)


def _correct(name: str, fn, feature_map: str, causal: bool, how: str, **extra) -> Entry:
    return Entry(name, fn, feature_map, causal, broken=False, bug=how, **extra)


softmax_logsumexp_causal = partial(softmax_logsumexp, causal=True)

ENTRIES: tuple[Entry, ...] = (
    _correct(
        "elu-einsum",
        elu_einsum,
        "elu",
        causal=False,
        how="einsum in float64; power-of-two scales per key feature and per query row",
    ),
    _correct(
        "elu-masked-quadratic",
        elu_masked_quadratic,
        "elu",
        causal=True,
        how="explicit masked (Nq, Nk) weights in float64, key features scaled by their "
        "running maximum per query",
        cost="quadratic",
    ),
    _correct(
        "elu-token-recurrence",
        elu_token_recurrence,
        "elu",
        causal=True,
        how="token-by-token recurrence in float64 carrying S, z and per-feature key scales; "
        "its stream resumes from them",
        stream=EluStream,
    ),
    _correct(
        "relu-bmm",
        relu_bmm,
        "relu",
        causal=False,
        how="linear form with (B H) flattened into one bmm batch, float64; 0/0 rows are NaN",
    ),
    _correct(
        "softmax-logsumexp",
        softmax_logsumexp,
        "softmax",
        causal=False,
        how="exp(s - logsumexp(s)) in float64, renormalised",
    ),
    _correct(
        "softmax-logsumexp-causal",
        softmax_logsumexp_causal,
        "softmax",
        causal=True,
        how="exp(s - logsumexp(s)) on -inf-masked logits in float64, renormalised",
        grad=True,  # its autograd backward, vetted with the gradient checks
    ),
    _correct(
        "performer-feature-shifts",
        performer_feature_shifts,
        "performer-positive",
        causal=False,
        how="linear form in float64, exponents shifted per key feature and per query row",
    ),
    _correct(
        "cosformer-prefix-sums",
        cosformer_prefix_sums,
        "cosformer",
        causal=True,
        how="cos/sin decomposition with cumsum prefix states in float64",
        grad=True,  # its autograd backward, vetted with the gradient checks
    ),
    _correct(
        "taylor-completed-square",
        taylor_completed_square,
        "taylor",
        causal=False,
        how="quadratic form of ((1 + s)^2 + 1) / 2 in float64",
        grad=True,  # its autograd backward, vetted with the gradient checks
        cost="quadratic",
    ),
)
