"""The scalar decays' part of the exact gradients (reference/grad.py, through
reference/similarity.Gradients): kernelised attention's rows times the weights w_ij =
gamma^(i - j) ("constant": Sun et al. 2023, RetNet, eq. 5; gamma held fixed) or exp(G_i -
G_j), G the prefix sums of the log-gates ("gates": Yang et al. 2024, GLA, eq. 3 with scalar
gates; families/decayed/fields.py), with M(w_ij) = w_ij (1 + M(ln w_ij)) (mp.decay_weights), and
dL/dg for gates. Derivation and the rules for M: reference/grad.py's module docstring. None
imports an implementation.
"""

from __future__ import annotations

from ...inputs import AttentionInputs
from ...reference.common import head_decay
from ...reference.grad_maps import Kernel
from ...reference.grad_terms import weighted_rows
from ...reference.mp import decay_weights
from ...reference.similarity import Gradients
from ...specs import Spec


def rows(x: AttentionInputs, spec: Spec, b: int, h: int, kern: Kernel, c):
    """Gradients.rows: weighted_rows with head (b, h)'s decay weights (mp.decay_weights)."""
    decay = head_decay(x, b, h)
    return weighted_rows(kern, c, lambda i: decay_weights(decay, i, spec.decay))


GRADIENTS = Gradients(
    rows=rows,
    weight_roundings=lambda nk: 3 * nk + 8,
    gates=lambda spec: spec.decay == "gates",
)
