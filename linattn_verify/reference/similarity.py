"""A family's part of the shared exact engines (mp.py, arb.py, certified_engine.py,
state.py, grad.py): how its weighted similarities A_ij = c w_ij sim(q_i, k_j) are evaluated
in each, and differentiated (Gradients).
The family's reference module builds one (families/<name>/reference.py) and passes it in,
so that the engines never ask which family a spec is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gradients:
    """A family's hooks into the exact gradients (grad.py).

    rows(x, spec, b, h, kern, c): row(i, js) -> (A_ij, M(A_ij), the weights that turn
    b_ij into e_ij and their M, A_ij's terms whose b_ij multiples are dL/dg's p_ij and
    their M) over the keys js of row i of head (b, h), at the working precision, from
    kern (grad_maps.Kernel) and the scale c (grad_terms.weighted_rows without weights);
    per_feature: those weights and terms are lists over the features m, not numbers (a
    weight per key channel), and so is dL/dg_t;
    weight_roundings(nk): the roundings a weight w_ij adds (grad.roundings; 0: none);
    gates(spec): whether the loss is differentiated in log-gates g too (dL/dg);
    logits(qi, keys, abs_keys): (a_ij, M(a_ij), da_ij/ds_ij, its M) for every key j at the working
    precision, for a similarity a = F(s) of the logit s = q_i . k_j / sqrt(d) that is the
    family's own (softmax's); None: the feature map's (grad_maps.Kernel).
    """

    rows: Callable[..., Callable[..., tuple[list, ...]]]
    per_feature: bool = False
    weight_roundings: Callable[[int], int] = lambda nk: 0
    gates: Callable[[Any], bool] = lambda spec: False
    logits: Callable[..., tuple[list, list, list, list]] | None = None


@dataclass(frozen=True)
class Similarity:
    """A family's hooks into the shared engines.

    mp(x, spec, b, h, keys, w): at mpmath's working precision, for head (b, h) with its
    keys and projection as mpf rows, row(i, qi, c) -> (A_ij, a bound on |A_ij| and on what
    its evaluation cancels, mp.py's error estimate) for every key j, c the scale;
    arb(head, spec, rows): w_ij sim(q_i, k_j) for the query rows `rows` and every key (0
    for j > i where w_ij is), arb balls at the working precision, before the scale;
    linear(spec, head): whether arb's linear form phi(Q)(phi(K)^T [V, 1]) suits the head
    (kernelised maps with fewer features than keys and no weights);
    certified(q, k, v, w, decay, spec, outs, at): one head of the certified engine into
    outs (values, bound, scale) at (b, h), decay the head's gamma or log-gates (or None);
    state_keys(head, spec, fk): the key features weighted to the last token,
    w_(N-1, j) phi(k_j), the final state's rows (state.py);
    from_start(head, spec, f): W_im, the weight from before the first token to token i, per
    feature channel m of f; causal_sims(head, spec, fq, fk): (s_ij, w_ij) whose products are
    the causal weighted similarities before the scale (state.py's state gradients);
    final_weights(x, spec, b, h, n, f): (w_(N-1, j, m) per key and feature, 1 + M(ln w)
    per key, W_(N-1, m) per feature) in mpmath at the working precision, and
    final_gates(spec): None without log-gates, else rows(dg, dg_m) -> dL_S/dg and its
    magnitudes as float64 arrays from the per-feature sums (final_state.py).
    The state's hooks are None for a family without a state (softmax).
    gradients: its hooks into the exact gradients (Gradients).
    """

    mp: Callable[..., Callable[..., tuple[list, list]]]
    arb: Callable[..., list[list[Any]]]
    linear: Callable[..., bool]
    certified: Callable[..., None]
    state_keys: Callable[..., list[list[Any]]] | None = None
    from_start: Callable[..., list[list[Any]]] | None = None
    causal_sims: Callable[..., tuple[list, list]] | None = None
    final_weights: Callable[..., tuple[list, list, list]] | None = None
    final_gates: Callable[..., Callable[..., tuple[Any, Any]] | None] | None = None
    gradients: Gradients | None = None
