"""The report's accuracy sweep: every form of every spec in every dtype against the exact
reference, judged by the accuracy model (error in units of u s, bound, budget), and the
denominator margins of the same inputs. A decayed spec's decay and the delta rule's keys and
beta are those vet's checks draw (cases.Case.decay, families.case_arguments), given to the
reference, the golden forms and the kernel alike."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..accuracy.judgement import Judgement
from ..cases import Case
from ..families import case_arguments, family_of
from ..inputs import UNIT_ROUNDOFF
from ..rounding import gamma
from ..sampling import sample_projection
from ..specs import Spec
from ..under_test import Implementation, ImplementationFailure

Row = dict[str, Any]


@dataclass(frozen=True)
class Sweep:
    """What the accuracy sweep runs: heads of shape (B, H, N, d, dv) for each N, m = d rows
    of W for the Performer maps, every dtype, on `device`."""

    ns: tuple[int, ...]
    dtypes: tuple[str, ...]
    device: str
    b: int = 1
    h: int = 2
    d: int = 16
    dv: int = 16
    seed: int = 0


def sweep_inputs(spec: Spec, sweep: Sweep, n: int, dtype: str):
    """(q, k, v, W, decay): seeded N(0, 1) q, k, v and an orthogonal W, the same float64 draws
    for every dtype and spec (so dtypes and specs are compared on the same numbers), rounded
    to `dtype`; a decayed spec's decay that of the case of the sweep's shape and seed
    (families.case_arguments: Case.decay, None without one); the delta rule's q, k, v and
    its packed beta and gates that case's arguments as vet draws them
    (families.case_arguments: unit-norm keys, or raw ones where the kernel normalises them,
    beta ~ U(0, 1))."""
    t = getattr(torch, dtype)
    w = None
    if spec.info.needs_projection:
        w = torch.tensor(sample_projection(sweep.d, sweep.d, "orthogonal", sweep.seed))
        w = w.to(t).to(sweep.device)
    case = Case(sweep.b, sweep.h, n, sweep.d, sweep.dv, dtype, seed=sweep.seed, device=sweep.device)
    if not spec.sums_similarities:  # a family's own update: its inputs as vet draws them
        q, k, v, _, decay = case_arguments(case, spec)
        return q, k, v, w, decay
    rng = np.random.default_rng([sweep.seed, n])
    shapes = [(sweep.b, sweep.h, n, sweep.d)] * 2 + [(sweep.b, sweep.h, n, sweep.dv)]
    q, k, v = (torch.tensor(rng.standard_normal(s)).to(t).to(sweep.device) for s in shapes)
    return q, k, v, w, case_arguments(case, spec)[4]  # its family's draw: a decay, or none


def accuracy_rows(
    spec: Spec,
    impls: dict[str, Implementation],
    sweep: Sweep,
    step: Callable[[str], None],
) -> tuple[list[Row], list[Row]]:
    """Judge each implementation (by form name) of `spec` at every N and dtype of the sweep;
    the bound is computed once per input and shared by the forms, and its largest element
    is each row's bound_max (inf where vacuous). Returns (accuracy rows, margin rows); an
    implementation that raises gets a failed row with its message."""
    rows, margins = [], []
    for n in sweep.ns:
        for dtype in sweep.dtypes:
            q, k, v, w, decay = sweep_inputs(spec, sweep, n, dtype)
            judgement = Judgement.of(q, k, v, w, spec, decay)
            where = {"device": sweep.device, "spec": str(spec), "n": n, "dtype": dtype}
            for form, impl in impls.items():
                try:
                    verdict = judgement(impl(q, k, v, w, decay))
                except ImplementationFailure as err:
                    rows.append({**where, "form": form, "passed": False, "error": str(err)})
                    continue
                figures = verdict.to_dict()
                del figures["spec"], figures["dtype"]  # in `where` already
                bound = judgement.bounds[verdict.dtype][1]  # 0/0 elements NaN, left out
                figures["bound_max"] = float(np.max(bound, where=~np.isnan(bound), initial=0))
                severity = None if verdict.passed else verdict.severity
                rows.append({**where, "form": form, **figures, "severity": severity})
            if n == max(sweep.ns):
                margins.append({**where, **denominator_margins(q, k, spec, w, decay)})
            step(f"{spec} N={n} {dtype}")
    return rows, margins


MARGIN_EDGES = tuple(np.linspace(-1.0, 1.0, 41).tolist())  # histogram bins of r
NO_DENOMINATOR = "unnormalised: the output has no denominator"


def denominator_margins(
    q: torch.Tensor,
    k: torch.Tensor,
    spec: Spec,
    w: torch.Tensor | None,
    decay: torch.Tensor | None = None,
) -> Row:
    """The relative margin r_i = D_i / sum_j |a_ij| of each row's denominator (eps = 0;
    a_ij the similarities times the decay's weights w_ij > 0, whose scale c cancels),
    from the inputs (already rounded to their dtype) evaluated in float64: 1 when every
    similarity is positive, 0/0 where none is (relu, cosformer), below 1 when signed
    similarities cancel (performer-trig). Rounding in the inputs' dtype, of unit roundoff
    u, can flip the sign of a computed denominator only where r_i < gamma_N(u) (Higham eq.
    3.5, a sum of N terms), and never where r_i = 1 (terms of one sign): those rows are "at
    risk". Returns counts, quantiles and a histogram of r over MARGIN_EDGES; for a spec
    without a denominator (unnormalised, the delta rule) {"not_applicable": why}."""
    if not spec.normalize:
        return {"not_applicable": NO_DENOMINATOR}
    w64 = None if w is None else w.double()
    # rows scaled by e^shift; the decay's weights w_ij in them
    weights, _ = family_of(spec).weights(q.double(), k.double(), spec, w64, decay)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (weights.sum(dim=-1) / weights.abs().sum(dim=-1)).cpu().numpy().ravel()
    defined = r[~np.isnan(r)]
    threshold = gamma(k.shape[-2], UNIT_ROUNDOFF[str(q.dtype).removeprefix("torch.")])
    levels = (0.01, 0.1, 0.5) if defined.size else ()
    return {
        "rows": int(r.size),
        "zero_over_zero": int(np.isnan(r).sum()),
        "non_positive": int(np.sum(defined <= 0)),
        "at_risk": int(np.sum((defined > 0) & (defined < min(threshold, 1.0)))),
        "risk_threshold": None if math.isinf(threshold) else threshold,
        "min": float(defined.min()) if defined.size else None,
        "quantiles": {f"p{round(100 * p)}": float(np.quantile(defined, p)) for p in levels},
        "histogram": np.histogram(defined, bins=MARGIN_EDGES)[0].tolist(),
    }
