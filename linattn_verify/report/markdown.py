"""report.md from the JSON document: the summary table first, then one section per part."""

from __future__ import annotations

import math
from typing import Any

from ..accuracy.verdict import BUDGET_FLOOR, K_BUDGET
from ..checks.long_context import FALSE_FAILURE
from ..stats.decide import ALPHA, Z_TWO_SIDED
from .long import (
    FULL_LONG_NS,
    FULL_LONGEST,
    LONG_SPECS,
    QUADRATIC_LONGEST,
    power_of_2,
)
from .notes import NOTES, filled

Row = dict[str, Any]

# The output budget as accuracy.verdict builds it (budget, attainable_floor), in words
BUDGET_RULE = (
    f"{K_BUDGET:g} x the larger of the golden implementation's error and the typical error "
    f"of a correct evaluation, {BUDGET_FLOOR:g} x max(1, sqrt(n) u_c / u) units for a sum of "
    "n = m + N + 1 terms in the golden's compute precision u_c, float32 or float64 (Higham & "
    f"Mary 2019); where the denominator's terms cancel, at least {K_BUDGET:g} x sqrt(n) u_c / "
    "u x kappa |out| / s at that element"
)
# what attainable_floor adds for the specs of --impl that are not plain
DECAYED_BUDGET_RULE = (
    "; with a decay at least the error of a chunked kernel's prefix sums of the log-gates "
    "(accuracy/verdict.py, decay_floor), and for the delta rule n = N (d + 5) roundings"
)


def _sweep_arguments(document: dict[str, Any], section: str) -> list[tuple[str, str]]:
    """How `section`'s sweep drew the decay and the delta rule's arguments, where it has
    such a spec (report.build describes them in the JSON then)."""
    sweep = document["environment"]["sweep"][section]
    return [(key, sweep[key]) for key in NOTES if key in sweep]


def _budget_rule(document: dict[str, Any]) -> str:
    """BUDGET_RULE, and DECAYED_BUDGET_RULE where the inputs have a decay or are the delta
    rule's."""
    return BUDGET_RULE + DECAYED_BUDGET_RULE * bool(_sweep_arguments(document, "accuracy"))


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


def _table(header: list[str], rows: list[list[str]], right: int = 0) -> list[str]:
    """A Markdown table; the last `right` columns right-aligned."""
    align = ["---"] * (len(header) - right) + ["---:"] * right
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _cell(row: Row) -> str:
    """max / p99 (budget at the worst element) of one judgement, or why there is none."""
    if "error" in row:
        return f"**{row['error']}**"
    budget = row["budget"]
    if row["passed"] and budget is not None and (row.get("budget_at_worst") or 0.0) > budget:
        budget = row["budget_at_worst"]  # raised where the denominator cancels
    text = f"{_num(row['max_error'])} / {_num(row['p99_error'])} ({_num(budget)})"
    return text if row["passed"] else f"**{text} FAIL**"


def summary_table(rows: list[Row], gradients: list[Row]) -> list[str]:
    """spec x form rows, one column per dtype, at the largest N of each device; the
    gradients' verdict over the dtypes in the last column."""
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    keys = list(dict.fromkeys((r["device"], r["spec"], r["form"]) for r in rows))
    top = {device: max(r["n"] for r in rows if r["device"] == device) for device, _, _ in keys}
    by_key = {
        (r["device"], r["spec"], r["form"], r["dtype"]): r
        for r in rows
        if r["n"] == top[r["device"]]
    }
    devices = len({k[0] for k in keys}) > 1
    body = []
    for device, spec, form in keys:
        cells = [by_key.get((device, spec, form, t)) for t in dtypes]
        failed = [t for t, c in zip(dtypes, cells, strict=True) if c and not c["passed"]]
        verdict = "FAIL (" + ", ".join(failed) + ")" if failed else "pass"
        judged = [
            g for g in gradients if (g["device"], g["spec"], g["form"]) == (device, spec, form)
        ]
        bad = [g["dtype"] for g in judged if not g["passed"]]
        grads = "–" if not judged else ("**FAIL (" + ", ".join(bad) + ")**" if bad else "pass")
        name = [f"{spec} [{device}]" if devices else spec, form]
        body.append(name + [_cell(c) if c else "–" for c in cells] + [verdict, grads])
    return _table(["spec", "form", *dtypes, "verdict", "gradients"], body)


