"""Softmax attention's known-answer vectors (linattn_verify/known_answers/): its plain spec,
causal and not, in part 1 with the kernelised maps' (Family.known_answer_specs); their cases
are known_answers/cases.py's."""

from __future__ import annotations

from ...specs import Spec

KNOWN_ANSWER_SPECS = tuple((1, Spec("softmax", causal=causal)) for causal in (False, True))
