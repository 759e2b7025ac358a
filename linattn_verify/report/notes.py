"""How the report's sweeps describe the arguments of a family that has them (Family.notes),
one description per key of the JSON (families that draw theirs alike share one)."""

from __future__ import annotations

from ..families import FAMILIES
from ..families.protocol import ArgumentNotes
from .long import DELTA_FULL_LONGEST, DELTA_LONGEST, power_of_2

NOTES: dict[str, ArgumentNotes] = dict(
    sorted({notes.key: notes for family in FAMILIES for notes in family.notes}.items())
)


def filled(text: str) -> str:
    """A note's text with the N at which the long section stops a stepwise family."""
    return text.format(
        longest=DELTA_LONGEST,
        full_longest=DELTA_FULL_LONGEST,
        longest_power=power_of_2(DELTA_LONGEST),
        full_longest_power=power_of_2(DELTA_FULL_LONGEST),
    )
