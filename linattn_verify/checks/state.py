"""A carried state (--state: fn(q, k, v, initial_state=...) returns (out, final_state)).

- state-split: the sequence in pieces at every position class (1-token pieces, a chunk
  boundary of 16 and 64 and one past it, ragged cuts), each piece continuing from the state
  the previous one returned, gives the one-pass output and final state (mamba #641,
  sglang #31833: states of pieces not aligned to chunk boundaries);
- initial-state: a prefix folded into initial_state (its exact state) gives what
  prepending the prefix gives. For normalised specs this decides whether the normaliser
  accounts for the state, and the failure says which way it is wrong: the state ignored
  (vllm PR #22034), or a normaliser that divides by this call's keys only (fla's
  normalize_output);
- final-state: the final state against the exact one (reference/state.py) within the bound
  of accuracy/state_bounds.py's state_bound.

Outputs are compared within the sum of their a-priori bounds (compare.py), states within
the sum of their state bounds: any evaluation order satisfies them. The state is (S, z), or
S alone for an unnormalised spec (under_test.claim.state_layout); a decayed spec's pieces take
their own gates (the tokens' slice of g), gamma whole.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from ..accuracy.state_bounds import state_bound
from ..cases import Case
from ..families import exact_state, validate
from ..inputs import SMALLEST_SUBNORMAL, unit_roundoff
from ..reference.certified import float_features
from ..under_test import Implementation
from .compare import Tolerance, agreement, mismatch
from .core import Outcome, as_array, case_generator, check, decay_part, inputs_of

CHUNKS = (16, 64)  # the chunk sizes kernels use most; a cut at each and one past it


def _array(t) -> np.ndarray:
    return t if isinstance(t, np.ndarray) else as_array(t)


def _piece(t: torch.Tensor, a: int, b: int) -> torch.Tensor:
    return t[..., a:b, :]


def _pieces(q, k, v, decay, a: int, b: int) -> tuple:
    """Tokens a..b-1 of q, k, v and their decay."""
    return (*(_piece(t, a, b) for t in (q, k, v)), decay_part(decay, tokens=slice(a, b)))


def state_parts(state, spec) -> tuple:
    """The state's tensors: (S, z), or (S,) for an unnormalised spec."""
    return tuple(state) if spec.normalize else (state,)


def exact_parts(x, spec) -> tuple[np.ndarray, ...]:
    """The exact state as state_parts has it."""
    return exact_state(x, spec)[: 1 + spec.normalize]


def _cuts(case: Case) -> list[tuple[str, list[int]]]:
    """(name, cut points) of each split of a sequence of case.n tokens."""
    n, splits = case.n, []
    if n <= 16:
        splits.append(("1-token pieces", list(range(1, n))))
    for c in CHUNKS:
        splits += [(f"cut at {p}", [p]) for p in (c, c + 1) if p < n]
    if n > 2:
        drawn = torch.randint(1, n, (2,), generator=case_generator(case, 21))
        splits.append(("ragged", sorted({int(t) for t in drawn})))
    return splits


def state_mismatch(got, want, allowed: tuple[np.ndarray, ...]) -> str | None:
    """Where the state's parts `got` differ from `want` by more than `allowed`, or None."""
    for name, g, w, a in zip(("S", "z")[: len(got)], got, want, allowed, strict=True):
        g64, w64 = _array(g), _array(w)
        with np.errstate(invalid="ignore"):
            diff = np.abs(g64 - w64)
            bad = ~((g64 == w64) | (np.isfinite(diff) & (diff <= a)))
        if bad.any():
            i = tuple(int(t) for t in np.argwhere(bad)[0])
            return (
                f"{name}{list(i)} = {g64[i]:.9g} against {w64[i]:.9g} ({int(bad.sum())} "
                f"element(s) beyond the bound, {a[i]:.3g} there)"
            )
    return None


# maps whose every feature is positive: a key sum of 0 is an underflow, never exact
POSITIVE_FEATURES = ("elu", "performer-positive", "performer-hyperbolic")


