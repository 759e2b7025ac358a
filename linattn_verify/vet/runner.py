"""vet: every applicable check on one implementation, run in a worker process, and one
verdict. The plan: contract first, then the other property checks, accuracy per dtype, cost
scaling, and on request the known-answer vectors, a sampler's statistics and the rate; then
the operating envelope. The verdict: the failing rows grouped into findings (findings.py);
by default it fails on a finding in typical inputs, and reports the others as robustness
warnings (fail_on widens that, strict is every regime with relatively accurate features)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..cases import Case
from ..checks import CHECKS, GRAD_CHECKS
from ..checks import gradient_length as gradient_length_check
from ..checks import long_context as long_context_check
from ..checks.gradient_length import LONGEST_DEFAULT as LONG_GRAD_DEFAULT
from ..checks.gradient_length import NAME as GRADIENT_LENGTH
from ..checks.gradient_length import default_longest as long_grad_default
from ..checks.long_context import LONGEST, default_longest
from ..checks.search import THOROUGH_EXAMPLES, VET_EXAMPLES, VET_GRADIENT_EXAMPLES
from ..families import family_of
from ..head_dims import SIXTEEN_BIT
from ..known_answers import not_applicable as kat_not_applicable
from ..regimes import REGIMES
from ..specs import Spec, SpecError
from ..stats import rate_not_applicable
from ..stats.estimators import one_thread
from ..strategies import DTYPES
from ..under_test import Implementation
from .findings import Row
from .outcome import VetReport
from .requests import (
    Accuracy,
    AutotuneConfigs,
    Envelope,
    GradientLength,
    HeadDimsProbe,
    Int32Offsets,
    KnownAnswers,
    LongContext,
    OutsideClaim,
    PropertyCheck,
    Rate,
    SamplerStatistics,
    Scaling,
    Task,
    Tf32Dots,
)
from .tasks import DEPENDS, SCALING_MAX_N, SMALLEST_SCALING_MAX_N
from .worker import (
    KernelOutput,
    Running,
    Worker,
    WorkerDied,
    WorkerHung,
    describe,
    edited_since,
    max_rss,
    run_task,
)

DEFAULT_TIMEOUT = 300.0  # seconds per task: a thorough search of a slow kernel takes minutes


@dataclass(frozen=True)
class VetOptions:
    dtypes: tuple[str, ...] = DTYPES
    device: str = "cpu"
    sampler: str | None = None  # module:fn of a projection sampler
    claim: str | None = None  # what the sampler's rows are: iid or orthogonal
    kat: bool = False
    grad: bool = False  # also the gradient checks (checks.GRAD_CHECKS)
    thorough: bool = False
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT
    fail_on: str = "typical"  # the verdict fails on findings in this regime and milder ones
    strict: bool = False  # every regime, and elu features held to relative accuracy
    envelope: bool = True  # the operating envelope per dtype
    # the long-context check to this N (and N + 1); 0: not run; None: the plan's, long_n()
    longest: int | None = None
    # with grad, the gradient checks at length to this N; 0: not run; None: the plan's,
    # long_grad_n()
    long_grad: int | None = None
    # every check on one typical case per dtype, no search (tasks.smallest_cases), scaling
    # to N = 1024, long context to SMALLEST_LONGEST: what CI checks of kernels whose every
    # call takes seconds (Triton's interpreter)
    smallest: bool = False

    def long_n(self, interpreted: bool, stepwise: bool = False) -> int:
        """The long-context check's longest N: the one given, else the plan's
        (long_context.default_longest)."""
        if self.longest is not None:
            return self.longest
        return default_longest(interpreted, self.smallest, stepwise)

    def long_grad_n(self, interpreted: bool, spec: Spec) -> int:
        """The gradient check at length's longest N: 0 without --grad, the one given, 0 in
        the smallest plan, else the plan's (gradient_length.default_longest)."""
        if not self.grad:
            return 0
        if self.long_grad is not None:
            return self.long_grad
        if self.smallest:
            return 0
        return long_grad_default(interpreted, spec)

    def __post_init__(self) -> None:
        if self.fail_on not in REGIMES:
            raise SpecError(f"fail_on must be one of {', '.join(REGIMES)}, got {self.fail_on!r}")

    @property
    def failing_regimes(self) -> tuple[str, ...]:
        """The regimes whose findings fail the verdict."""
        last = len(REGIMES) if self.strict else REGIMES.index(self.fail_on) + 1
        return REGIMES[:last]