def _accuracy_vs_n(document: dict[str, Any]) -> list[str]:
    rows = document["accuracy"]["rows"]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    ns = sorted({r["n"] for r in rows})
    device = rows[0]["device"]
    forms = list(dict.fromkeys((r["spec"], r["form"]) for r in rows if r["device"] == device))
    errors = {
        (r["spec"], r["form"], r["dtype"], r["n"]): r.get("max_error")
        for r in rows
        if r["device"] == device
    }
    body = [
        [spec, form]
        + [" → ".join(_num(errors.get((spec, form, t, n))) for n in ns) for t in dtypes]
        for spec, form in forms
    ]
    return [
        "## Accuracy vs N",
        "",
        f"Max error in units of u s at N = {', '.join(map(str, ns))} ({device}). A correct "
        "algorithm's error grows at most like the bound's gamma_N: slowly, and not at all "
        "for blocked and pairwise sums."
        + "".join(f" {NOTES[k].title}: {v}." for k, v in _sweep_arguments(document, "accuracy")),
        "",
        "![max error vs N per feature map and dtype: each fast form with its budget and "
        f"a-priori bound]({document['accuracy']['plots']['error_vs_n']})",
        "",
        *_table(["spec", "form", *dtypes], body),
    ]


LONG_CURVES = (  # per-N figures of the long rows, shown below each spec's forms
    ("golden_max_error", "golden"),
    ("budget", "budget"),
    ("bound_max", "bound"),
    ("probabilistic_bound_max", "probabilistic bound"),
    ("rows_left_to_bound", "rows left to the bound"),  # shown where not 0
)


def _long_context(document: dict[str, Any]) -> list[str]:
    long = document.get("long_context")
    if long is None:  # a report of an earlier version
        return []
    head = ["## Accuracy vs N at long sequences", ""]
    rows = long["rows"]
    if not rows:
        dtypes = document["environment"]["options"]["dtypes"]
        why = (
            "float64 only (the certified reference is within 2^-34 s, not 2^-53)"
            if set(dtypes) == {"float64"}
            else "softmax only (its a-priori bound is evaluated in arb alone, quadratic work)"
        )
        return [*head, f"Not run: {why}."]
    sweep = document["environment"]["sweep"]["long_context"]
    device = rows[0]["device"]
    rows = [r for r in rows if r["device"] == device]
    dtypes = _unique(rows, "dtype")
    ns_of = {s: sorted({r["n"] for r in rows if r["spec"] == s}) for s in _unique(rows, "spec")}
    body = []
    for spec, ns in ns_of.items():
        at = {(r["form"], r["dtype"], r["n"]): r for r in rows if r["spec"] == spec}
        first = {(t, n): r for (_, t, n), r in reversed(at.items())}  # per-N figures
        for form in dict.fromkeys(f for f, _, _ in at):
            chains = [" → ".join(_long_cell(at.get((form, t, n))) for n in ns) for t in dtypes]
            body.append([spec, form, *chains])
        for key, what in LONG_CURVES:
            if key == "rows_left_to_bound" and not any(r.get(key) for r in first.values()):
                continue
            chains = [" → ".join(_bound(first.get((t, n)), key) for n in ns) for t in dtypes]
            body.append([spec, f"*{what}*", *chains])
    by_range: dict[str, list[str]] = {}  # specs grouped by their N
    for spec, ns in ns_of.items():
        by_range.setdefault(f"N = {power_of_2(ns[0])} to {power_of_2(ns[-1])}", []).append(spec)
    covered = "; ".join(f"{', '.join(specs)} at {ns}" for ns, specs in by_range.items())
    options = document["environment"]["options"]
    share = ""
    if not options["full"] and not options["impl"]:
        share = (
            f" Without --full the section covers {', '.join(LONG_SPECS)} where the report "
            "has them (else its first spec, non-causal and causal); --full covers every spec "
            f"of the report but softmax, to N = {power_of_2(FULL_LONG_NS[-1])} for those and "
            f"to {power_of_2(FULL_LONGEST)} for the others."
        )
    if "softmax" in options["specs"] and not options["impl"]:
        share += (
            " Not softmax: its a-priori bound is evaluated in arb alone, quadratic work in ball "
            "arithmetic (about a minute per case at N = 2^12)."
        )
    share += "".join(filled(NOTES[key].long_note) for key in NOTES if key in sweep)
    left_out = [t for t in options["dtypes"] if t not in dtypes]
    if left_out:
        share += (
            f" Not judged here: {', '.join(left_out)} (the certified reference is within "
            "2^-34 s, not 2^-53; see Accuracy vs N)."
        )
    text = [
        f"Every form against the certified reference ({device}) for {covered}.{share}",
        "",
        "Inputs: the long-context check's typical regime (keys sharing a direction, values "
        f"N(1, 1)), B = H = 1, d = dv = {sweep['shape_B_H_d_dv'][2]}, one draw per spec and "
        "dtype at its longest N and its prefixes; quadratic-cost forms up to N = "
        f"{power_of_2(QUADRATIC_LONGEST)}. Each cell gives a figure at each N in turn, in "
        "units of u s:",
        "",
        "- a form: its max error; **FAIL** where outside the bound or over the budget, which "
        "fails the report's verdict;",
        "- *golden*: the golden linear form's max error;",
        f"- *budget*: {_budget_rule(document)}, on the rows whose denominator a float32 "
        "evaluation resolves, as in the long-context check;",
        "- *bound*: the largest element of Higham's deterministic bound (∞: vacuous, the "
        "denominator's relative error bound reaching 1);",
        "- *probabilistic bound*: that of the smaller of it and Higham & Mary's at a false-"
        f"failure probability of 1e{math.log10(FALSE_FAILURE):.0f} per case: the bound a form "
        "is judged against;",
        "- *rows left to the bound* (where there are any): rows the budget does not compare, "
        "whose denominators cancel (performer-trig, taylor) so that correct evaluations "
        "differ there by chance beyond any fixed budget.",
        "",
    ]
    plots = [f"![long sequences, {t}]({name})" for t, name in long["plots"].items()]
    return [
        *head,
        *text,
        *[line for image in plots for line in (image, "")],
        *_table(["spec", "form", *dtypes], body),
    ]


