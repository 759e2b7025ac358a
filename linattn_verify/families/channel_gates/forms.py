"""Channel gates' built-in forms: kernelised attention's scaled forms
(families/kernelised/scaled.py, which this family builds on) with ln w_t per token and key
channel, the log-gates g themselves (Yang et al. 2024, sec. 3.2 and 4.2: each feature channel
of the state decayed by its own gate)."""

from __future__ import annotations

import torch

from ...implementations.forms import DEFAULT_CHUNK
from ...specs import Spec
from ..decayed.values import check_decay, pack_decay
from ..kernelised.forms import WithDecay
from ..kernelised.scaled import Decay, State, scaled_attention
from .quadratic import weights


def log_decays(decay: torch.Tensor, spec: Spec, shape: torch.Size, dtype) -> torch.Tensor:
    """ln w_t per token and key channel: the log-gates g, (B, H, N, d), in `dtype`."""
    return decay.to(dtype)


DECAY = Decay(log_decays, weights, check_decay)
FORMS = WithDecay(DECAY, gate_dims=4, pack=pack_decay)


def gated_attention(
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
    """scaled_attention of a channel-gated `spec` with this family's decay: (out, the state
    after the last token for the causal forms, else None)."""
    return scaled_attention(
        q, k, v, spec, form, projection, chunk_size, decay, initial_state, DECAY
    )