def plan(description: dict[str, Any], options: VetOptions) -> list[Task]:
    """The tasks in order: contract first, so a broken contract shows first."""
    spec = description["spec"]
    forward = THOROUGH_EXAMPLES if options.thorough else VET_EXAMPLES
    backward = THOROUGH_EXAMPLES if options.thorough else VET_GRADIENT_EXAMPLES
    device, dtypes, smallest = options.device, options.dtypes, options.smallest
    steps: list[Task] = [
        PropertyCheck(
            name=name,
            examples=backward if name in GRAD_CHECKS else forward,
            device=device,
            dtypes=dtypes,
            smallest=smallest,
        )
        for name in [*CHECKS, *(GRAD_CHECKS if options.grad else ())]
        if name not in description["not_applicable"]
    ]
    steps.append(Accuracy(device=device, dtypes=dtypes, smallest=smallest))
    if description.get("triton") == "interpret":
        steps.append(AutotuneConfigs(device=device, dtypes=dtypes, smallest=smallest))
        steps.append(Int32Offsets(device=device))
    max_n = SMALLEST_SCALING_MAX_N if smallest else SCALING_MAX_N
    dtype = "float32" if "float32" in dtypes else dtypes[0]  # one the kernel takes
    steps.append(Scaling(device=device, expected=description["cost"], max_n=max_n, dtype=dtype))
    if longest := options.long_n(
        description.get("triton") == "interpret", family_of(spec).stepwise
    ):
        steps.append(LongContext(device=device, dtypes=dtypes, longest=longest, seed=options.seed))
    if long_grad := options.long_grad_n(description.get("triton") == "interpret", spec):
        steps.append(
            GradientLength(device=device, dtypes=dtypes, longest=long_grad, seed=options.seed)
        )
    if options.kat and not kat_not_applicable(spec):
        steps.append(KnownAnswers(device=device, dtypes=dtypes))
    sampler, claim, seed = options.sampler, options.claim, options.seed
    if sampler:
        steps.append(SamplerStatistics(sampler_target=sampler, claim=claim, seed=seed))
    if spec.info.needs_projection and not rate_not_applicable(spec):
        rate = Rate(sampler_target=sampler, claim=claim, seed=seed, device=device, dtypes=dtypes)
        steps.append(rate)
    if options.envelope:
        steps.append(Envelope(device=device, dtypes=dtypes))
    features = "relative" if options.strict else "standard"  # the bounds' (accuracy/bound.py)
    return [replace(task, features=features) for task in steps]


def _declares_tf32(description: dict[str, Any], options: VetOptions) -> bool:
    """Whether the spec declares TF32 products of a kernel in Triton's interpreter, where
    the tl.dots that take them are counted (tasks.tf32_dots)."""
    return (
        description.get("triton") == "interpret"
        and description["spec"].dot_precision == "tf32"
        and "float32" in options.dtypes
    )


def _within_claim(
    description: dict[str, Any], options: VetOptions
) -> tuple[VetOptions, tuple[str, ...]]:
    """The options judging only the dtypes the implementation's library claims (an
    adapter's dtypes), and the others asked for (a line each under "outside the claim");
    SpecError when none is left."""
    claimed = description.get("dtypes")
    if claimed is None:
        return options, ()
    inside = tuple(d for d in options.dtypes if d in claimed)
    if not inside:
        raise SpecError(
            f"{description['name']} takes {', '.join(claimed)} (its library's claim): --dtypes "
            f"{' '.join(options.dtypes)} leaves nothing to judge"
        )
    return replace(options, dtypes=inside), tuple(d for d in options.dtypes if d not in claimed)


