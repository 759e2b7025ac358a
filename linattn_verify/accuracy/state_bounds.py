"""Bounds on the errors of a carried state and of its gradients, for any evaluation in
precision u: state_bound (|S_hat - S| and |z_hat - z| after every key) and
state_gradient_bound (dL/dS_0, dL/dz_0 and dL_S/dv), each the spec's family's
(Family.state_bound, Family.state_gradient_bound: kernelised attention's and the decays',
families/kernelised/bound.py and gradient_bound.py; the delta rule's families/delta/bound.py).
"""

from __future__ import annotations

import numpy as np

from ..families import family_of
from ..inputs import AttentionInputs
from ..specs import Spec, SpecError


def state_bound(
    x: AttentionInputs, spec: Spec, u: float, tiny: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on |S_hat - S| (B, H, F, dv) and |z_hat - z| (B, H, F) for any evaluation in
    precision u of the state after every key (reference/state.py), stored in precision u;
    tiny: the dtype's smallest subnormal. The delta rule's z is none (zeros)."""
    if (own := family_of(spec).state_bound) is None:
        raise SpecError(f"{spec} has no state bound")
    return own(x, spec, u, tiny)


def state_gradient_bound(
    x: AttentionInputs,
    spec: Spec,
    g_out: np.ndarray,
    g_state: np.ndarray,
    u: float,
    tiny: float = 0.0,
    normalised: tuple | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Bounds on the errors of dL/dS_0 (B, H, F, dv), dL/dz_0 (B, H, F; None unnormalised)
    and dL_S/dv (B, H, N, dv) of reference/state.py's exact_state_gradients, for any
    evaluation in precision u. normalised: (g_z, (S_0, z_0), the exact StateGradients) of
    a normalised spec, whose exact denominators and outputs the bound takes."""
    if (own := family_of(spec).state_gradient_bound) is None:
        raise SpecError(f"{spec} has no state gradient bound")
    return own(x, spec, g_out, g_state, u, tiny, normalised)
