"""The exact state of a causal kernelised spec after its last token, faithfully rounded to
float64: S = sum_j w_j phi(k_j) v_j^T and z = sum_j w_j phi(k_j) (Katharopoulos et al. 2020,
eq. 18-20; w_j = 1, or with a decay w_(N-1, j): Sun et al. 2023, eq. 6; Yang et al. 2024,
eq. 3), phi the spec's feature map (balls.features: the order of the features is the
spec's); the spec's scale is the queries', not the state's. In ball arithmetic: every
element is accepted once its ball determines its float64 rounding, else the head is
recomputed at twice the precision (arb.rounded)."""

from __future__ import annotations

import numpy as np
from flint import arb, arb_mat

from ..inputs import AttentionInputs
from ..specs import Spec, SpecError
from .arb import DEFAULT_PREC, rounded
from .balls import Head, balls, decay_weights, features, working_precision
from .common import MAX_PREC, ReferenceAccuracyError


def _head_state(head: Head, spec: Spec, prec: int) -> list[list[float | None]]:
    """[S | z] (F, dv + 1) of one head at `prec` bits, None where not yet resolved."""
    n = head.k.shape[0]
    with working_precision(prec):
        rows = features(head.k, range(n), head, spec.feature_map)
        if spec.decay is not None:
            last = decay_weights(head, [n - 1], spec.decay)[0]
            rows = [[t * w for t in row] for row, w in zip(rows, last, strict=True)]
        fk = arb_mat(rows)
        right = arb_mat([[*row, arb(1)] for row in balls(head.v)])
        sums = (fk.transpose() * right).tolist()
    return [[rounded(t) for t in row] for row in sums]


def exact_state(
    x: AttentionInputs, spec: Spec, prec: int = DEFAULT_PREC, max_prec: int = MAX_PREC
) -> tuple[np.ndarray, np.ndarray]:
    """(S (B, H, F, dv), z (B, H, F)) over every key of x, in float64."""
    if no_state := Spec(spec.feature_map, causal=True).no_state:  # the state after every key
        raise SpecError(no_state)
    b_, h_ = x.k.shape[:2]
    heads = []
    for b in range(b_):
        for h in range(h_):
            head, p = Head.of(x, b, h), prec
            while True:
                if p > max_prec:
                    raise ReferenceAccuracyError(
                        f"the state of head ({b}, {h}) is not resolved at {max_prec} bits"
                    )
                values = _head_state(head, spec, p)
                if all(t is not None for row in values for t in row):
                    break
                p *= 2
            heads.append(np.array(values, dtype=np.float64))
    sz = np.stack(heads).reshape(b_, h_, *heads[0].shape)
    return sz[..., :-1], sz[..., -1]