def _outside_claim(
    description: dict[str, Any], options: VetOptions, dtypes: tuple[str, ...]
) -> OutsideClaim | None:
    """The calls just outside the claim (tasks.outside_claim): on `dtypes`, those asked for
    that it does not claim, and past the head dimensions it declares; None if none."""
    if not dtypes and not description["head_dims"].declared:
        return None
    return OutsideClaim(device=options.device, dtypes=dtypes, judged=options.dtypes,
                        grad=options.grad)  # fmt: skip


def _head_dims_probe(
    rows: list[Row], description: dict[str, Any], options: VetOptions
) -> HeadDimsProbe | None:
    """The probe of an undeclared limit on the head dimensions (tasks.probe_head_dims), where
    the contract check passed and calls raised: at the d a task fixed (figure "d", scaling's
    and the long-context panels'), past a largest d not declared; or in a 16-bit backward
    pass of an odd d or dv, even ones not declared. None where nothing points to one."""
    if not any(r["name"] == "contract" and r["status"] == "pass" for r in rows):
        return None
    dims, raised, odd = description["head_dims"], [], None
    for row in rows:
        if row["status"] != "fail" or row.get("cause") != "contract":
            continue
        if dims.largest is None and "d" in (row.get("figures") or {}):
            raised.append(int(row["figures"]["d"]))
        if not dims.even_backward and odd is None and row["name"] in GRAD_CHECKS:
            odd = row["case"] if _odd_sixteen_bit(Case.from_json(row["case"])) else None
    if not raised and odd is None:
        return None
    dtype = "float32" if "float32" in options.dtypes else options.dtypes[0]
    return HeadDimsProbe(device=options.device, dtype=dtype, raised=min(raised, default=None),
                         odd=odd)  # fmt: skip


def _odd_sixteen_bit(case: Case) -> bool:
    return case.dtype in SIXTEEN_BIT and bool(case.d % 2 or case.dv % 2)


def _name_limits(rows: list[Row], probe: dict[str, Any]) -> None:
    """The failing rows the probe's evidence explains, each given the limit they show and the
    option that declares it (key "limit", findings.py adds it to the finding's detail)."""
    largest, even = probe["figures"].get("largest", -1), probe["figures"].get("even_backward")
    for row in rows:
        if row["status"] != "fail" or row.get("cause") != "contract":
            continue
        d = (row.get("figures") or {}).get("d")
        if largest > 0 and d is not None and d > largest:
            row["limit"] = (
                f" (on the smallest case it takes d <= {largest} and raises at d = "
                f"{largest + 1}, and every case of the plan met the contract: if it takes no "
                f"larger d, declare the largest it takes, --max-head-dim {largest})"
            )
        case = row.get("case") and Case.from_json(row["case"])
        if even and row["name"] in GRAD_CHECKS and case and _odd_sixteen_bit(case):
            row["limit"] = (
                f" (its backward raises on {case.dtype} inputs of d = {case.d}, dv = "
                f"{case.dv} and runs with even ones and in float32: if it takes no odd d or dv "
                "in 16-bit backward passes, declare so, --even-dims-backward)"
            )


def _without_tf32(impl: Implementation) -> Implementation:
    """The implementation judged in float32's own unit: its declared TF32 products never
    ran (a tl.dot on float32 inputs with TF32 rounding), so there is nothing to widen."""
    return replace(impl, spec=replace(impl.spec, dot_precision=None))


UNUSED_TF32 = (
    "; --dot-precision tf32 has nothing to apply to (no tl.dot ran with TF32 products on "
    "float32 inputs: none in the kernel, or no --tf32): float32 is judged in its own unit"
)


