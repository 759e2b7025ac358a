"""A spec family behind one protocol: what the layers shared by every family ask of it.

A family is the set of specs that share one state update and one accuracy model (DESIGN.md,
"Spec families"). The layers above (accuracy, checks, vet, report, the property suite, the
CLI) ask `family_of(spec)` (registry.py) for a spec's references, forms, golden form and
bound, and never test which family a spec is. Each family is a folder of its own
(`families/<name>/`, docs/architecture.md, "Families"), whose family.py builds its Family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..grammar import Option
from ..inputs import AttentionInputs
from ..reference.certified import Certified
from ..reference.similarity import Similarity
from ..specs import Spec


@dataclass(frozen=True)
class StateGradients:
    """A family's model of the state-gradient check: every gradient of L = sum(out * G) +
    sum(S_N * G_S) from a drawn S_0, dL/dS_0 included, against the exact ones, within the
    a-priori bound gamma_n M and the budget of its golden form's backward.

    exact(x, spec, g_out, g_state, s0): the exact gradients by name (q, k, v, its
    arguments', S0); magnitudes(x, spec, g_out, g_state, s0): their M; roundings(x, spec):
    n; golden_with_state(q, k, v, spec, packed, s0): its golden form's (output, final
    state), differentiable; arguments(spec, packed): its arguments by name from the packed
    one, a tensor or an array.
    """

    exact: Callable[..., dict[str, np.ndarray]]
    magnitudes: Callable[..., dict[str, np.ndarray]]
    roundings: Callable[[AttentionInputs, Spec], int]
    golden_with_state: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    arguments: Callable[[Spec, Any], dict[str, Any]]


@dataclass(frozen=True)
class ArgumentNotes:
    """How the report's sweeps draw a family's arguments, under `key` in its JSON (families
    that draw theirs alike share one key): `title` names them; `accuracy`, `long` and
    `scaling` say how each sweep draws them; `long_note` is the long section's sentence;
    applies(spec): whether they are the arguments of `spec`.
    The report fills in {longest}, {full_longest} (and {longest_power}, {full_longest_power},
    as powers of 2): the N its long section stops a stepwise family at."""

    key: str
    title: str
    accuracy: str
    long: str
    scaling: str
    long_note: str
    applies: Callable[[Spec], bool] = lambda spec: True


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

    name: the family's name; folder: its folder under families/; source: where its formulas
    come from.
    claims(spec): whether `spec` is this family's (the registry asks the families in order);
    exact_decimal(x, spec, digits): the exact output as decimal strings, correctly rounded
    (its known-answer vectors' engine; None: it has none); known_answer_specs: (part, spec)
    of each of its specs with known-answer vectors, in their order; the manifest lists the
    parts in turn, in the order they were published (1 the maps' plain specs, 2 the decays
    fla computes, 3 shipped kernels' eps, 4 the delta rule's), FAMILIES' order within one;
    known_answer_cases(spec): (label, case) of each vector of one of them (None:
    known_answers/cases.py's, the decay check's rates where it forgets);
    vector_fields(spec): what a vector says of its spec beyond map, causality, eps,
    normalisation, scale and decay; formulas(spec): the vector's formulas by key, "formula"
    (by default the map's source) and any of its own ("decay_formula").
    lacks: the checks (by name) its folder does not serve yet, each with why: they are
    not applicable to its specs (a family lands with its references before all its models).
    named: chosen by name instead, Spec.family == folder (--family NAME).
    check(spec): SpecError for a spec of the family that it does not take (its fields.py's
    rules; Spec(...) runs it through the registry's family_of, which refuses another
    family's options first).
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
    long_arguments(spec, k, rates, seed, dtype): (keys, packed argument, float64) of the
    long-context check's typical inputs from its keys (B, H, N, d), the rates (H,) of the
    check's memories (long_context.MEMORIES: a decay's; cases.rated_decay) and `dtype`,
    the one the check rounds them to.
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
    weights(q, k, spec, w, decay): the quadratic form's weights of its golden form, the
    decay's w_ij in them (implementations.golden.Weights; None: it has none).
    per_token(spec): whether its packed argument is given per token (sliced along N with
    q's tokens, axis 2), so that a check that changes or packs tokens changes or packs it
    too; by default whether its decay is (Spec.gated: gates).
    forgets(spec): whether `spec` forgets old tokens (a decay): the decay check and the long
    checks' one head per memory (long_context.MEMORIES) are for it, the stream API of
    split-resume (no decay) is not, and its output estimates no softmax attention.
    widest_gate_sum(spec, x): |G|, the largest sum of |ln w_t| over rounding.DECAY_CHUNK
    consecutive tokens (of a key channel) that a chunked kernel's prefix sums of its decay
    reach (accuracy/verdict.py's decay_floor); 0 without a decay.
    quadratic: its only form is the quadratic one (no finite feature map): quadratic cost,
    one association (no associativity check), shorter long checks, none in the report's
    long section.
    state_gradients: its own model of the state-gradient check (StateGradients; None: the
    model of checks/state_gradient.py, the normaliser's and the final state's terms).
    cancelled_terms(x, spec, g, g_state=None, initial_state=None): per gradient whose last
    step is a difference of terms that agree to rounding, (c, A): its c roundings and the
    terms' size A per element, for the gradient budget's floor (accuracy/gradient.py
    cancellation_floor; the delta rule's qk_l2norm projection); {} by default.
    label: the word that names its specs in vector names and test ids beside their fields'
    words (the delta rule's "delta"; None: the fields' words name them).
    options: its own options in the claim's grammar (grammar.Option: the command line's
    flags, pytest's options, keywords), beside the spec's shared ones (under_test/claim.py);
    each a specs.Spec field, which another family's spec must leave at its default
    (registry.family_of), the first the one that makes a spec the family's.
    notes: how the report's sweeps draw its arguments (ArgumentNotes, one per key, each for
    the specs it `applies` to: a gated delta rule's gates are drawn as a decay's).
    similarity: its hooks into reference/'s shared engines (reference.Similarity: mp, arb,
    certified, state), for the callers of those engines (the arb fallback's settle_rows,
    arb_denominator_signs, the state gradients); None: a family with engines of its own.
    """

    name: str
    folder: str
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
    known_answer_specs: tuple[tuple[int, Spec], ...] = ()
    known_answer_cases: Callable[[Spec], list[tuple[str, Any]]] | None = None
    vector_fields: Callable[[Spec], dict[str, Any]] = lambda spec: {}
    formulas: Callable[[Spec], dict[str, str]] = lambda spec: {"formula": spec.info.source}
    lacks: Mapping[str, str] = field(default_factory=dict)
    named: bool = False
    weights: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None = None
    per_token: Callable[[Spec], bool] = lambda spec: spec.gated
    forgets: Callable[[Spec], bool] = lambda spec: False
    widest_gate_sum: Callable[[Spec, AttentionInputs], float] = lambda spec, x: 0.0
    quadratic: bool = False
    state_gradients: StateGradients | None = None
    cancelled_terms: Callable[..., dict[str, tuple[int, np.ndarray]]] = lambda *a, **kw: {}
    notes: tuple[ArgumentNotes, ...] = ()
    options: tuple[Option, ...] = ()
    label: str | None = None
    similarity: Similarity | None = None
