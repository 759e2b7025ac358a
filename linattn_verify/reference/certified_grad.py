"""Certified gradients at length: dL/dq, dL/dk, dL/dv (and dL/dg of the log-gates) of
L = sum(out * G) in float64 at matmul speed, each element with a rigorous bound on its
error, and the magnitudes M that reference/grad.py's gradient_magnitudes defines (an
upper bound M' on them where M is not a chain sum).

The heads run here; each head's gradients are its family's (the `head` hook): the
kernelised specs' (and the decays' built on them), O(N), in
families/kernelised/certified_gradients.py; softmax's, O(N^2 d) in dense blocks of query
rows, in families/softmax/certified_gradients.py. A family of its own state update (the
delta rule's) has its own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from ..inputs import AttentionInputs
from ..specs import Spec, SpecError
from .certified import SUBNORMAL
from .common import ReferenceAccuracyError, head_decay
from .grad import NAMES, _check_g_out

Arrays = dict[str, np.ndarray]
# head(q, k, v, g_out, decay, w, spec): one head's (grads, bounds, magnitudes), decay the
# head's gamma or log-gates (None without one), w the Performer maps' projection
Head = Callable[..., tuple[Arrays, Arrays, Arrays]]


def covered(spec: Spec) -> bool:
    """Whether certified_gradients takes `spec`: every spec that sums its similarities
    (Spec.sums_similarities; a family of its own state update has its own)."""
    return spec.sums_similarities


def certified_gradients(
    x: AttentionInputs, spec: Spec, g_out: np.ndarray, head: Head
) -> tuple[Arrays, Arrays, Arrays]:
    """(grads, bounds, magnitudes), each {name: array} for grad.gradient_names (q, k, v,
    and g for gates and channel gates, as the heads give them, their shapes as
    exact_gradients'): the gradients
    of L = sum(out * g_out) in float64, a rigorous bound on each one's error, and the
    magnitudes M of grad.gradient_magnitudes (M' where the family's module says), each
    head by `head` (the family's). SpecError for a spec `covered` refuses."""
    if not covered(spec):
        raise SpecError(
            f"certified gradients cover the specs that sum their similarities; {spec}'s "
            f"family has its own (Family.certified_gradients)"
        )
    if np.array([SUBNORMAL]) * 1.0 == 0:  # the bounds assume gradual underflow
        raise ReferenceAccuracyError("flush-to-zero is on (torch.set_flush_denormal(True))")
    ga = _check_g_out(x, g_out)
    heads: list[list[tuple[Arrays, Arrays, Arrays]]] = []
    with threadpool_limits(1, user_api="blas"):
        for b in range(x.shape[0]):
            heads.append([])
            for h in range(x.shape[1]):
                decay = head_decay(x, b, h)
                qkv = (x.q[b, h], x.k[b, h], x.v[b, h])
                heads[b].append(head(*qkv, ga[b, h], decay, x.projection, spec))
    names = NAMES + tuple(sorted(heads[0][0][0].keys() - set(NAMES)))  # the heads' g
    return tuple(
        {name: np.array([[head[part][name] for head in row] for row in heads]) for name in names}
        for part in range(3)
    )