def _report(
    target: str, description: dict[str, Any], options: VetOptions, as_claimed: Spec
) -> VetReport:
    """The report before the plan runs: a row for each check that does not apply (and why)
    and for each that an option leaves out (status "skipped", the option in its detail).
    as_claimed: the spec its header names; the description's is the one judged
    (_without_tf32), which names the causes (VetReport.claimed)."""
    spec = description["spec"]
    report = VetReport(
        target, description["name"], str(as_claimed), [], options.failing_regimes, claimed=spec
    )
    dtypes, dims = description.get("dtypes") or (), description["head_dims"]
    report.takes = (*[", ".join(dtypes)] * bool(dtypes), *[str(dims)] * dims.declared)
    if description.get("triton") == "interpret":
        products = "TF32 (--tf32)" if description.get("tf32") else "IEEE"
        report.runs_in = f"Triton's interpreter on CPU tensors, float32 products {products}"
        report.runs_in += UNUSED_TF32 if spec.dot_precision != as_claimed.dot_precision else ""
    rows = report.rows
    for name, reason in description["not_applicable"].items():
        if options.grad or name not in GRAD_CHECKS:
            rows.append({"name": name, "status": "not applicable", "detail": reason})
    if options.kat and (reason := kat_not_applicable(spec)):
        rows.append({"name": "known-answers", "status": "not applicable", "detail": reason})
    if spec.info.needs_projection and (reason := rate_not_applicable(spec)):
        rows.append({"name": "rate", "status": "not applicable", "detail": reason})

    def skipped(name: str, option: str) -> None:
        rows.append({"name": name, "status": "skipped", "detail": option})

    if not options.grad:
        for name in GRAD_CHECKS:
            if name not in description["not_applicable"]:
                skipped(name, "without --grad")
    if not options.long_n(description.get("triton") == "interpret", family_of(spec).stepwise):
        skipped("long-context", "--long 0")
    if not options.long_grad_n(description.get("triton") == "interpret", spec):
        without = "--smallest" if options.long_grad is None else "--long-grad 0"
        skipped(GRADIENT_LENGTH, without if options.grad else "without --grad")
    if not options.kat and not kat_not_applicable(spec):
        skipped("known-answers", "without --kat")
    if spec.info.needs_projection and not options.sampler:
        skipped("sampler", "without --sampler")
    if not options.envelope:
        skipped("envelope", "--no-envelope")
    return report


AT_LENGTH = {  # the tasks whose check says at run time whether it applies (tasks._at_length)
    LongContext: long_context_check,
    GradientLength: gradient_length_check,
}


def applicability(impl: Implementation, options: VetOptions) -> dict[str, tuple[str, str]]:
    """What vet's plan does with each check on `impl` (loaded, or declared when the spec
    alone decides), before anything runs, in the plan's order: (status, detail) by name,
    status "runs" (detail: the longest N of a check at length, else ""), "not applicable"
    (detail: why) or "skipped" (detail: the option). A check absent is not in the plan
    (autotune-configs outside Triton's interpreter, rate without a projection). The same
    rules as vet's run: _report, plan and the checks at length's not_applicable; the table
    of docs/vet.md ("Where each check applies") is made from it."""
    description = describe(impl)
    found: dict[str, tuple[str, str]] = {}
    for task in plan(description, options):
        check = AT_LENGTH.get(type(task))
        if check and (reason := check.not_applicable(impl, options.dtypes)):
            found[task.name] = ("not applicable", reason)
        else:
            found[task.name] = ("runs", str(getattr(task, "longest", "")))
    for row in _report(impl.source.name, description, options, impl.spec).rows:
        found.setdefault(row["name"], (row["status"], row["detail"]))
    return found


PAST_CONTRACT_TASKS = (PropertyCheck, Accuracy)  # the tasks that pass over what it covers


def _past_contract(rows: list[Row], task: Task) -> Task:
    """The task; once the contract check has failed, the searches pass over the failures it
    covers (tasks.ContractCovered), so that each later check reports a failure of its own."""
    contract = next((r for r in rows if r["name"] == "contract" and r["status"] == "fail"), None)
    if contract is not None and isinstance(task, PAST_CONTRACT_TASKS):
        return replace(task, past_contract=contract.get("regime") or "typical")
    return task


def _without_case_after_contract(rows: list[Row]) -> list[Row]:
    """A task that runs no case through a check (scaling, the known-answer vectors) and
    breaks the contract once the contract check has failed on typical inputs (so the
    verdict fails whatever else): its row depends on the contract's, its message kept."""
    typical = any(
        r["name"] == "contract" and r["status"] == "fail" and r.get("regime") == "typical"
        for r in rows
    )
    return [
        {**r, "status": DEPENDS, "detail": f"{r['detail']} (the contract's failure, above)"}
        if typical and r["status"] == "fail" and r.get("cause") == "contract" and not r.get("case")
        else r
        for r in rows
    ]