def _unique(rows: list[Row], key: str) -> list[Any]:
    return list(dict.fromkeys(r[key] for r in rows))


def _long_cell(row: Row | None) -> str:
    """One form's max error at one N: '–' where not run, FAIL in bold, the failure's text."""
    if row is None:
        return "–"
    if "error" in row:
        return f"**{row['error']}**"
    text = "∞" if row["max_error"] is None else _num(row["max_error"])
    return text if row["passed"] else f"**{text} FAIL**"


def _bound(row: Row | None, key: str) -> str:
    """A per-N figure: '–' where absent, ∞ where null (inf in the JSON: vacuous)."""
    if row is None or key not in row:
        return "–"
    return "∞" if row[key] is None else _num(row[key])


def _margins(document: dict[str, Any]) -> list[str]:
    margins = document["accuracy"]["margins"]
    device = margins[0]["device"]
    margins = [m for m in margins if m["device"] == device]
    not_applicable = {m["spec"]: m["not_applicable"] for m in margins if "not_applicable" in m}
    margins = [m for m in margins if "not_applicable" not in m]
    why = [f"Not applicable to {spec}: {text}." for spec, text in not_applicable.items()]
    if not margins:
        return ["## Positivity margins", "", *why]
    signed = [m for m in margins if m["min"] is None or m["min"] < 1 or m["zero_over_zero"]]
    positive = list(dict.fromkeys(m["spec"] for m in margins if m not in signed))
    body = [
        [
            m["spec"],
            m["dtype"],
            str(m["rows"]),
            _num(m["min"]),
            _num(m["quantiles"].get("p1")),
            str(m["non_positive"]),
            str(m["zero_over_zero"]),
            str(m["at_risk"]),
        ]
        for m in signed
    ]
    lines = [
        "## Positivity margins",
        "",
        "Relative margin of each row's denominator, r = D_i / sum_j |a_ij| (eps = 0; a "
        "decayed spec's a_ij weighed by its decay; inputs rounded to the dtype, evaluated in "
        "float64) at the largest N: 1 where every "
        "similarity is positive, 0/0 where none is, below 1 where signed similarities "
        "cancel. A row is at risk when 0 < r < gamma_N(u) and r < 1: rounding in that dtype "
        "can flip its denominator's sign (with gamma_N(u) >= 1, as for bfloat16 at N = 256, "
        "nothing is certified).",
        "",
        "![denominator margins of the specs with r < 1]"
        f"({document['accuracy']['plots']['margins']})",
        "",
    ]
    if positive:
        lines += [f"r = 1 on every row in every dtype: {', '.join(positive)}.", ""]
    if why:
        lines += [*why, ""]
    if body:
        header = ["spec", "dtype", "rows", "min r", "p1 r", "r <= 0", "0/0", "at risk"]
        lines += _table(header, body, right=6)
    return lines


