"""One verdict on a sampler: the kernel-level checks on a fixed panel of inputs.

The panel puts each estimator at the largest norm of its regime (stats/checks.py), where a
wrong sampler shows most for the variance: |x + y| = 0.9 (positive, hyperbolic) and |x - y| = 1.5
(trig), along a coordinate axis (where entries of unit variance that are not Gaussian, e.g.
+-1, differ most) and along a generic direction.
At the defaults (d = 16, m = 64, R = 4096 replicates: 262144 rows) the power against the
biased samplers of tests/zoo/samplers.py is given and checked in tests/test_stats.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..cases import Pair
from ..results import CheckResult
from .checks import mse_formula, orthogonal_mse, unbiasedness
from .estimators import SamplerFailure, SamplerFn, draw_projections
from .moments import KINDS

CLAIMS = ("iid", "orthogonal")
DEFAULT_D = 16
DEFAULT_M = 64
DEFAULT_REPLICATES = 4096
PANEL_NORM = {"performer-positive": 0.9, "performer-hyperbolic": 0.9, "performer-trig": 1.5}


def panel(kind: str, d: int, norm: float | None = None) -> list[Pair]:
    """The inputs for `kind` in dimension d: |x + y| (|x - y| for trig) = norm, along e_1 and
    along a generic unit vector."""
    norm = PANEL_NORM[kind] if norm is None else norm
    axis = np.zeros(d)
    axis[0] = 1.0
    generic = np.cos(np.arange(1, d + 1) * 1.3)
    generic /= np.linalg.norm(generic)
    pairs = []
    for label, u in (("axis pair", axis), ("generic pair", generic)):
        if kind == "performer-trig":  # x - y = norm u, x.y = -norm^2 / 4
            pairs.append(Pair(norm / 2 * u, -norm / 2 * u, label))
        else:  # x + y = norm u, x.y = 0.24 norm^2
            pairs.append(Pair(0.6 * norm * u, 0.4 * norm * u, label))
    return pairs


def check_sampler(
    sampler: SamplerFn,
    claim: str = "iid",
    d: int = DEFAULT_D,
    m: int = DEFAULT_M,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    target: str | None = None,
) -> list[CheckResult]:
    """Every kernel-level check for a sampler claiming iid or orthogonal (chi(d)) rows:
    unbiasedness for the three estimators, then the iid MSE formula or the orthogonal MSE.
    A sampler that raises or returns a wrong shape gives one failed result. With `target`
    (module:fn), each result carries the command that reruns the panel."""
    if claim not in CLAIMS:
        raise ValueError(f"claim must be one of {', '.join(CLAIMS)}, got {claim!r}")
    try:
        w = draw_projections(sampler, m, d, replicates, seed)
    except SamplerFailure as err:
        results = [CheckResult("sampler", False, str(err))]
    else:
        second = mse_formula if claim == "iid" else orthogonal_mse
        results = []
        for kind in KINDS:
            results += [unbiasedness(kind, pair, w, claim) for pair in panel(kind, d)]
            results += [second(kind, pair, w) for pair in panel(kind, d)]
    if target is None:
        return results
    repro = (
        f"python -m linattn_verify random-features --sampler {target} --claim {claim} "
        f"--d {d} --m {m} --replicates {replicates} --seed {seed}"
    )
    return [replace(r, repro=repro) for r in results]
