"""Options of the property suite and the implementations it runs over.

Without --impl every test runs over every built-in implementation (each spec, causal and
not, in each of its forms; on CPU, and on CUDA when available). With
`--impl MODULE:FN --feature-map NAME [--causal] [--eps E] [--layout bnhd]` it runs over
that one implementation instead (importable from the working directory or PYTHONPATH, or
`path/to/file.py:fn`); `--impl ADAPTER` over a third-party library's, `--form FORM
--feature-map NAME ...` over one built-in form. An implementation named so is judged on
typical inputs (`--fail-on stress` or `extreme` for more, `--strict-accuracy` for every
regime with relatively accurate elu features); the built-in forms on every regime. Its
backward is judged with `--grad` (as vet's; the built-in forms' always), the long-context
property up to `--long N` (default 2^16; 0 skips it). Those options come from
linattn_verify's pytest plugin (linattn_verify/pytest_plugin.py), which the root
conftest.py loads.
"""

from __future__ import annotations

from collections.abc import Callable

import property_helpers
import pytest
import torch

from linattn_verify.checks import GRAD_CHECKS, STATE_CHECKS, not_applicable
from linattn_verify.families import forms_of
from linattn_verify.pytest_plugin import drawn_regimes, implementation_under_test, run_values
from linattn_verify.specs import FEATURE_MAPS, Spec
from linattn_verify.under_test import DECLARED, Implementation, resolve


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("linattn-verify")
    group.addoption(
        "--full-grid",
        action="store_true",
        help="scaling: time every built-in form over N = 2^8 ... 2^16 (use with "
        "--benchmark-enable --benchmark-json=PATH); default: a small grid",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "check(name): the property test runs check `name`")
    config.addinivalue_line("markers", "builtin_only: skipped under --impl")
    config.stash[_IMPL] = implementation_under_test(config)
    property_helpers.DRAWN.update(
        regimes=drawn_regimes(config),
        features="relative" if config.getoption("--strict-accuracy") else "standard",
    )


_IMPL = pytest.StashKey[Implementation | None]()


def _chosen_or(config: pytest.Config, built_in: Callable[[], list[Implementation]]):
    """--impl (or --form) when given, else the built-in implementations."""
    chosen = config.stash[_IMPL]
    return [chosen] if chosen is not None else built_in()


def _specs(name: str) -> tuple[Spec, Spec]:
    """The non-causal and causal spec of a map, as its kernels use it: identity features
    unnormalised (RetNet, simple GLA), every other map normalised."""
    normalize = name != "identity"
    return Spec(name, normalize=normalize), Spec(name, causal=True, normalize=normalize)


def implementations(config: pytest.Config) -> list[Implementation]:
    """--impl, or every built-in spec and form."""
    return _chosen_or(config, lambda: [
        resolve(form=form, spec=spec)
        for name in FEATURE_MAPS
        for spec in _specs(name)
        for form in forms_of(spec)
    ])  # fmt: skip


def stateful(config: pytest.Config) -> list[Implementation]:
    """--impl, or the built-in forms that carry a state (for the state checks)."""
    return _chosen_or(config, lambda: [
        resolve(form=form, spec=_specs(name)[1], state=DECLARED)
        for name in FEATURE_MAPS
        if not _specs(name)[1].no_state
        for form in ("recurrent", "chunked")
    ])  # fmt: skip


def packed(config: pytest.Config) -> list[Implementation]:
    """--impl, or every built-in spec in its fast form taking packed batches (the varlen
    check; the other forms share the packing, attention_varlen)."""
    return _chosen_or(config, lambda: [
        resolve(spec=spec, varlen=True) for name in FEATURE_MAPS for spec in _specs(name)
    ])  # fmt: skip


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `impl` (and `device`) for tests marked check(name), over the
    implementations the check applies to."""
    if "impl" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("check")
    name = marker.args[0] if marker else None
    pools = {"varlen": packed, **dict.fromkeys(STATE_CHECKS, stateful)}
    pool = pools.get(name, implementations)(metafunc.config)
    impls = [i for i in pool if not name or not not_applicable(name, i)]
    if marker and "impls_filter" in marker.kwargs:
        impls = [i for i in impls if marker.kwargs["impls_filter"](i)]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    params = [(i, d) for i in impls for d in devices]
    ids = [f"{i.test_id}-{d}" for i, d in params]
    metafunc.parametrize(("impl", "device"), params, ids=ids)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.stash[_IMPL] is None:
        return
    skip = pytest.mark.skip(reason="measures the built-in forms only (vet measures --impl)")
    backward = pytest.mark.skip(reason="the backward of --impl is judged with --grad")
    for item in items:
        if item.get_closest_marker("builtin_only"):
            item.add_marker(skip)
        check = item.get_closest_marker("check")
        if check and check.args[0] in GRAD_CHECKS and not run_values(config)["grad"]:
            item.add_marker(backward)
