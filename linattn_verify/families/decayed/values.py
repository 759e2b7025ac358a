"""A decay's values: the keyword a kernel takes them by (DECAY_ARGUMENTS), how a family's
arguments give them (decay_values, pack_decay), their checks (check_decay, validate) and how
far a chunked kernel's prefix sums of them reach (widest_gate_sum); shared by the scalar
decays, channel gates and the delta rule's gates."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...inputs import AttentionInputs, as_float64, no_decay, validate
from ...rounding import DECAY_CHUNK
from ...specs import Spec, SpecError

# the keyword a kernel takes a decay by (specs.DECAYS)
DECAY_ARGUMENTS = {"constant": "gamma", "gates": "g", "channel-gates": "g"}


def decay_values(spec: Spec, gamma: Any, g: Any) -> Any:
    """The decay's values, gamma or g as the spec's decay takes (DECAY_ARGUMENTS);
    SpecError for the other, or for either where the spec has no decay."""
    wanted = DECAY_ARGUMENTS.get(spec.decay)
    for name, value in (("gamma", gamma), ("g", g)):
        if value is not None and name != wanted:
            raise SpecError(f"{name} is given, but {spec} takes {wanted or 'no decay'}")
    return gamma if wanted == "gamma" else g


def pack_decay(spec: Spec, arguments: dict[str, Any]) -> Any:
    """Family.pack of a decay: its values among a family's arguments (decay_values)."""
    return decay_values(spec, arguments.get("gamma"), arguments.get("g"))


def check_decay(decay: Any, spec: Spec, q_shape: tuple[int, ...]) -> np.ndarray | None:
    """The decay of a decayed spec as an exact float64 array: gamma (H,) in (0, 1] for
    "constant", log-gates g <= 0, (B, H, N) for "gates" and (B, H, N, d) for
    "channel-gates" (their fields.py), None for a spec without one (inputs.ArgumentCheck);
    SpecError for a decay given to a spec without one, or one missing, misshapen or out of
    range."""
    if spec.decay is None:
        no_decay(decay, spec, q_shape)
        return None
    what = DECAY_ARGUMENTS[spec.decay]
    if decay is None:
        raise SpecError(f"{spec} needs its decay: {what}")
    arr, _ = as_float64(decay, what)
    b, h, n, d = q_shape
    want = {"constant": (h,), "gates": (b, h, n), "channel-gates": (b, h, n, d)}[spec.decay]
    if arr.shape != want:
        raise SpecError(f"{what} must have shape {want}, got {arr.shape}")
    if spec.decay == "constant" and not np.all((arr > 0) & (arr <= 1)):
        raise SpecError(f"gamma must be in (0, 1], got {arr[~((arr > 0) & (arr <= 1))][0]!r}")
    if spec.decay != "constant" and not np.all(arr <= 0):
        bad = np.argwhere(arr > 0)[0]
        raise SpecError(f"g must be <= 0 (log-gates), got {arr[tuple(bad)]} at {tuple(bad)}")
    return arr


def validate_decayed(
    q: Any, k: Any, v: Any, spec: Spec, projection: Any = None, decay: Any = None
) -> AttentionInputs:
    """Family.validate of a decay: inputs.validate with the decay checked (check_decay)."""
    return validate(q, k, v, spec, projection, decay, check_decay)


def widest_gate_sum(spec: Spec, x: AttentionInputs) -> float:
    """|G|: the largest sum of |ln w_t| over DECAY_CHUNK consecutive tokens (of a key
    channel, for channel gates), what a chunked kernel's prefix sums reach; 0 without a
    decay (Family.widest_gate_sum)."""
    if spec.decay is None:
        return 0.0
    logs = np.abs(np.log(x.decay)) if spec.decay == "constant" else np.abs(x.decay)
    if spec.decay == "constant":
        return float(logs.max()) * min(DECAY_CHUNK, x.k.shape[2])
    sums = np.cumsum(logs, axis=2)  # the token axis: (B, H, N) or (B, H, N, d)
    pad = [(0, 0)] * sums.ndim
    pad[2] = (DECAY_CHUNK, 0)
    ahead = np.pad(sums, pad)[:, :, :-DECAY_CHUNK]
    return float((sums - ahead).max())
