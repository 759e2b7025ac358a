"""The scalar decays' built-in forms: kernelised attention's scaled forms
(families/kernelised/scaled.py, which this family builds on) with the decay's ln w_t per
token (Sun et al. 2023, eq. 6: the recurrent retention; Yang et al. 2024, sec. 3.2, eq. 4-5:
the chunk form)."""

from __future__ import annotations

import torch

from ...implementations.forms import DEFAULT_CHUNK
from ...specs import Spec
from ..kernelised.forms import WithDecay
from ..kernelised.scaled import Decay, State, scaled_attention
from .quadratic import weights
from .values import check_decay, pack_decay


def log_decays(decay: torch.Tensor, spec: Spec, shape: torch.Size, dtype) -> torch.Tensor:
    """ln w_t per token, (B, H, N, 1) of `shape`'s (B, H, N, d): ln gamma for a constant
    decay, g for gates, in `dtype`."""
    if spec.decay == "constant":
        return torch.log(decay.to(dtype))[None, :, None, None].expand(*shape[:3], 1)
    return decay.to(dtype)[..., None]


DECAY = Decay(log_decays, weights, check_decay)
FORMS = WithDecay(DECAY, gate_dims=3, pack=pack_decay)


def decayed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spec: Spec,
    form: str,
    projection: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    decay: torch.Tensor | None = None,
    initial_state: State | None = None,
) -> tuple[torch.Tensor, State | None]:
    """scaled_attention of `spec` (a spec with a scalar decay, or none) with this family's
    decay: (out, the state after the last token for the causal forms, else None)."""
    return scaled_attention(
        q, k, v, spec, form, projection, chunk_size, decay, initial_state, DECAY
    )
