"""What both reference engines share: precision limits, errors, the causal key set."""

from __future__ import annotations

# Highest working precision either engine goes to. Inputs are float64 (exponents 2^-1074 ..
# 2^1024), so two distinct logits or products differ by more than 2^-2200 relative, and
# resolving any cancellation among them, or telling a result below 2^-1075 from zero,
# takes fewer than ~4200 bits; 8192 leaves room for the sums over N.
MAX_PREC = 8192


class ReferenceAccuracyError(ArithmeticError):
    """The engine could not reach float64 accuracy within MAX_PREC bits."""


def allowed_keys(i: int, n_keys: int, causal: bool) -> range:
    """Keys j that query i attends to: j <= i when causal (DESIGN: inclusive)."""
    return range(min(i + 1, n_keys) if causal else n_keys)
