"""The decay at its extremes (Sun et al. 2023, eq. 5; Yang et al. 2024, eq. 3): the output
against the exact reference, judged by the accuracy model as the reference check judges it,
for decays whose rounding or range a kernel gets wrong:

- decays next to 1 (ln w of about -4 u a token, u the inputs' unit roundoff: gamma a few
  ulps below 1, the last representable decays; a kernel that rounds them to 1, or forms
  1 - w in a precision that loses them, shows here);
- decays next to 0 (e^-20 a token: decays that underflow, and exp(G_i) exp(-G_j) formed
  apart overflows as the prefix sums G run to -20 N: fla PR #649, executorch PR #21417);
- decays of about e^-1 a token: prefix sums spanning tens to thousands, where accumulating
  them in a low precision loses the decay of nearby tokens.
Channel gates take each rate at 2^(1 - m mod 4) times it in key channel m (Case.decay): strong
and weak channels in every case.
"""

from __future__ import annotations

import zlib
from dataclasses import replace

from ..cases import DECAY_RATE, Case
from ..inputs import UNIT_ROUNDOFF
from ..under_test import Implementation
from .agreement import reference_agreement
from .core import Outcome, check

# (what, mean -ln w per token; None: NEAR_ONE units of roundoff of the inputs' dtype)
EXTREMES = (("decay next to 1", None), ("decay next to 0", 20.0), ("wide decay sums", 1.0))
NEAR_ONE = 4.0


def judged_case(case: Case) -> tuple[str, Case]:
    """The extreme of EXTREMES the decay check judges `case` at, and the case at its rate:
    the case's own (its description's CRC: a search over cases reaches all three, each case
    costs one judgement), or the rate the case gives when it is not the default (a
    reproduced failure)."""
    near_one = NEAR_ONE * UNIT_ROUNDOFF[case.dtype]
    rates = {what: near_one if rate is None else rate for what, rate in EXTREMES}
    if case.decay_rate != DECAY_RATE:
        rate = case.decay_rate
        what = {r: w for w, r in rates.items()}.get(rate, "the case's decay")
    else:
        what = EXTREMES[zlib.crc32(case.to_json().encode()) % len(EXTREMES)][0]
        rate = rates[what]
    return what, replace(case, decay_rate=rate)


@check("decay")
def decay(impl: Implementation, case: Case) -> Outcome:
    """The reference judgement of `case` at the decay rate judged_case gives it."""
    what, case = judged_case(case)
    rate = case.decay_rate
    result = reference_agreement(impl, case)
    message = f"{what} (decay_rate {rate:g}): {result.message}"
    return Outcome(result.passed, message, result.figures, result.by_nature, result.severity,
                   result.worst)  # fmt: skip
