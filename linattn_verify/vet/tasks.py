"""The units of work of a vet run, each a function (implementation, parameters) -> rows, run
inside the worker process (worker.py) or in-process (testing.py) as the requests of
requests.py ask for them. A row is CheckResult.to_dict()'s dict: name, status, detail,
figures, and the case and reproduce command of a failure."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from .. import triton_interpret
from ..cases import Case
from ..checks import ALL_CHECKS, CHECKS
from ..checks import gradient_length as gradient_length_check
from ..checks import long_context as long_context_check
from ..checks.core import beyond_plan
from ..checks.gradients import autograd_gradients, loss_weights
from ..checks.search import search_regimes
from ..families import case_arguments, default_arguments
from ..head_dims import SIXTEEN_BIT, UNDECLARED, HeadDims
from ..implementations.projection import sample_projection_torch
from ..known_answers import run_vectors
from ..regimes import REGIMES
from ..results import CheckResult
from ..scaling import scaling_result
from ..specs import Spec
from ..stats import builtin_sampler, check_sampler, rate_check, regime_inputs
from ..stats.attention import RATE_MS, RATE_REPLICATES
from ..stats.panel import DEFAULT_D, DEFAULT_M, DEFAULT_REPLICATES
from ..strategies import corner_cases
from ..target import load_target
from ..under_test import Implementation, ImplementationFailure
from .commands import known_answers_command, scaling_command, vet_command

Row = dict[str, Any]


VET_SHAPES = ((2, 2, 1, 4, 3), (2, 3, 65, 5, 4), (1, 2, 33, 16, 16))  # (B, H, N, d, dv)


def vet_cases(spec: Spec, dtypes: tuple[str, ...], device: str) -> list[Case]:
    """Shapes every check meets besides the regime's corners (B = H = 2, N = 9, d = 3 != dv
    = 2, every dtype): N = 1; N = 65 (ragged for chunks of 16 and 64) with B = 2, H = 3, d = 5
    != dv = 4; d = dv = m = 16. The dtypes take turns."""
    projection = spec.info.needs_projection
    return [
        Case(
            b,
            h,
            n,
            d,
            dv,
            dtypes[i % len(dtypes)],
            "normal",
            1.0,
            7,
            d if projection else None,
            device,
        )
        for i, (b, h, n, d, dv) in enumerate(VET_SHAPES)
    ]


# (B, H, N, d, dv): ragged for chunks of 16 to 64 and past a chunk of 32, two heads, d != dv;
# d = 4: a row of q with every relu feature 0 is common (1 in 16)
SMALLEST_SHAPE = (1, 2, 33, 4, 3)


def smallest_cases(spec: Spec, dtypes: tuple[str, ...], device: str) -> list[Case]:
    """The smallest plan's cases (VetOptions.smallest): one typical case per dtype, of
    SMALLEST_SHAPE, for kernels whose every call takes seconds (Triton's interpreter)."""
    b, h, n, d, dv = SMALLEST_SHAPE
    m = d if spec.info.needs_projection else None
    return [Case(b, h, n, d, dv, t, "normal", 1.0, 7, m, device) for t in dtypes]


def tf32_dots(impl: Implementation, device: str) -> list[Row]:
    """The tl.dots Triton's interpreter ran on float32 inputs with TF32 products in one call
    on the smallest float32 case (figure "tf32_dots"): what a declared --dot-precision tf32
    applies to (runner.py); -1 when the call raised (nothing learnt: the declaration kept)."""
    (case,) = smallest_cases(impl.spec, ("float32",), device)
    result = CHECKS["contract"](impl, case)
    dots = -1 if result.cause == "contract" else int(result.figures.get("tf32_dots", 0))
    return [{"name": TF32_PROBE, "status": "probe", "detail": "", "figures": {"tf32_dots": dots}}]


TF32_PROBE = "tf32-dots"
OUTSIDE = "outside the claim"  # the status of a call outside what the kernel claims


def outside_claim(
    impl: Implementation, device: str, dtypes: tuple[str, ...], judged: tuple[str, ...],
    grad: bool,
) -> list[Row]:  # fmt: skip
    """What the kernel does just outside its claim, one call each on the smallest case, a row
    of status OUTSIDE, no finding: on each of `dtypes`, those it does not claim (the
    contract check); at d = its largest + 1, in float32 or the first dtype `judged` (the
    contract check); with `grad`, a backward pass with an odd dv in the first 16-bit dtype
    judged, where it claims even ones there (HeadDims)."""
    rows = []
    for case in smallest_cases(impl.spec, dtypes, device):
        rows.append(_outside(case.dtype, _contract_call(impl, case)))
    dims, bare = impl.head_dims, replace(impl, head_dims=UNDECLARED)
    dtype = "float32" if "float32" in judged else judged[0]
    (case,) = smallest_cases(impl.spec, (dtype,), device)
    if dims.largest is not None:
        beyond = replace(case, d=dims.largest + 1)
        rows.append(_outside(f"d = {beyond.d}", _contract_call(bare, beyond)))
    sixteen = [t for t in judged if t in SIXTEEN_BIT]
    if grad and dims.even_backward and sixteen:
        (case,) = smallest_cases(impl.spec, sixteen[:1], device)
        odd = replace(case, d=dims.d(case.d, case.dtype, backward=True), dv=case.dv | 1)
        rows.append(_outside(f"{odd.dtype} backward, dv = {odd.dv}", _backward_call(bare, odd)))
    return rows


MET = "meets the contract (its values not judged)"
RUNS = "its backward runs (its gradients not judged)"


def _outside(name: str, what: str) -> Row:
    return {"name": f"outside {name}", "status": OUTSIDE, "detail": what}


def _contract_call(impl: Implementation, case: Case) -> str:
    """What the contract check says of one call: that it meets the contract, or how not."""
    result = CHECKS["contract"](impl, case)
    did = result.message.removeprefix(f"{impl.name} ")
    return MET if result.passed else did


def _backward_call(impl: Implementation, case: Case) -> str:
    """What one backward pass on `case` does: it runs, or how it fails."""
    q, k, v, w, decay = case_arguments(case, impl.spec)
    try:
        autograd_gradients(impl, q, k, v, w, loss_weights(case, q, v), decay, impl.spec)
    except ImplementationFailure as err:
        return str(err)
    return RUNS


HEAD_DIMS_PROBE = "head-dims-probe"


def probe_head_dims(
    impl: Implementation, device: str, dtype: str, raised: int | None, odd: str | None
) -> list[Row]:
    """Evidence of an undeclared limit on the head dimensions (runner.py): with `raised`, a
    d at which a call raised, the largest d a forward call on the smallest case in `dtype`
    takes, bisected from that case's own d (figure "largest": -1 where a call at that d
    raises or one at `raised` does not); with `odd`, a 16-bit case (JSON) with an odd d or
    dv whose backward raised, whether its backward runs with d and dv made even and in
    float32 alike (figure "even_backward": 1) and raises again as it was."""
    figures: dict[str, int] = {}
    if raised is not None:
        (case,) = smallest_cases(impl.spec, (dtype,), device)

        def takes(d: int) -> bool:
            return _contract_call(impl, replace(case, d=d)) == MET

        took, found = case.d, takes(case.d) and not takes(raised)
        while found and raised - took > 1:
            middle = (took + raised) // 2
            took, raised = (middle, raised) if takes(middle) else (took, middle)
        figures["largest"] = took if found else -1
    if odd is not None:
        case = Case.from_json(odd)
        even = HeadDims(even_backward=True).fit(case, backward=True)
        cases = (case, even, replace(case, dtype="float32"))
        runs = [_backward_call(impl, c) == RUNS for c in cases]
        figures["even_backward"] = int(runs == [False, True, True])
    return [{"name": HEAD_DIMS_PROBE, "status": "probe", "detail": "", "figures": figures}]


class ContractCovered:
    """Past a failed contract check (its finding in `regime`): the failures it already
    stands for, counted: any failure on a case of that regime or a harsher one on which the
    contract check fails too by what leaves the output unjudged (a raise, or an output of
    the wrong type, shape, dtype or device: float32 returned for float64 inputs fails
    associativity by float32's rounding); an input modified in place leaves the output
    judged, and a failure of its values is a finding of its own."""

    def __init__(self, impl: Implementation, regime: str) -> None:
        self.impl, self.regime, self.count = impl, regime, 0
        self.seen: dict[Case, bool] = {}  # the contract's answer on each case asked

    def __call__(self, result: CheckResult) -> bool:
        if result.case is None or REGIMES.index(result.regime) < REGIMES.index(self.regime):
            return False
        if result.case not in self.seen:
            with beyond_plan():  # not one of the task's planned cases (Task.planned_cases)
                met = CHECKS["contract"](self.impl, result.case)
            unjudged = met.cause == "contract" or bool(met.figures.get("output_unjudged"))
            self.seen[result.case] = not met.passed and unjudged
        covered = self.seen[result.case]
        self.count += covered
        return covered


def property_check(
    impl: Implementation,
    name: str,
    device: str,
    examples: dict[str, int],
    dtypes: tuple[str, ...],
    past_contract: str | None = None,
    smallest: bool = False,
) -> list[Row]:
    """Check `name` in each regime in turn, the mildest first (`examples` cases searched per
    regime, after its corner cases and vet_cases): the first failure, shrunk, in the
    mildest regime that has one. past_contract (the regime of the contract check's failure):
    the failures it stands for are passed over (ContractCovered), so that a failure is the
    check's own; with none and some passed over, the row depends on the contract. smallest:
    smallest_cases alone, no search."""
    covered = None if past_contract is None else ContractCovered(impl, past_contract)
    if smallest:
        return _on_smallest_cases(impl, name, device, dtypes, covered)
    extra = vet_cases(impl.spec, dtypes, device)
    found, searched = search_regimes(
        name, impl, examples, device, shrink=True, dtypes=dtypes, extra_cases=extra,
        pass_over=covered,
    )  # fmt: skip
    if found is not None:
        return [found.to_dict()]
    if covered is not None and covered.count:
        return [depending(name, covered.count)]
    counts = ", ".join(f"{n} {regime}" for regime, n in searched.items())
    detail = (
        f"no failure in the corner cases, vet's cases and {counts} searched ({', '.join(dtypes)})"
    )
    return [CheckResult(name, True, detail).to_dict()]


def _on_smallest_cases(impl, name: str, device: str, dtypes, covered) -> list[Row]:
    """property_check's row on smallest_cases: the first failure of the check's own."""
    for case in smallest_cases(impl.spec, dtypes, device):
        result = ALL_CHECKS[name](impl, case)
        if not result.passed and not result.by_nature and not (covered and covered(result)):
            return [result.to_dict()]
    if covered is not None and covered.count:
        return [depending(name, covered.count)]
    detail = f"no failure on one typical case per dtype ({', '.join(dtypes)}; the smallest plan)"
    return [CheckResult(name, True, detail).to_dict()]


DEPENDS = "depends"  # the status of a check whose only failures the failed contract covers


def depending(name: str, covered: int, cases: int | None = None) -> Row:
    """The row of a check with no failure of its own, and `covered` failures that the
    failed contract check stands for (ContractCovered), of `cases` where it counts them
    (figures "covered", "cases")."""
    detail = f"no failure of its own; {covered} case(s) broke the contract as reported above"
    figures = {"covered": covered} | ({} if cases is None else {"cases": cases})
    return {"name": name, "status": DEPENDS, "detail": detail, "figures": figures}


def accuracy_panel(spec: Spec, dtype: str, device: str, smallest: bool = False) -> list[Case]:
    """The cases of the accuracy task in one dtype: vet_cases and the corner cases (the
    smallest plan: smallest_cases)."""
    if smallest:
        return smallest_cases(spec, (dtype,), device)
    return [*vet_cases(spec, (dtype,), device), *corner_cases(spec, (dtype,), device)]


def accuracy(
    impl: Implementation,
    device: str,
    dtypes: tuple[str, ...],
    past_contract: str | None = None,
    smallest: bool = False,
) -> list[Row]:
    """Per dtype, the reference check on vet_cases and the corner cases of that dtype: the
    first failure in the mildest regime that has one, else the largest error on typical
    inputs (units of u s, with the bound and budget at the worst element). past_contract:
    the cases that break the contract are left out (property_check)."""
    rows = []
    for dtype in dtypes:
        panel = accuracy_panel(impl.spec, dtype, device, smallest)
        results = [CHECKS["reference"](impl, case) for case in panel]
        covered = None if past_contract is None else ContractCovered(impl, past_contract)
        kept = [r for r in results if r.passed or covered is None or not covered(r)]
        if not kept or (len(kept) < len(results) and all(r.passed for r in kept)):
            rows.append(depending(f"accuracy {dtype}", len(results) - len(kept), len(results)))
            continue
        results = kept
        failed = [r for r in results if not r.passed and not r.by_nature]
        failed.sort(key=lambda r: REGIMES.index(r.regime))
        typical = [r for r in results if r.regime == "typical"] or results
        errors = [r.figures.get("max_error", math.nan) for r in typical]
        worst = (
            typical[int(np.nanargmax(errors))] if not all(map(math.isnan, errors)) else typical[0]
        )
        shown = failed[0] if failed else worst
        row = shown.to_dict()
        row["name"] = f"accuracy {dtype}"
        what = f"first failure ({shown.regime})" if failed else "largest typical error"
        row["detail"] = f"{len(failed)} of {len(results)} cases fail; {what}: {shown.message}"
        rows.append(row)
    return rows


AUTOTUNE_CONFIGS = "autotune-configs"
MAX_VARIANTS = 8  # autotune config variants judged (of a Triton kernel in the interpreter)


def autotune_configs(
    impl: Implementation, device: str, dtypes: tuple[str, ...], smallest: bool = False
) -> list[Row]:
    """A Triton kernel in the interpreter, in each autotune config variant besides the one the
    other checks ran (triton_interpret.variants: variant i runs config i of every autotuned
    kernel, configs that differ only in num_warps or num_stages being one), at most
    MAX_VARIANTS of them: the reference check on vet_cases (the smallest plan:
    smallest_cases), a failure counted where variant
    0 passes the same case (its own failures are the other checks')."""
    cases = (smallest_cases if smallest else vet_cases)(impl.spec, dtypes, device)
    triton_interpret.forget_configs()  # the calls below find this kernel's configs afresh
    first = [CHECKS["reference"](impl, case).passed for case in cases]
    count = triton_interpret.variants()
    judged = min(count, MAX_VARIANTS)
    for variant in range(1, judged):
        with triton_interpret.use_config(variant):
            for case, passed in zip(cases, first, strict=True):
                result = CHECKS["reference"](impl, case)
                if passed and not result.passed:
                    row = {**result.to_dict(), "name": AUTOTUNE_CONFIGS}
                    row.pop("reproduce", None)  # its command would run config 0
                    row["detail"] = (
                        f"in autotune config {variant} ({triton_interpret.describe(variant)}), "
                        f"not in config 0 ({triton_interpret.describe(0)}): {result.message}"
                    )
                    return [row]
    if not triton_interpret.STATE.configs:
        return [CheckResult(AUTOTUNE_CONFIGS, True, "no autotuned kernel ran").to_dict()]
    sample = f"{judged} of {count}" if judged < count else f"all {count}"
    detail = (
        f"{sample} autotune config variants agree with the reference on the cases "
        f"({triton_interpret.describe(0)}, ...)"
    )
    return [CheckResult(AUTOTUNE_CONFIGS, True, detail).to_dict()]


INT32_OFFSETS = "int32-offsets"
# (B, H) of its two calls, N = 33, d = 4, dv = 3: B doubles and H quadruples, so an offset
# that grows in proportion to either is at least OFFSET_GROWTH times larger in the second
OFFSET_PROBES = ((1, 1), (2, 4))
OFFSET_GROWTH = min(b1 / b0 for b0, b1 in zip(*OFFSET_PROBES))
OFFSETS_N, OFFSETS_D = 33, 4


def int32_offsets(impl: Implementation, device: str) -> list[Row]:
    """A Triton kernel in the interpreter, two float32 calls differing in B and H
    (OFFSET_PROBES), its pointer offsets watched (triton_interpret.watching_offsets): an
    int32 offset into a tensor with a token axis (at least B H N elements) that grows with
    the batch or the heads (OFFSET_GROWTH times as large in the second call) and reaches past
    one (batch, head) slice of it (a B H-th of its elements) spans the tensor: it wraps at
    2^31 once the tensor holds about 2^31 times its share of elements, where a GPU then
    reads and writes other memory, silently (fla #1080: B T H K > 2^31; #965, #769).
    Offsets within a slice (token indices, block offsets), per-token pointer steps of H dv
    and indices into per-head parameters (gamma (H,)) are not flagged; an offset widened to
    int64 after an int32 product has wrapped is not seen (the product is not watched)."""
    largest = []
    m = OFFSETS_D if impl.spec.info.needs_projection else None
    for b, h in OFFSET_PROBES:
        case = Case(b, h, OFFSETS_N, OFFSETS_D, 3, "float32", "normal", 1.0, 7, m, device)
        case = impl.head_dims.fit(case)
        q, k, v, w, decay = case_arguments(case, impl.spec)
        with triton_interpret.watching_offsets() as seen:
            try:
                impl(q, k, v, w, decay)
            except ImplementationFailure as err:  # the contract check reports it
                return [CheckResult(INT32_OFFSETS, True, f"not judged: the call {err}").to_dict()]
        largest.append(seen.largest)
    small, large = largest
    slices = OFFSET_PROBES[1][0] * OFFSET_PROBES[1][1]
    grows = [  # tensors with a token axis (not gamma (H,)), offsets past one slice of them
        (offset / count, name, small.get(name, (0, 0))[0], offset, count)
        for name, (offset, count) in large.items()
        if count >= slices * OFFSETS_N
        and offset >= OFFSET_GROWTH * max(small.get(name, (0, 0))[0], 1)
        and offset >= count // slices
    ]
    if not grows:
        detail = "no int32 pointer offset grows with the batch or the heads"
        return [CheckResult(INT32_OFFSETS, True, detail).to_dict()]
    share, name, before, offset, count = max(grows)
    (b0, h0), (b1, h1) = OFFSET_PROBES
    message = (
        f"{name}: pointer offsets computed in int32 grow with the batch or the heads (up to "
        f"{before} at B = {b0}, H = {h0}; {offset} at B = {b1}, H = {h1}, where it holds "
        f"{count} elements), so they wrap at 2^31 once it holds about {2**31 / share:.3g} "
        "elements; a GPU then reads and writes other memory (compute the offset in int64)"
    )
    figures = {"offset_share": share}
    row = CheckResult(INT32_OFFSETS, False, message, case, figures, severity="wrong",
                      regime="typical")  # fmt: skip
    # no `check` command runs it (its two calls are not one case): vet's smallest plan does,
    # on the same two calls, in float32 as they are
    rerun = ["--smallest", "--dtypes", "float32", "--long", "0", "--no-envelope"]
    rerun += ["--device", device] if device != "cpu" else []
    return [{**row.to_dict(), "reproduce": vet_command(impl, *rerun)}]


SCALING_MAX_N = 2048  # the scaling task's largest N
SMALLEST_SCALING_MAX_N = 1024  # in the smallest plan (VetOptions.smallest)
SCALING_D = 32  # the scaling task's d = dv


def scaling(
    impl: Implementation,
    device: str,
    expected: str,
    max_n: int = SCALING_MAX_N,
    dtype: str = "float32",
) -> list[Row]:
    """Counted FLOPs and peak bytes over N = 256 ... max_n (inputs in `dtype`, d = dv =
    SCALING_D, or the largest d the implementation takes) grow as `expected` ("linear" or
    "quadratic")."""
    spec = impl.spec
    d = impl.head_dims.d(SCALING_D)
    w = None
    if spec.info.needs_projection:
        w = sample_projection_torch(d, d, "orthogonal", torch.Generator().manual_seed(0))
        w = w.to(device)
    ns = [2**i for i in range(8, max_n.bit_length())]
    try:
        result = scaling_result(
            impl.name,
            lambda q, k, v: impl(q, k, v, w, default_arguments(spec, q)),
            expected,
            ns,
            causal=spec.causal,
            d=d,
            dv=d,
            device=device,
            dtype=dtype,
        )
    except ImplementationFailure as err:  # the d of the call: what probe_head_dims needs
        detail = f"{impl.name} {err} (d = dv = {d}, {dtype})"
        return [{"name": "scaling", "status": "fail", "detail": detail, "cause": "contract",
                 "figures": {"d": d}}]  # fmt: skip
    figures = {
        "flops_slope": result.growth.flops and result.growth.flops.slope,
        "bytes_slope": result.growth.bytes.slope,
    }
    row = CheckResult("scaling", result.growth.passed, result.growth.message, figures=figures)
    # a cost finding (vet/findings.py): what it claims, and the command that counts it again
    command = scaling_command(impl, max_n, d, dtype)
    return [{**row.to_dict(), **_cost_fields(result.growth.passed, expected, command)}]


def _cost_fields(passed: bool, expected: str, command: str) -> Row:
    """The scaling row's claim, and when it fails its cause ("cost") and reproduce command."""
    if passed:
        return {"claim": expected}
    return {"claim": expected, "cause": "cost", "reproduce": command}


def long_context(
    impl: Implementation, device: str, dtypes: tuple[str, ...], longest: int, seed: int
) -> list[Row]:
    """checks/long_context.py's check: accuracy, finiteness, growth and prefix consistency
    at N = 2^10 ... longest + 1; not applicable to a kernel of declared quadratic cost."""
    return _at_length(
        long_context_check, impl, device, dtypes, longest, seed, ("--long", str(longest))
    )


def gradient_length(
    impl: Implementation, device: str, dtypes: tuple[str, ...], longest: int, seed: int
) -> list[Row]:
    """checks/gradient_length.py's check: the backward at N = 256 ... longest against
    certified exact gradients."""
    rerun = ("--grad", "--long-grad", str(longest), "--long", "0", "--no-envelope")
    return _at_length(gradient_length_check, impl, device, dtypes, longest, seed, rerun)


def _at_length(check, impl, device: str, dtypes, longest: int, seed: int, rerun) -> list[Row]:
    """A check at length (its module: NAME, not_applicable, and the check of its name): its
    row, not applicable with why, or failed with the vet command that reruns it on the same
    draws (the seed, the `rerun` options)."""
    if reason := check.not_applicable(impl, dtypes):
        return [{"name": check.NAME, "status": "not applicable", "detail": reason}]
    run = getattr(check, check.NAME.replace("-", "_"))
    row = run(impl, dtypes, device, longest, seed).to_dict()
    if row["status"] == "fail":
        seeded = ("--seed", str(seed)) if seed else ()
        row["reproduce"] = vet_command(impl, "--dtypes", *dtypes, *rerun, *seeded)
    return [row]


def _one_row(name: str, results: list[CheckResult]) -> Row:
    """Several results of one check as one row: the first failure, or a count of passes."""
    failed = [r for r in results if not r.passed]
    shown = failed[0] if failed else results[0]
    row = shown.to_dict()
    row["name"] = name
    row["detail"] = f"{len(failed)} of {len(results)} failed; " + shown.message
    return row


def sampler_statistics(sampler_target: str, claim: str, seed: int) -> list[Row]:
    """The random-feature panel (stats/panel.py) on the sampler, one row per check."""
    results = check_sampler(load_target(sampler_target), claim, seed=seed, target=sampler_target)
    names = dict.fromkeys(r.check for r in results)
    # the sampler and the W it drew, for its finding (vet/findings.py)
    drew = {"target": sampler_target, "claim": claim, "seed": seed, "draws": DEFAULT_REPLICATES,
            "shape": [DEFAULT_M, DEFAULT_D]}  # fmt: skip
    return [
        {**_one_row(f"sampler {n}", [r for r in results if r.check == n]), "sampler": drew}
        for n in names
    ]


def rate(
    impl: Implementation,
    sampler_target: str | None,
    seed: int,
    device: str,
    dtypes: tuple[str, ...],
    claim: str | None = None,
) -> list[Row]:
    """The attention error against softmax falls as m^(-1/2) (stats/attention.py), on small
    inputs in the regime where that holds, in the most precise of `dtypes`; with the given
    sampler (claiming `claim` rows), else the project's iid."""
    sampler = load_target(sampler_target) if sampler_target else builtin_sampler("iid")
    dtype = next(t for t in ("float64", "float32", "bfloat16", "float16") if t in dtypes)
    inputs = regime_inputs(seed)
    result = rate_check(
        impl, sampler, inputs, seed=seed, dtype=getattr(torch, dtype), device=device
    )
    # the sampler and the W it drew, and the vet run that draws them again
    drew = {"target": sampler_target, "seed": seed, "draws": RATE_REPLICATES,
            "shape": ["m", inputs.q.shape[1]], "m": list(RATE_MS)}  # fmt: skip
    options = ["--sampler", sampler_target, "--claim", claim or "iid"] if sampler_target else []
    options += ["--seed", str(seed), "--dtypes", dtype, "--long", "0", "--no-envelope"]
    options += ["--device", device] if device != "cpu" else []
    row = {**result.to_dict(), "sampler": drew}
    return [row if result.passed else {**row, "reproduce": vet_command(impl, *options)}]


def known_answers(impl: Implementation, device: str, dtypes: tuple[str, ...]) -> list[Row]:
    """The known-answer vectors of the spec (the package's known_answers/) in `dtypes`: the
    error per vector in units of u s of its dtype, within the a-priori bound; those of head
    dimensions it does not take skipped (counted in the detail)."""
    rows = [r for r in run_vectors(impl, device=device) if r["dtype"] in dtypes]
    skipped = [r for r in rows if r.get("skipped")]
    rows = [r for r in rows if not r.get("skipped")]
    if not rows:
        detail = f"every vector skipped: {skipped[0]['skipped']}" if skipped else "no vector"
        return [{"name": "known-answers", "status": "skipped", "detail": detail}]
    bad = [r for r in rows if r.get("problem") or r["outside_bound"]]
    bad.sort(key=lambda r: REGIMES.index(r["regime"]))
    worst = max(rows, key=lambda r: r["max_error_units"])
    detail = f"{len(bad)} of {len(rows)} vectors outside the bound or broken"
    detail += f" ({len(skipped)} skipped: {skipped[0]['skipped']})" if skipped else ""
    shown = bad[0] if bad else worst
    what = f"first ({shown['regime']})" if bad else "worst"
    detail += f"; {what}: {shown['name']} ({shown['dtype']}): " + (
        shown.get("problem")
        or f"{shown['max_error_units']:.3g} u s, bound {shown['bound_units']:.3g}"
    )
    figures = {r["name"]: r["max_error_units"] for r in rows}  # the error of every vector
    severity = "wrong" if bad else None
    result = CheckResult("known-answers", not bad, detail, figures=figures, severity=severity,
                         regime=shown["regime"] if bad else None)  # fmt: skip
    if not bad:
        return [result.to_dict()]
    return [{**result.to_dict(), "reproduce": known_answers_command(impl)}]