def _gradients(document: dict[str, Any]) -> list[str]:
    rows = document["gradients"]["rows"]
    if not rows:
        return ["## Gradients", "", "Not run (--no-grad)."]
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    device = rows[0]["device"]
    cells = {(r["spec"], r["form"], r["dtype"]): r for r in rows if r["device"] == device}
    body = []
    for spec, form in dict.fromkeys((r["spec"], r["form"]) for r in rows):
        line = [spec, form]
        for dtype in dtypes:
            r = cells.get((spec, form, dtype))
            if r is None or "error" in r or "skipped" in r:
                line.append("–" if r is None else r.get("skipped") or f"**{r['error']}**")
                continue
            errors = r["max_error"]  # dq, dk, dv, and the decay's dg, dbeta where judged
            share = max(
                float("inf") if e is None else e / r["budget"][n] for n, e in errors.items()
            )
            text = " / ".join("inf" if errors[n] is None else _num(errors[n]) for n in "qkv")
            text += "".join(
                f", d{n} {'inf' if e is None else _num(e)}"
                for n, e in errors.items()
                if n not in ("q", "k", "v")
            )
            text += f" ({share:.2f} of budget)"
            line.append(text if r["passed"] else f"**{text} FAIL**")
        body.append(line)
    n = rows[0]["n"]
    return [
        "## Gradients",
        "",
        f"The backward of every form for L = sum(out * G) at N = {n} ({device}), against the "
        "exact reference gradients: max error of dq / dk / dv (and, named, a gates spec's "
        "dg, the delta rule's dbeta and dg: its decay is a leaf) in units of u M (M: the "
        "magnitude of what each gradient element is computed from), and the largest share "
        f"of its budget ({K_BUDGET:g} x the larger of the golden forms' error in that tensor "
        "and one rounding of the exact tensor times the typical number of roundings, max(1, "
        "sqrt(n) u_c / u)) any of the three uses. The a-priori bound gamma_n is "
        "vacuous in bfloat16 at these sizes (n u >= 1): there only the budget judges.",
        "",
        *_table(["spec", "form", *dtypes], body),
    ]


def _random_features(document: dict[str, Any]) -> list[str]:
    rf = document["random_features"]
    if "skipped" in rf:
        return ["## Random features", "", f"Not run: {rf['skipped']}."]
    body, details = [], []
    for sampler in rf["samplers"]:
        by_check: dict[str, list[Row]] = {}
        for c in sampler["checks"]:
            by_check.setdefault(c["name"], []).append(c)
        for name, checks in by_check.items():
            passed = sum(c["status"] == "pass" for c in checks)
            z = [abs(c["figures"]["z"]) for c in checks if "z" in c["figures"]]
            body.append(
                [sampler["sampler"], name, f"{passed} of {len(checks)}", _num(max(z, default=None))]
            )
        details += [f"- {c['status']} {c['name']}: {c['detail']}" for c in sampler["checks"]]
    lines = [
        "## Random features",
        "",
        "The project's projection samplers through the sampler panel (stats/panel.py): each "
        f"assertion is a z-test at false-failure probability {ALPHA:g} (|z| <= {Z_TWO_SIDED:.3g}).",
        "",
        *_table(["sampler", "check", "passed", "max abs z"], body, right=2),
        "",
        "<details><summary>every assertion</summary>",
        "",
        *details,
        "",
        "</details>",
        "",
    ]
    mse = rf["mse_vs_m"]
    body = []
    for kind, data in mse.items():
        for name in ("iid", "orthogonal"):
            ratios = ", ".join(f"{t:.3f}" for t in data[name]["ratio"])
            body.append([kind, name, ratios])
    ms = ", ".join(map(str, next(iter(mse.values()))["m"]))
    lines += [
        f"MSE of K_hat against m = {ms}: empirical / exact theory (Lemma 2 of Choromanski "
        "et al. 2021 for iid rows, the exact orthogonal MSE for orthogonal rows).",
        "",
        f"![MSE vs m]({rf['plots']['mse_vs_m']})",
        "",
        *_table(["kind", "rows", "empirical / theory at each m"], body),
    ]
    if "attention_error_vs_m" in rf:
        lines += ["", f"![attention error vs m]({rf['plots']['attention_error_vs_m']})"]
    return lines


