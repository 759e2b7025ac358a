"""What both reference engines share: precision limits, errors, the causal key set."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from flint import arb

from ..inputs import AttentionInputs

# Highest working precision either engine goes to. Inputs are float64 (exponents 2^-1074 ..
# 2^1024), so two distinct logits or products differ by more than 2^-2200 relative, and
# resolving any cancellation among them, or telling a result below 2^-1075 from zero,
# takes fewer than ~4200 bits; 8192 leaves room for the sums over N.
MAX_PREC = 8192


class ReferenceAccuracyError(ArithmeticError):
    """The engine could not reach float64 accuracy within MAX_PREC bits."""


def allowed_keys(i: int, n_keys: int, causal: bool) -> range:
    """Keys j that query i attends to: j <= i when causal (inclusive: docs/contract.md)."""
    return range(min(i + 1, n_keys) if causal else n_keys)


def head_decay(x: AttentionInputs, b: int, h: int) -> np.ndarray | None:
    """Head (b, h)'s decay: gamma (0-d, per head) or its log-gates ((N,) or (N, d) for
    channel gates), None without one (inputs.AttentionInputs.decay)."""
    if x.decay is None:
        return None
    return x.decay[h] if x.decay.ndim == 1 else x.decay[b, h]


# settle(b, h, rows, prec) -> (values (len(rows), dv), done (len(rows),) bool)
Settle = Callable[[int, int, list[int], int], tuple[np.ndarray, np.ndarray]]


def refine(
    x: AttentionInputs,
    settle: Settle,
    prec: int,
    max_prec: int,
    engine: str,
    pending: dict[tuple[int, int], list[int]] | None = None,
):
    """Run `settle` on every head at prec, 2 prec, ... on the rows not yet done; the
    precision control both engines share. Returns the (B, H, Nq, dv) float64 output.
    pending: only these rows of these heads (the rest of the output is NaN)."""
    b_, h_, nq = x.q.shape[:3]
    out = np.full((b_, h_, nq, x.v.shape[3]), np.nan)
    if pending is None:
        pending = {(b, h): list(range(nq)) for b in range(b_) for h in range(h_)}
    for (b, h), todo in pending.items():
        rows, p = list(todo), prec
        while rows:
            if p > max_prec:
                raise ReferenceAccuracyError(
                    f"{engine} engine: rows {rows[:5]} of head ({b}, {h}) are not "
                    f"resolved to float64 at {max_prec} bits"
                )
            values, done = settle(b, h, rows, p)
            out[b, h, [i for i, ok in zip(rows, done) if ok]] = values[done]
            rows, p = [i for i, ok in zip(rows, done) if not ok], 2 * p
    return out


def resolve_recurrence(
    q_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    solve,
    prec: int,
    max_prec: int,
    what: str,
    state: bool,
    pending: dict | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """A recurrent rule's rows and final state to float64, head by head: solve(b, h, rows,
    p, need_state) -> (values (len(rows), dv), done (len(rows),) bool, S_N or None if not
    resolved) at p = prec, 2 prec, ... on the rows and state not yet resolved;
    ReferenceAccuracyError past max_prec, naming `what` (the engine and the rule). pending:
    only these rows of these heads ({(b, h): rows}; NaN elsewhere). Returns (o, S_N or None)."""
    b_, h_, n, d = q_shape
    out = np.full(v_shape, np.nan)
    final = np.full((b_, h_, d, v_shape[3]), np.nan) if state else None
    if pending is None:
        pending = {(b, h): range(n) for b in range(b_) for h in range(h_)}
    for (b, h), todo in pending.items():
        rows, p, need = list(todo), prec, state
        while rows or need:
            if p > max_prec:
                which = f"rows {rows[:5]}" if rows else "the final state"
                raise ReferenceAccuracyError(
                    f"{what}: {which} of head ({b}, {h}) not resolved to float64 at {max_prec} bits"
                )
            values, done, s = solve(b, h, rows, p, need)
            out[b, h, [i for i, ok in zip(rows, done) if ok]] = values[done]
            rows = [i for i, ok in zip(rows, done) if not ok]
            if s is not None:
                final[b, h], need = s, False
            p *= 2
    return out, final


def decided(ball: arb) -> float:
    """The nearest float64 to every point of `ball`, or NaN if they do not share one."""
    lo, hi = float(ball.lower()), float(ball.upper())
    return lo + 0.0 if lo == hi else math.nan