def unrepresentable(exact, dtype: torch.dtype, feature_map: str) -> str | None:
    """Why the exact state cannot be held in true units in `dtype` (the contract's state:
    a kernel that keeps its sums shifted inside cannot return them): an element past its
    largest value, or a key sum z below its smallest normal (nonzero, or zero for a map of
    positive features, whose sums are never exactly 0)."""
    info = torch.finfo(dtype)
    if any(np.any(np.abs(t) > info.max) for t in exact):
        return f"the exact state overflows {info.dtype}"
    if len(exact) == 1:  # no key sums
        return None
    z = exact[1]
    positive = feature_map in POSITIVE_FEATURES
    if np.any(((np.abs(z) > 0) | positive) & (np.abs(z) < info.tiny)):
        return f"exact key sums z underflow {info.dtype}"
    return None


def by_nature(impl: Implementation, x, cuts: list[int], dtype: torch.dtype) -> str | None:
    """unrepresentable for the state after any of `cuts` tokens, as a by-nature reason."""
    spec = impl.spec
    for c in cuts:
        if why := unrepresentable(exact_parts(x.first(c), spec), dtype, spec.feature_map):
            return f"{why} after {c} tokens: a state in true units cannot carry it"
    return None


def state_allowance(impl: Implementation, x, times: float) -> tuple[np.ndarray, np.ndarray]:
    """times x the state bound in the inputs' precision. taylor's bound is the largest over
    its features: the spec fixes their number, not their order."""
    u = unit_roundoff(x.dtype, impl.spec)  # TF32's for float32 under declared TF32 products
    s, z = state_bound(x, impl.spec, u, SMALLEST_SUBNORMAL[x.dtype])
    if impl.spec.feature_map == "taylor":
        s, z = (np.broadcast_to(t.max(axis=2, keepdims=True), t.shape) for t in (s, z))
    return (times * s, times * z)[: 1 + impl.spec.normalize]


