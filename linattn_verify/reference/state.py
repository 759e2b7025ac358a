"""The exact state of a causal kernelised spec after its last token, faithfully rounded to
float64: S = sum_j w_j phi(k_j) v_j^T and z = sum_j w_j phi(k_j) (Katharopoulos et al. 2020,
eq. 18-20; w_j = 1, or with a decay w_(N-1, j): Sun et al. 2023, eq. 6; Yang et al. 2024,
eq. 3), phi the spec's feature map (balls.features: the order of the features is the
spec's); the spec's scale is the queries', not the state's. In ball arithmetic: every
element is accepted once its ball determines its float64 rounding, else the head is
recomputed at twice the precision (arb.rounded)."""

from __future__ import annotations

import numpy as np
from flint import arb, arb_mat

from ..inputs import AttentionInputs
from ..specs import RSQRT_D, Spec, SpecError
from .arb import DEFAULT_PREC, rounded
from .balls import Head, balls, decay_weights, features, working_precision
from .common import MAX_PREC, ReferenceAccuracyError


def _head_state(head: Head, spec: Spec, prec: int) -> list[list[float | None]]:
    """[S | z] (F, dv + 1) of one head at `prec` bits, None where not yet resolved."""
    n = head.k.shape[0]
    with working_precision(prec):
        rows = features(head.k, range(n), head, spec.feature_map)
        if spec.decay is not None:
            last = decay_weights(head, [n - 1], spec.decay)[0]
            rows = [[t * w for t in row] for row, w in zip(rows, last, strict=True)]
        fk = arb_mat(rows)
        right = arb_mat([[*row, arb(1)] for row in balls(head.v)])
        sums = (fk.transpose() * right).tolist()
    return [[rounded(t) for t in row] for row in sums]


def exact_state(
    x: AttentionInputs, spec: Spec, prec: int = DEFAULT_PREC, max_prec: int = MAX_PREC
) -> tuple[np.ndarray, np.ndarray]:
    """(S (B, H, F, dv), z (B, H, F)) over every key of x, in float64."""
    if no_state := Spec(spec.feature_map, causal=True).no_state:  # the state after every key
        raise SpecError(no_state)
    b_, h_ = x.k.shape[:2]
    heads = [
        np.array(_resolved(lambda p, b=b, h=h: (_head_state(Head.of(x, b, h), spec, p),),
                           f"the state of head ({b}, {h})", prec, max_prec)[0])
        for b in range(b_)
        for h in range(h_)
    ]  # fmt: skip
    sz = np.stack(heads).reshape(b_, h_, *heads[0].shape)
    return sz[..., :-1], sz[..., -1]


def exact_state_gradients(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray,
    prec: int = DEFAULT_PREC,
    max_prec: int = MAX_PREC,
) -> tuple[np.ndarray, np.ndarray]:
    """For an unnormalised causal spec continuing an initial state S_0, and the loss
    L = sum(out * g_out) + sum(S_N * g_state) (S_N the final state): (dL/dS_0 (B, H, F, dv),
    dL_S/dv (B, H, N, dv)), L_S = sum(S_N * g_state) alone, faithfully rounded to float64.

    out_i = c phi(q_i)^T (W_i S_0 + sum_(j<=i) w_ij phi(k_j) v_j^T) and S_N = W_(N-1) S_0 +
    sum_j w_(N-1, j) phi(k_j) v_j^T, W_i = w_(i, -1) the decay from before the first token
    to i (exp(G_i), gamma^(i + 1); 1 without a decay), so dL/dS_0 = sum_i c W_i phi(q_i)
    g_out_i^T + W_(N-1) g_state (the final state's cotangent, fla's dht, flows into dh0)
    and dL_S/dv_j = w_(N-1, j) g_state^T phi(k_j)."""
    if spec.normalize or spec.no_state:
        raise SpecError(f"exact state gradients are for unnormalised causal specs, not {spec}")
    b_, h_, n = x.q.shape[:3]
    out_s, out_v = [], []
    for b in range(b_):
        for h in range(h_):
            ds, dv = _resolved(
                lambda p, b=b, h=h: _head_state_gradients(
                    Head.of(x, b, h), spec, g_out[b, h], g_state[b, h], p
                ),
                f"the state gradients of head ({b}, {h})", prec, max_prec,
            )  # fmt: skip
            out_s.append(np.array(ds, dtype=np.float64))
            out_v.append(np.array(dv, dtype=np.float64))
    f, dv_ = out_s[0].shape
    return np.stack(out_s).reshape(b_, h_, f, dv_), np.stack(out_v).reshape(b_, h_, n, dv_)


def _resolved(compute, what: str, prec: int, max_prec: int) -> tuple:
    """compute(p) -> tables of floats (None where not resolved) at p = prec, 2 prec, ...
    until every entry is resolved; ReferenceAccuracyError past max_prec."""
    while prec <= max_prec:
        tables = compute(prec)
        if all(t is not None for table in tables for row in table for t in row):
            return tables
        prec *= 2
    raise ReferenceAccuracyError(f"{what} is not resolved at {max_prec} bits")


def _head_state_gradients(head: Head, spec: Spec, g_out, g_state, prec: int):
    """(dL/dS_0, dL_S/dv) of one head at `prec` bits, None where not yet resolved."""
    n, d = head.q.shape
    with working_precision(prec):
        c = arb(d).rsqrt() if spec.scale == RSQRT_D else arb(spec.scale)
        fq = features(head.q, range(n), head, spec.feature_map)
        fk = features(head.k, range(n), head, spec.feature_map)
        into, last = _from_start(head, spec), [arb(1)] * n
        if spec.decay is not None:
            last = decay_weights(head, [n - 1], spec.decay)[0]
        left = arb_mat([[c * into[i] * t for t in fq[i]] for i in range(n)])
        ds = left.transpose() * arb_mat(balls(g_out)) + arb_mat(balls(g_state)) * into[-1]
        keys = arb_mat([[last[j] * t for t in fk[j]] for j in range(n)])
        dv = keys * arb_mat(balls(g_state))
        return tuple([[rounded(t) for t in row] for row in m.tolist()] for m in (ds, dv))


def _from_start(head: Head, spec: Spec) -> list:
    """W_i: the decay from before the first token to token i (1 without a decay)."""
    n = head.q.shape[0]
    if spec.decay is None:
        return [arb(1)] * n
    if spec.decay == "constant":
        gamma, out = arb(float(head.decay)), []
        for _ in range(n):
            out.append((out[-1] if out else arb(1)) * gamma)
        return out
    total, out = arb(0), []
    for g in head.decay.tolist():
        total += g
        out.append(total.exp())
    return out
