"""Channel gates' spec field (Spec.decay "channel-gates"): its source and its rules
(Family.check): the scalar decays' (families/decayed/fields.py) and a feature map whose
feature m is key channel m."""

from __future__ import annotations

from ...specs import Spec, SpecError
from ..decayed import fields as decayed

SOURCE = (
    "Yang et al. 2024 (GLA), sec. 4.1: S_t = diag(alpha_t) S_(t-1) + phi(k_t) v_t^T, alpha_t = "
    "exp(g_t), and its parallel form O = ((Q . B)(K / B)^T . M) V, B_t = alpha_1 ... alpha_t: "
    "sim_ij = sum_m phi(q_i)_m phi(k_j)_m exp(G_im - G_jm), G_i = g_0 + ... + g_i, a log-gate "
    "g_tm <= 0 per token, head and key channel"
)
# The maps whose feature m is channel m of the key (phi(k)_m depends on k_m alone), so that a
# gate per key channel is a gate per feature channel
CHANNEL_GATED_MAPS = ("identity", "elu", "relu")


def check(spec: Spec) -> None:
    """SpecError unless the scalar decays' rules hold and the map gates key channels."""
    decayed.check(spec)
    if spec.feature_map not in CHANNEL_GATED_MAPS:
        raise SpecError(
            f"channel gates need a feature map whose feature m is key channel m "
            f"({', '.join(CHANNEL_GATED_MAPS)}), not {spec.feature_map}"
        )
