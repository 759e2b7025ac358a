"""How the report's sweeps draw a decay (Family.notes, report/notes.py): the scalar decays',
channel gates' and the gated delta rules' (their gates are drawn alike: cases.Case.decay)."""

from __future__ import annotations

from ..protocol import ArgumentNotes

DECAY_NOTES = ArgumentNotes(
    key="decay",
    title="The decay",
    accuracy="cases.Case.decay of Case(B, H, N, d, dv, dtype, seed=seed): gamma_h = "
    "exp(-2^-h / 16), or log-gates (1 / 16) ln U, U ~ U(0, 1] (channel gates: key channel "
    "m's rate times 2^(1 - m mod 4))",
    long="checks/long_context.py's (Family.long_arguments), head 0: an effective memory of "
    "2^12 tokens",
    scaling="families.default_arguments, as vet's scaling check: gamma = exp(-1 / 16) per "
    "head, or log-gates -1 / 16 every token",
    long_note=" A decayed spec's decay is that of the long-context check's first head "
    "(an effective memory of 2^12 tokens).",
    applies=lambda spec: spec.decay is not None,
)
