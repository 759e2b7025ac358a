"""The decay at its extremes (Sun et al. 2023, eq. 5; Yang et al. 2024, eq. 3): the output
against the exact reference, judged by the accuracy model as the reference check judges it,
for decays whose rounding or range a kernel gets wrong:

- decays next to 1 (gamma = e^-(2^-20), gates of about -2^-20 a token: a power gamma^(i-j)
  formed from a rounded ln gamma, or a decay of exactly 1 where it is not, shows here);
- decays next to 0 (e^-20 a token: decays that underflow, and exp(G_i) exp(-G_j) formed
  apart overflows as the prefix sums G run to -20 N: fla PR #649, executorch PR #21417);
- decays of about e^-1 a token: prefix sums spanning tens to thousands, where accumulating
  them in a low precision loses the decay of nearby tokens.
"""

from __future__ import annotations

from dataclasses import replace

from ..cases import Case
from ..under_test import Implementation
from .agreement import reference_agreement
from .core import Outcome, check

# (what, mean -ln w per token)
EXTREMES = (("decay next to 1", 2.0**-20), ("decay next to 0", 20.0), ("wide decay sums", 1.0))


@check("decay")
def decay(impl: Implementation, case: Case) -> Outcome:
    """The reference judgement of `case` at each decay rate of EXTREMES in turn; the first
    that fails is the outcome."""
    passed = []
    for what, rate in EXTREMES:
        result = reference_agreement(impl, replace(case, decay_rate=rate))
        if not result.passed:
            message = f"{what} (decay_rate {rate:g}): {result.message}"
            return Outcome(False, message, result.figures, result.by_nature, result.severity,
                           result.worst)  # fmt: skip
        passed.append(f"{what}: {result.figures['max_error']:.3g} u s")
    return Outcome(True, "; ".join(passed))
