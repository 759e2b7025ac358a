"""What a report runs (ReportOptions -> plan) and the run itself: the JSON document, with
the plots written beside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..environment import environment
from ..families import family_of, fast_form, forms_of
from ..scaling import ScalingResult, plot_scaling
from ..specs import Spec
from ..under_test import Implementation, resolve
from .accuracy import Sweep, accuracy_rows
from .gradients import GRADIENT_N, gradient_rows
from .long import (
    FULL_LONGEST,
    LONG_D,
    LONG_SPECS,
    QUADRATIC_LONGEST,
    UNJUDGED_DTYPES,
    LongSweep,
    long_ns,
    long_section,
    sweep_ns,
)
from .notes import NOTES, filled
from .plots import plot_error_vs_n, plot_long_context, plot_margins
from .random_features import random_features
from .scaling import ScalingPlan, scaling_rows

SCHEMA = "linattn-verify report 1"
DEFAULT_NS = (16, 64, 256)
FULL_NS = (16, 64, 256, 1024)
COST_NS = (256, 512, 1024, 2048)
FULL_COST_NS = (256, 512, 1024, 2048, 4096, 8192)
TIME_NS = (256, 512, 1024, 2048, 4096, 8192)
FULL_TIME_NS = (*TIME_NS, 16384, 32768)
TIMED_MAP = "elu"  # the default run times this map's fast forms (else the first spec's);
# --full times every spec


@dataclass(frozen=True)
class ReportOptions:
    specs: tuple[str, ...]
    dtypes: tuple[str, ...]
    devices: tuple[str, ...]
    full: bool = False
    seed: int = 0
    impl: Implementation | None = None  # report on this one instead of the built-in forms
    grad: bool = True  # judge the backward too (--no-grad: a forward-only --impl)


@dataclass
class Plan:
    """The implementations to judge, grouped by spec (form name -> implementation), those
    to measure (implementation, expected growth, timed), and the groups of the long
    sequences with their N (report/long.py)."""

    groups: list[tuple[Spec, dict[str, Implementation]]]
    scaled: list[tuple[Implementation, str, bool]]
    fast_form: dict[str, str] = field(default_factory=dict)  # spec -> form plotted vs N
    long: list[tuple[Spec, dict[str, Implementation], tuple[int, ...]]] = field(
        default_factory=list
    )


def make_plan(options: ReportOptions) -> Plan:
    """Every form of every spec (causal and not), or the one options.impl. At long N: with
    --full every spec but softmax, by default those of LONG_SPECS in the report (none: the
    first other spec's two)."""
    if options.impl is not None:
        impl = options.impl
        group = {"impl": impl}
        ns = long_ns(impl.spec, group, options.full, chosen=True)
        return Plan(
            [(impl.spec, group)],
            [(impl, impl.cost, True)],
            {str(impl.spec): "impl"},
            [(impl.spec, group, ns)] if ns else [],
        )
    plan = Plan([], [])
    timed_map = TIMED_MAP if TIMED_MAP in options.specs else options.specs[0]
    for name in options.specs:
        for causal in (False, True):
            spec = Spec(name, causal=causal)
            forms = {form: resolve(form=form, spec=spec) for form in forms_of(spec)}
            plan.groups.append((spec, forms))
            fast = forms[fast_form(spec)]
            plan.scaled.append((fast, fast.cost, options.full or name == timed_map))
            plan.fast_form[str(spec)] = fast_form(spec)
    long = [
        (spec, forms, long_ns(spec, forms, options.full, str(spec) in LONG_SPECS))
        for spec, forms in plan.groups
    ]
    long = [group for group in long if group[2]]  # not softmax
    chosen = [group for group in long if str(group[0]) in LONG_SPECS]
    plan.long = long if options.full else chosen or long[:2]
    return plan


def units(options: ReportOptions, plan: Plan) -> int:
    """Progress units of the run."""
    ns = FULL_NS if options.full else DEFAULT_NS
    per_group = len(ns) + options.grad
    accuracy = len(plan.groups) * per_group * len(options.dtypes) * len(options.devices)
    random = 0 if options.impl else 3 + options.full
    judged = [t for t in options.dtypes if t not in UNJUDGED_DTYPES]
    long = sum(len(ns) for _, _, ns in plan.long) * len(judged) * len(options.devices)
    return accuracy + len(plan.scaled) * len(options.devices) + random + long


def run_report(options: ReportOptions, folder: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """Run the plan; the plots go into `folder`; returns the JSON document."""
    start = time.perf_counter()
    plan = make_plan(options)
    ns = FULL_NS if options.full else DEFAULT_NS
    accuracy: dict[str, Any] = {"rows": [], "margins": [], "plots": {}}
    gradients: dict[str, Any] = {"rows": []}
    scaling: dict[str, Any] = {"rows": [], "plots": {}}
    long: dict[str, Any] = {"rows": [], "plots": {}}
    measured: list[tuple[Implementation, ScalingResult, str]] = []  # and the device
    for device in options.devices:
        sweep = Sweep(ns, options.dtypes, device, h=2 if options.full else 1, seed=options.seed)
        for spec, impls in plan.groups:
            rows, margins = accuracy_rows(spec, impls, sweep, step)
            accuracy["rows"] += rows
            accuracy["margins"] += margins
            if options.grad:
                gradients["rows"] += gradient_rows(spec, impls, sweep, step)
        long_sweep = LongSweep(options.dtypes, device, seed=options.seed)
        long["rows"] += long_section(plan.long, long_sweep, step)
        scaling_plan = ScalingPlan(
            FULL_COST_NS if options.full else COST_NS,
            FULL_TIME_NS if options.full else TIME_NS,
            device,
            seed=options.seed,
        )
        rows, results = scaling_rows(plan.scaled, scaling_plan, step)
        scaling["rows"] += rows
        measured += [(impl, result, device) for impl, result in results]
    _accuracy_plots(accuracy, plan, options, folder)
    _long_plots(long, options, folder)
    if measured:
        timings, costs, panels = _scaling_curves(measured)
        plot_scaling(timings, costs, folder / "scaling.png", panels)
        scaling["plots"]["scaling"] = "scaling.png"
    random = (
        {"skipped": "--impl reports an implementation; for a sampler use random-features"}
        if options.impl
        else random_features(folder, options.seed, options.full, step)
    )
    document = {
        "schema": SCHEMA,
        "environment": {
            **environment(options.devices[-1]),
            "devices": list(options.devices),
            "seed": options.seed,
            "options": _options(options),
            "sweep": {
                "accuracy": {
                    "ns": list(ns),
                    "shape_B_H_d_dv": [sweep.b, sweep.h, sweep.d, sweep.dv],
                    "inputs": "N(0, 1) from numpy PCG64([seed, N]), rounded to each dtype "
                    "(typical inputs, regimes.py: every failure fails the verdict)",
                    "projection": "orthogonal rows with chi(d) norms, m = d, PCG64(seed)",
                    **_arguments(plan, "accuracy"),
                },
                "gradients": {
                    "n": GRADIENT_N,
                    "loss": "sum(out * G), G N(0, 1) from PCG64([seed, N, 1]), in the dtype",
                },
                "long_context": {
                    "ns": list(sweep_ns(options.full)),
                    "full_longest_but_long_specs": FULL_LONGEST if options.full else None,
                    "quadratic_longest": QUADRATIC_LONGEST,
                    "shape_B_H_d_dv": [1, 1, LONG_D, LONG_D],
                    "inputs": "the long-context check's typical regime (checks/long_context.py "
                    "inputs: keys sharing a direction, values N(1, 1)), one draw per spec and "
                    "dtype at its longest N and its prefixes; seed as above",
                    "reference": "certified (reference/certified.py), float64 within 2^-34 s",
                    "torch_threads": 1,
                    **_arguments(plan, "long"),
                },
                "scaling": {
                    **asdict(scaling_plan),
                    "inputs": "float32",
                    "torch_threads": 1,
                    **_arguments(plan, "scaling"),
                },
            },
            "seconds": time.perf_counter() - start,
        },
        "accuracy": accuracy,
        "gradients": gradients,
        "long_context": long,
        "scaling": scaling,
        "random_features": random,
    }
    document["verdict"] = verdict(document)
    return document


def _scaling_curves(
    measured: list[tuple[Implementation, ScalingResult, str]],
) -> tuple[dict[str, Any], dict[str, Any], dict[str, tuple[str, str]]]:
    """plot_scaling's timings, costs and panels of the results (and their device): a
    group per feature map and device, each implementation's counted cost, and where timed
    its time and SDPA's beside it, labelled by form and causality."""
    timings, costs, panels = {}, {}, {}
    for impl, result, device in measured:
        suffix = "" if device == "cpu" else f" [{device}]"
        name, group = impl.name + suffix, impl.spec.feature_map + suffix
        causality = "causal" if impl.spec.causal else "non-causal"
        form = impl.source.name if impl.source.kind == "form" else impl.name
        costs[name], panels[name] = result.costs, (group, f"{form}, {causality}")
        if result.timing is not None:
            timings[name] = result.timing
        if result.sdpa_timing is not None:
            timings[f"sdpa beside {name}"] = result.sdpa_timing
            panels[f"sdpa beside {name}"] = (group, f"sdpa, {causality}")
    return timings, costs, panels


def _arguments(plan: Plan, section: str) -> dict[str, str]:
    """How `section`'s sweep draws the arguments of the families of the plan's specs that
    have them (Family.notes; in the JSON only for a report that has such a spec: a plain
    report's sweep, which --compare matches, is as it was)."""
    has = {n.key for spec, _ in plan.groups for n in family_of(spec).notes if n.applies(spec)}
    return {key: filled(getattr(notes, section)) for key, notes in NOTES.items() if key in has}


def _options(options: ReportOptions) -> dict[str, Any]:
    """The options as JSON: the implementation by the command options that name it."""
    named = {f.name: getattr(options, f.name) for f in fields(options)}
    return {**named, "impl": options.impl and options.impl.command}


def _accuracy_plots(
    accuracy: dict[str, Any], plan: Plan, options: ReportOptions, folder: Path
) -> None:
    """error_vs_n.png and margins.png, on the first device's rows."""
    device = options.devices[0]
    rows = [r for r in accuracy["rows"] if r["device"] == device]
    plot_error_vs_n(rows, plan.fast_form, folder / "error_vs_n.png")
    accuracy["plots"]["error_vs_n"] = "error_vs_n.png"
    dtype = next(t for t in ("float32", "float64", "bfloat16", "float16") if t in options.dtypes)
    margins = [
        m for m in accuracy["margins"] if m["device"] == device and "not_applicable" not in m
    ]
    if margins:  # none: every spec unnormalised, and the Markdown says so
        plot_margins(margins, dtype, folder / "margins.png")
        accuracy["plots"]["margins"] = "margins.png"


def _long_plots(long: dict[str, Any], options: ReportOptions, folder: Path) -> None:
    """long_context_DTYPE.png per dtype judged, on the first device's rows."""
    rows = [r for r in long["rows"] if r["device"] == options.devices[0]]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        name = f"long_context_{dtype}.png"
        plot_long_context(rows, dtype, folder / name)
        long["plots"][dtype] = name


def verdict(document: dict[str, Any]) -> str:
    """ "pass" when every accuracy, long-sequence and gradient judgement, every cost growth
    and every sampler passes."""
    failed = [r for r in document["accuracy"]["rows"] if not r["passed"]]
    failed += [r for r in document.get("long_context", {}).get("rows", []) if not r["passed"]]
    failed += [r for r in document["gradients"]["rows"] if not r["passed"]]
    failed += [r for r in document["scaling"]["rows"] if not r["cost_passed"]]
    failed += [s for s in document["random_features"].get("samplers", []) if not s["passed"]]
    return "fail" if failed else "pass"