@check("state-split")
def state_split(impl: Implementation, case: Case) -> Outcome:
    """The sequence in pieces, the state carried, equals one pass: output and final state."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    tol = Tolerance.of(x, spec)
    whole, final = _call(impl, q, k, v, w, decay, None)
    whole = as_array(whole)
    allowed, dtype, natural = state_allowance(impl, x, 2.0), state_parts(final, spec)[0].dtype, None
    for name, cuts in _cuts(case):
        state, outs = None, []
        for a, b in itertools.pairwise([0, *cuts, case.n]):
            *piece, gates = _pieces(q, k, v, decay, a, b)
            out, state = _call(impl, *piece, w, gates, state)
            outs.append(out)
        found = mismatch(as_array(torch.cat(outs, dim=-2)), whole, tol, tol.allowance())
        if found is not None:
            if nature := by_nature(impl, x, cuts, dtype):  # the states handed over
                natural = natural or f"{name} {cuts}: {nature}"
                continue
            return agreement(f"{name} {cuts} against one pass", found)
        if problem := state_mismatch(state_parts(state, spec), state_parts(final, spec), allowed):
            if nature := by_nature(impl, x, [*cuts, case.n], dtype):
                natural = natural or f"{name} {cuts}: {nature}"
                continue
            return Outcome(
                False, f"{name} {cuts}: the final state differs from one pass's: {problem}"
            )
    if natural is not None:
        return Outcome(False, natural, by_nature=natural)
    return Outcome(True, "every split gives the one-pass output and final state")


def _call(impl: Implementation, q, k, v, w, decay, state):
    """(out, final state) of impl from `state`, with its decay."""
    return impl.call_state(q, k, v, w, state, decay=decay)


def prefix_length(case: Case) -> int:
    """Where initial-state cuts: one past the first chunk of CHUNKS[0] when there is one (a
    prefix not aligned to a chunk), else drawn."""
    if case.n > CHUNKS[0] + 1:
        return CHUNKS[0] + 1
    return int(torch.randint(1, case.n, (1,), generator=case_generator(case, 22)))


def _as_given(exact: tuple[np.ndarray, ...], like, spec):
    """The exact state in the layout, dtype and device of the state `like` fn returned."""
    s = state_parts(like, spec)[0]
    given = tuple(torch.from_numpy(t).to(dtype=s.dtype, device=s.device) for t in exact)
    return given if spec.normalize else given[0]


def _prefix_ignored(x, impl: Implementation, p: int, exact_s: np.ndarray) -> np.ndarray:
    """The rows p.. of a normaliser over this call's keys only: phi(q_i) (S_0 + sum_{p<=j<=i}
    phi(k_j) v_j^T) / (eps + phi(q_i) . sum_{p<=j<=i} phi(k_j)), in float64."""
    spec, out = impl.spec, []
    for b in range(x.q.shape[0]):
        for h in range(x.q.shape[1]):
            n = x.q.shape[2]
            fq, fk = (
                float_features(t[b, h, p:], np.arange(p, n), n, x.projection, spec.feature_map).phi
                for t in (x.q, x.k)
            )
            num = np.cumsum(fk[:, :, None] * x.v[b, h, p:, None, :], 0) + exact_s[b, h]
            den = np.einsum("nf,nf->n", fq, np.cumsum(fk, 0)) + spec.eps
            out.append(np.einsum("nf,nfc->nc", fq, num) / den[:, None])
    return np.stack(out).reshape(*x.q.shape[:2], -1, x.v.shape[3])


@check("initial-state")
def initial_state(impl: Implementation, case: Case) -> Outcome:
    """The rest of the sequence from the prefix's exact state equals the one-pass rows."""
    if case.n < 2:
        return Outcome(True, "N = 1: no prefix to fold")
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    p = prefix_length(case)
    *head, head_decay = _pieces(q, k, v, decay, 0, p)
    exact = exact_parts(validate(*head, spec, w, head_decay), spec)
    _, own = _call(impl, *head, w, head_decay, None)
    given = _as_given(exact, own, spec)
    *rest, rest_decay = _pieces(q, k, v, decay, p, case.n)
    tol, rows = Tolerance.of(x, spec), (..., slice(p, None), slice(None))
    whole = as_array(_call(impl, q, k, v, w, decay, None)[0])

    def with_rest(values: np.ndarray) -> np.ndarray:
        """The one-pass output with rows p.. replaced by `values`."""
        full = whole.copy()
        full[rows] = values
        return full

    got = with_rest(as_array(_call(impl, *rest, w, rest_decay, given)[0]))
    found = mismatch(got, whole, tol, tol.allowance(), rows)
    what = f"rows {p}.. from the exact state of tokens 0..{p - 1} against one pass"
    if found is None:
        return agreement(what, None)
    if nature := by_nature(impl, x, [p], state_parts(own, spec)[0].dtype):
        return Outcome(False, f"{what}: {nature}", by_nature=nature)
    reasons = {
        "the initial state is ignored (the output is that of no prefix)": as_array(
            _call(impl, *rest, w, rest_decay, None)[0]
        ),
    }
    if spec.plain:  # the normaliser of this call's keys (decayed: the decays, too)
        why = "its normaliser ignores the prefix the state stands for: it divides by phi(q_i) "
        reasons[why + ". (the keys of this call) only"] = _prefix_ignored(x, impl, p, exact[0])
    for why, values in reasons.items():
        if mismatch(got, with_rest(values), tol, tol.allowance(), rows) is None:
            return agreement(what, found, f"; {why}")
    return agreement(what, found)


@check("final-state")
def final_state(impl: Implementation, case: Case) -> Outcome:
    """The final state against the exact S (and z, normalised), within the state bound."""
    spec = impl.spec
    (q, k, v, w, decay), x = inputs_of(case, spec)
    _, final = _call(impl, q, k, v, w, decay, None)
    exact, parts = exact_parts(x, spec), state_parts(final, spec)
    if problem := state_mismatch(parts, exact, state_allowance(impl, x, 1.0)):
        if nature := unrepresentable(exact, parts[0].dtype, spec.feature_map):
            return Outcome(
                False, f"{nature}: a state in true units cannot carry it", by_nature=nature
            )
        return Outcome(False, f"the final state against the exact one: {problem}")
    return Outcome(True, "the final state is within its bound of the exact one")