def _timeout(task: Task, options: VetOptions) -> float:
    """Seconds the task may take: the long-context check's grows with its longest N."""
    if isinstance(task, LongContext):
        return options.timeout * max(1.0, task.longest / LONGEST)
    if isinstance(task, GradientLength):
        return options.timeout * max(1.0, task.longest / LONG_GRAD_DEFAULT)
    return options.timeout


PROGRESS_EVERY = 10.0  # seconds between progress lines within a task


class _Progress:
    """A line on the task's cases every PROGRESS_EVERY seconds: "[3/11] permutation: 57 of
    at most 95 cases, 12 s", and the cases beyond the plan (a failure shrunk or checked
    again, checks.core.beyond_plan) apart: "..., 95 of at most 95 cases and 40 shrinking or
    re-checking a failure, 30 s"."""

    def __init__(self, say: Callable[[str], None], step: str, total: int | None) -> None:
        self.say, self.step, self.total = say, step, total
        self.start = self.last = time.monotonic()

    def __call__(self, running: Running) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY:
            return
        self.last = now
        of = f" of at most {self.total}" if self.total else ""
        beyond = running.get("beyond", 0)
        more = f" and {beyond} shrinking or re-checking a failure" if beyond else ""
        self.say(f"{self.step}: {running['done']}{of} cases{more}, {now - self.start:.0f} s")


def _stop_if_edited(worker: Worker) -> None:
    """SpecError, a usage error (vet's exit status 2), when a file the kernel is read from
    (worker.kernel_files) changed since the worker loaded it: what failed since may be the
    edit's doing, not the kernel's (Triton's interpreter reads the source again at each
    call: an edit makes every later case raise "KeyError: '_chunk_gla_h'")."""
    edited = edited_since(worker.description.get("files", {}))
    if edited is not None:
        name, when = edited
        at = time.strftime("%H:%M:%S", time.localtime(when))
        raise SpecError(f"the kernel's file {name} changed while vet ran (at {at}): rerun vet")


def _stopped(name: str, how: str, running: Running | None) -> Row:
    """The failed row of a task that crashed or hung, a finding of its own that fails the
    verdict whatever its inputs (findings.py: "stopped"): with the case a check was running
    on when it did (and the command that reruns it), when one was."""
    row = {"name": name, "status": "fail", "detail": how, "severity": "wrong", "stopped": True}
    if running is None:
        return row
    detail = f"{how}, while {running['check']} ran on {Case.from_json(running['case'])}"
    return {**row, "detail": detail, "case": running["case"], "reproduce": running["reproduce"]}


def vet(
    declared: Implementation, options: VetOptions, progress: Callable[[str], None] | None = None
) -> VetReport:
    """Run the plan on `declared` (resolve(..., load=False)) in a worker process; a hang
    stops the run (what is left is "not run"), a crash restarts the worker once. SpecError
    when the implementation cannot be loaded. What the implementation prints is kept in a
    file the report (or that SpecError) names (VetReport.printed), removed when it printed
    nothing."""
    say = progress or (lambda text: None)
    output = KernelOutput.new()
    try:
        report = _vet_in_worker(declared, options, say, output)
    except SpecError as err:
        if not output.lines():
            raise
        raise SpecError(f"{err} (what it printed: {output.path})") from None
    finally:
        lines = output.lines()
        if not lines:
            output.path.unlink(missing_ok=True)
    report.printed = (str(output.path), lines) if lines else None
    return report