def _scaling(document: dict[str, Any]) -> list[str]:
    scaling = document["scaling"]
    body = []
    for r in scaling["rows"]:
        name = r["implementation"] + ("" if r["device"] == "cpu" else f" [{r['device']}]")
        if "error" in r:
            body.append([name, r["expected"], f"**{r['error']}**", "–", "–", "–", "**FAIL**"])
            continue
        time = "–"
        if "time_slope" in r:
            time = f"N^{r['time_slope']:.2f} ({r['time_status']})"
        crossover = r.get("crossover_vs_sdpa")
        body.append(
            [
                name,
                r["expected"],
                "not counted" if r["flops_slope"] is None else f"N^{r['flops_slope']:.3f}",
                f"N^{r['bytes_slope']:.3f}",
                time,
                "–" if "time_slope" not in r else str(crossover or "none measured"),
                "pass" if r["cost_passed"] else "**FAIL**",
            ]
        )
    ns = document["environment"]["sweep"]["scaling"]["cost_ns"]
    lines = [
        "## Scaling",
        "",
        "FLOPs and peak live bytes counted exactly (torch dispatch) over N = "
        + ", ".join(map(str, ns))
        + ", slopes fitted on the larger half; wall time on one torch thread (median of the "
        "repeats, with a noise gate), and the N from which the form beats torch's SDPA."
        + "".join(f" {NOTES[k].title}: {v}." for k, v in _sweep_arguments(document, "scaling")),
        "",
    ]
    if "scaling" in scaling["plots"]:
        lines += [
            "![counted FLOPs and peak bytes against N per feature map, and time where "
            f"timed]({scaling['plots']['scaling']})",
            "",
        ]
    header = [
        "implementation",
        "expected",
        "FLOPs",
        "peak bytes",
        "time",
        "beats SDPA from N",
        "cost",
    ]
    return lines + _table(header, body)


def _environment(document: dict[str, Any]) -> list[str]:
    env = document["environment"]
    packages = ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v)
    flags = (
        f"float32 matmul precision {env['float32_matmul_precision']}; TF32 matmul "
        f"{env['cuda_matmul_allow_tf32']}, cuDNN {env['cudnn_allow_tf32']}; reduced-precision "
        f"reductions fp16 {env['fp16_reduced_precision_reduction']}, bf16 "
        f"{env['bf16_reduced_precision_reduction']}"
    )
    return [
        "## Environment",
        "",
        f"- devices: {', '.join(env['devices'])} ({env['device_name']}); torch threads "
        f"{env['torch_threads']} (timings: 1)",
        f"- {flags}",
        f"- elu features' C kernel (native.c): {env['native_kernel']}",
        f"- Python {env['python']} on {env['platform']}; {packages}",
        f"- git {env['git'] or 'unknown'}; seed {env['seed']}; run took {env['seconds']:.0f} s",
    ]


def counts(document: dict[str, Any]) -> str:
    """How many accuracy, long-sequence and gradient judgements pass."""
    parts = []
    for key, what in (
        ("accuracy", "accuracy"),
        ("long_context", "long-sequence"),
        ("gradients", "gradient"),
    ):
        if key not in document:  # a report of an earlier version
            continue
        rows = document[key]["rows"]
        failed = sum(not r["passed"] for r in rows)
        parts.append(f"{len(rows) - failed} of {len(rows)} {what} judgements pass")
    return "; ".join(parts)


def render(document: dict[str, Any], comparison: list[str] | None = None) -> str:
    """The whole report.md."""
    rows, gradients = document["accuracy"]["rows"], document["gradients"]["rows"]
    lines = [
        "# linattn-verify report",
        "",
        f"Verdict: **{document['verdict']}**. {counts(document)}. Errors are in units of "
        "u s (linattn-verify's docs/accuracy.md): each cell is max / p99 (the budget at the "
        "worst element) at the "
        f"largest N, the budget {_budget_rule(document)}; the last column is the gradients' "
        "verdict (see Gradients).",
        "",
        *summary_table(rows, gradients),
        "",
    ]
    if comparison:
        lines += [*comparison, ""]
    sections = (
        _accuracy_vs_n,
        _long_context,
        _margins,
        _gradients,
        _random_features,
        _scaling,
        _environment,
    )
    for section in sections:
        lines += [*section(document), ""]
    return "\n".join(lines)
