"""The scalar decays' spec field (Spec.decay "constant" or "gates"): its sources and its rules
(Family.check), which channel gates' (families/channel_gates/fields.py) build on."""

from __future__ import annotations

from ...specs import Spec, SpecError

SOURCES = {
    "constant": "Sun et al. 2023 (RetNet), eq. 5: w_ij = gamma^(i - j), one gamma per head",
    "gates": "Yang et al. 2024 (GLA), eq. 3 with scalar gates, and Dao & Gu 2024 (Mamba2), "
    "sec. 3: w_ij = exp(g_(j+1) + ... + g_i), a log-gate g_t <= 0 per token and head",
}


def check(spec: Spec) -> None:
    """SpecError unless a decayed spec is causal and kernelised with weights of its own."""
    if not spec.causal:
        raise SpecError("a decay needs a causal spec (w_ij is defined for j <= i)")
    if not spec.info.kernelised or spec.feature_map == "cosformer":
        raise SpecError(f"{spec.feature_map} takes no decay (its weights are its own)")
