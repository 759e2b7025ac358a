"""The zoo: deliberately broken attention implementations and correct ones written another way.

Every broken entry must be rejected by some check, and no correct entry may be flagged
(docs/architecture.md, "Outside the package"). Each entry follows the implementation contract:
fn(q, k, v), or fn(q, k, v, projection=W) for the Performer maps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One implementation of the zoo and what it claims.

    stream, if given, is a zero-argument factory of a callable piece(q, k, v) -> out that
    carries the causal state from one piece of a sequence to the next (split and resume).
    cost: the growth it claims ("linear", or "quadratic" for a quadratic form; None: vet's
    default). caught_by: for a broken entry, the checks its bug must fail (the right
    reason), among whatever else it fails. grad: vet it with the gradient checks too
    (`vet --grad`); a broken entry with grad fails those alone (its forward is right).
    regime: for a broken entry, the mildest regime its bug shows in (regimes.py); a bug
    that shows only in stress or extreme inputs is a robustness warning by default.
    long: vet it with the long-context check, and with grad the gradient checks at length
    (minutes in CI across the zoo: the other entries, whose bugs show at N <= 65, go
    without them).
    state: the layout of the state fn carries (--state: fn(q, k, v, initial_state=...)
    returns (out, final_state)), or None. varlen: fn also takes packed batches
    (--varlen: fn(q, k, v, cu_seqlens=None)).
    decay: the decay of the spec it claims (specs.DECAYS: "constant", fn(q, k, v,
    gamma=(H,)), "gates", fn(q, k, v, g=(B, H, N)), or "channel-gates", fn(q, k, v,
    g=(B, H, N, d))), or None. normalize: False for an
    unnormalised spec (out_i = sum_j w_ij phi(q_i).phi(k_j) v_j, no division). scale: the
    spec's c (a number, or "d^-0.5"). triton: its
    kernels are Triton code, run in Triton's interpreter (--triton interpret). delta_rule:
    the delta rule's spec (fn(q, k, v, beta=(B, H, N)[, g=...]), families/delta/fields.py).
    value_heads: the G of grouped value heads it claims (--value-heads G: q and k of H heads,
    v and beta of G H), or 1.
    smallest: vet it at the smallest plan (one typical case per dtype, no search), as the
    Triton entries: a backward bug whose forward is a correct entry's, judged there.
    tf32: its Triton kernels run with TF32 products (--tf32), as on a GPU by default.
    family: the family it claims by name (--family NAME: families.registry.NAMED), or None;
    claim: its family's own options (Family.options) by name, as (name, value) pairs.
    step: the layout of each slot of the state cache of a step kernel (--step: fn(q, k, v,
    cache=..., slots=...)), or None.
    """

    name: str
    fn: Callable
    feature_map: str
    causal: bool
    broken: bool
    bug: str
    eps: float = 0.0
    stream: Callable | None = None
    cost: str | None = None
    caught_by: tuple[str, ...] = ()
    grad: bool = False
    regime: str = "typical"
    long: bool = False
    state: str | None = None
    varlen: bool = False
    decay: str | None = None
    normalize: bool = True
    scale: float | str = 1.0
    triton: bool = False
    delta_rule: bool = False
    value_heads: int = 1
    smallest: bool = False
    tf32: bool = False
    family: str | None = None
    claim: tuple[tuple[str, object], ...] = ()
    step: str | None = None


# The entry modules import Entry from here, so they come after its definition.
import importlib.util  # noqa: E402

from . import (  # noqa: E402
    backward,
    broken,
    correct,
    decay,
    delta,
    delta_backward,
    gla,
    long,
    long_backward,
    long_decay,
    ssd,
    state,
    step,
    subtle,
    textbook,
    varlen,
)

# the Triton kernels need triton (pyproject's `triton` extra, which CI installs)
if importlib.util.find_spec("triton") is not None:
    from . import triton_kernels

    TRITON_ENTRIES: tuple[Entry, ...] = triton_kernels.ENTRIES
else:
    TRITON_ENTRIES = ()

ZOO: tuple[Entry, ...] = (
    broken.ENTRIES
    + subtle.ENTRIES
    + correct.ENTRIES
    + textbook.ENTRIES
    + backward.ENTRIES
    + long.ENTRIES
    + long_decay.ENTRIES
    + long_backward.ENTRIES
    + state.ENTRIES
    + step.ENTRIES
    + varlen.ENTRIES
    + decay.ENTRIES
    + gla.ENTRIES
    + delta.ENTRIES
    + delta_backward.ENTRIES
    + ssd.ENTRIES
    + TRITON_ENTRIES
)

__all__ = ["ZOO", "Entry"]