def _vet_in_worker(
    declared: Implementation,
    options: VetOptions,
    say: Callable[[str], None],
    output: KernelOutput,
) -> VetReport:
    """vet's plan in worker processes whose prints go to `output` (KernelOutput)."""
    worker = Worker(declared, options.timeout, output)
    claimed = worker.description["spec"]
    try:
        options, outside = _within_claim(worker.description, options)
    except SpecError:
        worker.close()
        raise
    if _declares_tf32(worker.description, options):
        try:
            (dots,) = worker.run(Tf32Dots(device=options.device))
        except (WorkerHung, WorkerDied):  # nothing learnt, the declaration kept; the
            worker.close()  # contract check will say what happened
            dots = {"figures": {"tf32_dots": -1}}
            worker = Worker(declared, options.timeout, output)
        if dots["figures"]["tf32_dots"] == 0:
            worker.close()
            worker = Worker(_without_tf32(declared), options.timeout, output)
    report = _report(declared.source.name, worker.description, options, claimed)
    spec = worker.description["spec"]
    crashes = 0
    try:
        if task := _outside_claim(worker.description, options, outside):
            report.rows += worker.run(task)
        steps = plan(worker.description, options)
        for i, task in enumerate(steps):
            name = task.name
            step = f"[{i + 1}/{len(steps)}] {name}"
            say(f"{step} ...")
            on_case = _Progress(say, step, task.planned_cases(spec))
            task = _past_contract(report.rows, task)
            start = time.monotonic()
            try:
                rows = worker.run(task, _timeout(task, options), on_case)
                if any(row["status"] == "fail" for row in rows):
                    _stop_if_edited(worker)
                report.seconds[name] = time.monotonic() - start
                say(f"{step} done in {report.seconds[name]:.1f} s")
                report.max_rss["worker"] = max(report.max_rss.get("worker", 0), worker.max_rss)
                report.rows += rows
                continue
            except WorkerHung as err:
                _stop_if_edited(worker)
                row = _stopped(name, f"hung: {err}", worker.running)
                row["detail"] += "; --timeout SECONDS gives each task longer"
                report.rows.append(row)
                stop = f"not run: vet stopped after {name} hung"
            except WorkerDied as err:
                _stop_if_edited(worker)
                report.rows.append(_stopped(name, f"crashed: {err}", worker.running))
                crashes += 1
                stop = f"not run: vet stopped after a second crash, in {name}"
                if crashes < 2:
                    try:
                        worker = Worker(declared, options.timeout, output)
                        continue
                    except SpecError as restart:
                        stop = f"not run: the worker did not restart ({restart})"
            rest = steps[i + 1 :]
            report.rows += [{"name": t.name, "status": "not run", "detail": stop} for t in rest]
            break
        if probe := _head_dims_probe(report.rows, worker.description, options):
            with contextlib.suppress(WorkerHung, WorkerDied):  # no evidence: as they are
                _name_limits(report.rows, worker.run(probe)[0])
    finally:
        worker.close()
    report.max_rss["parent"] = max_rss()
    report.rows = _without_case_after_contract(report.rows)
    return report


def vet_in_process(
    impl: Implementation, options: VetOptions, progress: Callable[[str], None] | None = None
) -> VetReport:
    """The same plan in this process, for an implementation that is already loaded (a
    closure in a test suite): no protection against crashes or hangs; torch on one thread
    while it runs, as in vet's worker."""
    with one_thread():
        return _vet_in_process(impl, options, progress)


def _vet_in_process(
    impl: Implementation, options: VetOptions, progress: Callable[[str], None] | None
) -> VetReport:
    say = progress or (lambda text: None)
    claimed = impl.spec
    options, outside = _within_claim(describe(impl), options)
    if _declares_tf32(describe(impl), options):
        (dots,) = run_task(impl, Tf32Dots(device=options.device))
        impl = _without_tf32(impl) if dots["figures"]["tf32_dots"] == 0 else impl
    description = describe(impl)
    report = _report(impl.source.name, description, options, claimed)
    if task := _outside_claim(description, options, outside):
        report.rows += run_task(impl, task)
    steps = plan(description, options)
    for i, task in enumerate(steps):
        say(f"[{i + 1}/{len(steps)}] {task.name} ...")
        start = time.monotonic()
        report.rows += run_task(impl, _past_contract(report.rows, task))
        report.seconds[task.name] = time.monotonic() - start
    if probe := _head_dims_probe(report.rows, description, options):
        _name_limits(report.rows, run_task(impl, probe)[0])
    report.max_rss["process"] = max_rss()
    report.rows = _without_case_after_contract(report.rows)
    return report
