"""What a report runs (ReportOptions -> plan) and the run itself: the JSON document, with
the plots written beside it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..environment import environment
from ..implementations.forms import fast_form, forms_of
from ..scaling import plot_scaling
from ..specs import Spec
from ..under_test import Implementation, resolve
from .accuracy import Sweep, accuracy_rows
from .gradients import GRADIENT_N, gradient_rows
from .plots import plot_error_vs_n, plot_margins
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
    """The implementations to judge, grouped by spec (form name -> implementation), and
    those to measure (implementation, expected growth, timed)."""

    groups: list[tuple[Spec, dict[str, Implementation]]]
    scaled: list[tuple[Implementation, str, bool]]
    fast_form: dict[str, str] = field(default_factory=dict)  # spec -> form plotted vs N


def make_plan(options: ReportOptions) -> Plan:
    """Every form of every spec (causal and not), or the one options.impl."""
    if options.impl is not None:
        impl = options.impl
        return Plan(
            [(impl.spec, {"impl": impl})], [(impl, impl.cost, True)], {str(impl.spec): "impl"}
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
    return plan


def units(options: ReportOptions, plan: Plan) -> int:
    """Progress units of the run."""
    ns = FULL_NS if options.full else DEFAULT_NS
    per_group = len(ns) + options.grad
    accuracy = len(plan.groups) * per_group * len(options.dtypes) * len(options.devices)
    random = 0 if options.impl else 3 + options.full
    return accuracy + len(plan.scaled) * len(options.devices) + random


def run_report(options: ReportOptions, folder: Path, step: Callable[[str], None]) -> dict[str, Any]:
    """Run the plan; the plots go into `folder`; returns the JSON document."""
    start = time.perf_counter()
    plan = make_plan(options)
    ns = FULL_NS if options.full else DEFAULT_NS
    accuracy: dict[str, Any] = {"rows": [], "margins": [], "plots": {}}
    gradients: dict[str, Any] = {"rows": []}
    scaling: dict[str, Any] = {"rows": [], "plots": {}}
    timed_all: dict[str, Any] = {}
    costs_all: dict[str, Any] = {}
    for device in options.devices:
        sweep = Sweep(ns, options.dtypes, device, h=2 if options.full else 1, seed=options.seed)
        for spec, impls in plan.groups:
            rows, margins = accuracy_rows(spec, impls, sweep, step)
            accuracy["rows"] += rows
            accuracy["margins"] += margins
            if options.grad:
                gradients["rows"] += gradient_rows(spec, impls, sweep, step)
        scaling_plan = ScalingPlan(
            FULL_COST_NS if options.full else COST_NS,
            FULL_TIME_NS if options.full else TIME_NS,
            device,
            seed=options.seed,
        )
        rows, results = scaling_rows(plan.scaled, scaling_plan, step)
        scaling["rows"] += rows
        suffix = "" if device == "cpu" else f" [{device}]"
        for name, result in results.items():
            timed_all[name + suffix] = result.timing
            if result.sdpa_timing is not None:
                timed_all[f"sdpa{' (causal)' if '(causal)' in name else ''}{suffix}"] = (
                    result.sdpa_timing
                )
            costs_all[name + suffix] = result.costs
    _accuracy_plots(accuracy, plan, options, folder)
    if timed_all:
        plot_scaling(timed_all, costs_all, folder / "scaling.png")
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
                },
                "gradients": {
                    "n": GRADIENT_N,
                    "loss": "sum(out * G), G N(0, 1) from PCG64([seed, N, 1]), in the dtype",
                },
                "scaling": {**asdict(scaling_plan), "inputs": "float32", "torch_threads": 1},
            },
            "seconds": time.perf_counter() - start,
        },
        "accuracy": accuracy,
        "gradients": gradients,
        "scaling": scaling,
        "random_features": random,
    }
    document["verdict"] = verdict(document)
    return document


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
    margins = [m for m in accuracy["margins"] if m["device"] == device]
    plot_margins(margins, dtype, folder / "margins.png")
    accuracy["plots"]["margins"] = "margins.png"


def verdict(document: dict[str, Any]) -> str:
    """ "pass" when every accuracy and gradient judgement, every cost growth and every
    sampler passes."""
    failed = [r for r in document["accuracy"]["rows"] if not r["passed"]]
    failed += [r for r in document["gradients"]["rows"] if not r["passed"]]
    failed += [r for r in document["scaling"]["rows"] if not r["cost_passed"]]
    failed += [s for s in document["random_features"].get("samplers", []) if not s["passed"]]
    return "fail" if failed else "pass"
