"""A spec family behind one protocol: what the layers shared by every family ask of it.

A family is the set of specs that share one state update and one accuracy model (DESIGN.md,
"Spec families"). The layers above (accuracy, checks, vet, report, the property suite, the
CLI) ask `family_of(spec)` (registry.py) for a spec's references, forms, golden form and
bound, and never test which family a spec is. A family with a folder of its own
(`families/<name>/`) holds all of those there; the others still point into the horizontal
packages (reference/, implementations/, accuracy/), each hook named in docs/architecture.md,
until their folders land.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..inputs import AttentionInputs
from ..reference.certified import Certified
from ..specs import Spec


@dataclass(frozen=True)
class SumsBound:
    """A family's terms of the shared a-priori bound (accuracy/bound.py, for a family without
    a scale_and_bound of its own), the engine keeping the scale, the quotient and the bound.

    balls(head, spec, u, x): one head's sums in arb balls, unscaled, (N and D, A, F, m): N
    and D the sums of its weights times v (no columns) and 1, A of their magnitudes and F of
    their errors' bounds, both with x = [|v|, 1] as columns, m the products per weight.
    fast(head, spec, u): (A, F, (D^, a bound on |D^ - D|) or None unnormalised, m) in float64
    with their own rounding bounded, for long sequences (None: the balls only).
    condition(x, spec): the denominator's condition number kappa (B, H, Nq, 1), None where
    its terms cannot cancel. features(spec, d, rows): m, the features per weight (the
    budget's sum length, Family.sum_length).
    """

    balls: Callable[..., tuple[list, list, list, int]] | None = None
    fast: Callable[..., tuple] | None = None
    condition: Callable[[AttentionInputs, Spec], np.ndarray | None] = lambda x, spec: None
    features: Callable[[Spec, int, int | None], int] = lambda spec, d, rows: 1


@dataclass(frozen=True)
class Family:
    """One spec family's answers to the shared layers.

    name: the family's name; folder: its folder under families/ (None: its modules still sit
    in the horizontal packages); source: where its formulas come from.
    claims(spec): whether `spec` is this family's (the registry asks the families in order);
    exact_decimal(x, spec, digits): the exact output as decimal strings, correctly rounded
    (its known-answer vectors' engine; None: it has none); known_answer_cases(): (spec,
    label, case) of each of its known-answer vectors beyond known_answers/'s own catalogue;
    vector_fields(spec): what a vector says of its spec beyond map, causality, eps,
    normalisation, scale and decay; formula(spec): the vector's formula (None: the map's).
    lacks: the checks (by name) its folder does not serve yet, each with why: they are
    not applicable to its specs (a family lands with its references before all its models).
    named: chosen by name instead, Spec.family == folder (--family NAME), and check(spec):
    SpecError for a spec of its name that it does not take.
    arguments: the keywords its kernels take beyond q, k, v and W (gamma, g, beta).
    pack(spec, arguments): those arguments as one per-call tensor (the checks' `decay`);
    argument_names(spec): the keywords a kernel of `spec` takes it by; keywords(spec,
    packed, layout): those keywords' tensors from the packed one, in the kernel's layout.
    validate(q, k, v, spec, projection, packed): exact float64 inputs (inputs.validate's).
    case_arguments(case, spec): (q, k, v, W, packed) of a case (cases.Case);
    default_arguments(spec, q): the packed argument of inputs from no case (scaling runs).
    forms(spec): the built-in forms that evaluate `spec`, the fast one last.
    attention(q, k, v, spec, form, projection, chunk_size, arguments): a built-in form's
    output; attention_with_state(..., initial_state, arguments): (output, final state);
    attention_varlen(q, k, v, spec, cu_seqlens, form, projection, chunk_size, arguments):
    a packed batch's output.
    exact(x, spec, engine): the exact output, engine "auto", "mp", "arb" or "certified".
    certified(x, spec, settle): the certified engine's output with its per-element bound
    (settle: the rows arb settles, None for every row, where the engine takes it).
    exact_state(x, spec): the exact state after the last key, (S, z or None).
    golden_forms(spec): the golden forms whose errors set the budget; long_form(spec): the
    long-context check's O(N) golden form; golden(q, k, v, spec, projection, form, decay).
    sum_length(nk, d, m): the roundings of a correct evaluation's longest sum (the budget's
    typical error, Higham & Mary 2019).
    exact_gradients(x, spec, g): (the exact gradients of L = sum(out * g), their magnitudes
    M, the rounding count n) of the gradient model, or why L is undefined (a str);
    certified_gradients(x, spec, g): (gradients, their rigorous error bounds, M, n) at length.
    long_arguments(spec, k, decay, seed): (keys, packed argument) of the long-context
    check's typical inputs, from its keys and its decay (long_context.long_decay).
    sums_memory: its unnormalised output sums the whole memory (kernelised sums grow with N),
    so the long-context check scales its values down.
    kinds: the input kinds of its own (cases.Case.kind) the strategies draw beside KINDS.
    stepwise: its reference, bound and golden form go token by token (recurrences from the
    first token), so its long checks stop at their shorter default lengths and its bound at
    n tokens is the first n rows of the bound at the longest N.
    scale_and_bound(x, spec, ref, u, tiny), state_bound(x, spec, u, tiny): its own a-priori
    model (scale_and_bound None: accuracy/bound.py's shared engine, given its sums_bound;
    state_bound None: it has no state model); state_gradient_bound(x, spec, g_out, g_state,
    u, tiny, normalised): the bound on its state gradients' errors (None: it has none).
    sums_bound: its terms of accuracy/bound.py's shared engine (SumsBound).
    per_token(spec): whether its packed argument is given per token (sliced along N with
    q's tokens, axis 2), so that a check that changes or packs tokens changes or packs it
    too; by default the spec's own answer (Spec.per_token: gates, the delta rule's beta).
    """

    name: str
    folder: str | None
    source: str
    claims: Callable[[Spec], bool]
    check: Callable[[Spec], None]
    arguments: tuple[str, ...]
    pack: Callable[[Spec, dict[str, Any]], Any]
    argument_names: Callable[[Spec], tuple[str, ...]]
    keywords: Callable[[Spec, Any, str], dict[str, Any]]
    validate: Callable[..., AttentionInputs]
    case_arguments: Callable[..., tuple[torch.Tensor | None, ...]]
    default_arguments: Callable[[Spec, torch.Tensor], torch.Tensor | None]
    forms: Callable[[Spec], tuple[str, ...]]
    attention: Callable[..., torch.Tensor]
    attention_with_state: Callable[..., tuple[torch.Tensor, Any]]
    attention_varlen: Callable[..., torch.Tensor]
    exact: Callable[[AttentionInputs, Spec, str], np.ndarray]
    certified: Callable[..., Certified]
    exact_state: Callable[[AttentionInputs, Spec], tuple[np.ndarray, np.ndarray | None]]
    golden_forms: Callable[[Spec], tuple[str, ...]]
    long_form: Callable[[Spec], str]
    golden: Callable[..., torch.Tensor]
    sum_length: Callable[[int, int, int], int]
    exact_gradients: Callable[..., tuple[dict, dict, int] | str]
    certified_gradients: Callable[..., tuple[dict, dict, dict, int]]
    long_arguments: Callable[..., tuple[torch.Tensor, torch.Tensor | None]]
    sums_memory: bool
    kinds: tuple[str, ...]
    stepwise: bool
    scale_and_bound: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    state_bound: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None
    state_gradient_bound: Callable[..., tuple] | None = None
    sums_bound: SumsBound = field(default_factory=SumsBound)
    exact_decimal: Callable[[AttentionInputs, Spec, int], np.ndarray] | None = None
    known_answer_cases: Callable[[], list[tuple[Spec, str, Any]]] = list
    vector_fields: Callable[[Spec], dict[str, Any]] = lambda spec: {}
    formula: Callable[[Spec], str] | None = None
    lacks: Mapping[str, str] = field(default_factory=dict)
    named: bool = False
    per_token: Callable[[Spec], bool] = field(default=lambda spec: spec.per_token)
