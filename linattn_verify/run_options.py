"""What vet runs on an implementation (RUN: its backward, the long-context check's N), and
every option an entry point takes that names a spec or a contract, one definition (OPTIONS:
what an implementation claims, under_test.claim.CLAIM, and RUN). `vet`'s arguments, the
pytest plugin's options, assert_linear_attention's keywords and vet's reproduce line all
come from OPTIONS."""

from __future__ import annotations

from .checks import GRAD_CHECKS
from .checks.gradient_length import LONGEST_DEFAULT as LONG_GRAD_LONGEST
from .checks.gradient_length import NAME as GRADIENT_LENGTH
from .checks.gradient_length import SHORTER_LONGEST, SHORTEST
from .checks.long_context import (
    INTERPRETED_LONGEST,
    LONGEST,
    SMALLEST_LONGEST,
    lengths,
    memory_problem,
)
from .grammar import Option
from .under_test.claim import CLAIM


def _long_problem(longest: int, label: str) -> str | None:
    """Why the long-context check cannot run to `longest` here: below its first length, or
    beyond this machine's memory; None when it can (0 skips it)."""
    if longest < 0 or 0 < longest < lengths()[0]:
        return f"{label} must be 0 (skip) or at least {lengths()[0]}, got {longest}"
    return memory_problem(longest) if longest else None


def _long_grad_problem(longest: int, label: str) -> str | None:
    """Why the gradient checks cannot run to `longest`: below their first length."""
    if longest < 0 or 0 < longest < SHORTEST:
        return f"{label} must be 0 (skip) or at least {SHORTEST}, got {longest}"
    return None


RUN = (
    Option("grad", "--grad", bool, False,
           "also the checks of its backward: " + ", ".join(GRAD_CHECKS)),
    Option("longest", "--long", int | None, None,
           f"the long-context check at N = 2^10, 2^12, ... up to N and N + 1 (default "
           f"{LONGEST}; in Triton's interpreter and for the delta rule {INTERPRETED_LONGEST}, "
           f"with --smallest "
           f"{SMALLEST_LONGEST}; 0 skips it); an N beyond this machine's memory is refused up "
           "front", metavar="N", check=_long_problem),
    Option("long_grad", "--long-grad", int | None, None,
           f"with --grad, {GRADIENT_LENGTH}: the backward at N = {SHORTEST}, 1024, ... up to "
           f"N against certified exact gradients (default {LONG_GRAD_LONGEST}; in Triton's "
           f"interpreter, for the delta rule and softmax {SHORTER_LONGEST}; not in --smallest; "
           "0 skips "
           "it)", metavar="N", check=_long_grad_problem),
)  # fmt: skip
OPTIONS = (*CLAIM, *RUN)
