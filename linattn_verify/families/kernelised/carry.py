"""The state of the causal and linear forms: S = sum_j phi(k_j) v_j^T and z = sum_j phi(k_j)
(Katharopoulos et al. 2020, eq. 18-20), kept in units of exp(shift) for shifted features,
and the operations that update it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ...specs import Spec
from .features import add_shifts, exp, scaled_eps


@dataclass(frozen=True)
class State:
    """What a causal stream carries from one piece to the next.

    s: sum_j phi(k_j) v_j^T (B, H, F, dv) and z: sum_j phi(k_j) (B, H, F), both in units of
    exp(shift) (shift (B, H, 1, 1) for shifted features, else None); position: tokens
    seen so far (cosFormer's positions continue from it).
    """

    s: torch.Tensor
    z: torch.Tensor
    shift: torch.Tensor | None
    position: int

    @classmethod
    def empty(cls, b: int, h: int, f: int, dv: int, like: torch.Tensor, shifted: bool) -> State:
        zeros = like.new_zeros
        shift = like.new_full((b, h, 1, 1), -math.inf) if shifted else None
        return cls(zeros(b, h, f, dv), zeros(b, h, f), shift, 0)


def rescaled(state: State, shift: torch.Tensor | None) -> State:
    """The state in units of exp(shift), shift >= state.shift (shape (B, H, 1, 1))."""
    if shift is None:
        return state
    decay = exp(state.shift - shift)  # 0 for an empty state (shift -inf)
    return replace(state, s=state.s * decay, z=state.z * decay[..., 0], shift=shift)


def absorb(state: State, phi_k: torch.Tensor, v: torch.Tensor) -> State:
    """The state after keys phi_k (in the state's units) with values v."""
    s = state.s + phi_k.transpose(-2, -1) @ v
    return replace(state, s=s, z=state.z + phi_k.sum(dim=-2), position=state.position + v.shape[-2])


def absorb_token(state: State, phi_k: torch.Tensor, v: torch.Tensor) -> State:
    """absorb for one token, as an outer product (no sum over a length-1 axis)."""
    s = state.s + phi_k.transpose(-2, -1) * v
    return replace(state, s=s, z=state.z + phi_k[..., 0, :], position=state.position + 1)


def quotient(num, den, spec: Spec, shift_q, shift_k) -> torch.Tensor:
    return num / (den + scaled_eps(spec.eps, add_shifts(shift_q, shift_k)))


def prefixes(
    first: torch.Tensor, steps: torch.Tensor, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(first + steps[:, 0] + ... + steps[:, t-1] for each t < T, stacked on dim 1; and the
    total), each step added to the running sum in order, as the recurrent form adds tokens
    (never a difference of prefix sums, which would lose a small prefix next to a large
    step). With `out` (no autograd) the sums are formed in it, with no new memory."""
    if out is None:
        sums = [first]
        for t in range(steps.shape[1]):
            sums.append(sums[-1] + steps[:, t])
        return torch.stack(sums[:-1], dim=1), sums[-1]
    out[:, 0] = first
    for t in range(1, steps.shape[1]):
        torch.add(out[:, t - 1], steps[:, t - 1], out=out[:, t])
    return out, out[:, -1] + steps[:, -1]
