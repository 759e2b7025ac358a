"""assert_linear_attention and the pytest plugin, as another project would use them."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import linattn_verify as lv
from linattn_verify import testing
from linattn_verify.testing import assert_linear_attention
from tests.zoo.broken import _widen, float32_output
from tests.zoo.decay import _gamma_log_weights


def test_assert_linear_attention_passes_a_correct_kernel():
    def my_attention(q, k, v):
        return lv.attention(q, k, v, "elu", causal=True, form="chunked", chunk_size=8)

    report = assert_linear_attention(
        my_attention, "elu", causal=True, dtypes=("float32",), longest=0
    )
    assert report.verdict == "pass"
    assert "causality" in {row["name"] for row in report.rows}


def test_assert_linear_attention_raises_with_the_summary():
    headline = r"wrong on typical inputs: contract: dtype torch.float32"
    with pytest.raises(AssertionError, match=headline):
        assert_linear_attention(float32_output, "elu", dtypes=("float16",), longest=0)


def test_a_failure_in_a_users_pytest_shows_the_summary_not_our_source(tmp_path):
    """Issue 51, item 5: pytest hides assert_linear_attention's frame (__tracebackhide__):
    the user's test line and the summary, none of the suite's own source."""
    (tmp_path / "test_mine.py").write_text(
        "import linattn_verify as lv\n"
        "from linattn_verify.testing import assert_linear_attention\n\n"
        "def in_float32(q, k, v):\n"
        "    return lv.attention(q.float(), k.float(), v.float(), 'elu')\n\n"
        "def test_mine():\n"
        "    assert_linear_attention(in_float32, 'elu', dtypes=('float16',), longest=0)\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "wrong on typical inputs: contract" in run.stdout, run.stdout
    assert "assert_linear_attention(in_float32" in run.stdout
    assert "given = locals()" not in run.stdout and "vet_in_process" not in run.stdout


def _retention(q, k, v, gamma, initial_state=None, state_decayed=True):
    """RetNet's retention (Sun et al. 2023, eq. 5-7), the parallel form continuing a state:
    out_i = d^-1/2 (sum_(j<=i) gamma^(i-j) (q_i . k_j) v_j + gamma^(i+1) q_i S_0) and
    S_N = gamma^N S_0 + sum_j gamma^(N-1-j) k_j v_j^T, in float32 (float64 for float64).
    state_decayed=False: the rows see S_0 undecayed (q_i S_0)."""
    qc, kc, vc = _widen(q, k, v)
    n, d = q.shape[-2:]
    lg = torch.log(gamma.to(qc.dtype))[:, None]  # (H, 1)
    steps = torch.arange(n, dtype=qc.dtype, device=q.device)
    out = ((qc @ kc.mT) * torch.exp(_gamma_log_weights(gamma, n, qc.dtype))) @ vc
    state = (kc * torch.exp((n - 1 - steps) * lg)[..., None]).mT @ vc
    if initial_state is not None:
        s0 = initial_state.to(qc.dtype)
        seen = torch.exp((steps + 1) * lg)[..., None] if state_decayed else 1.0
        out = out + seen * (qc @ s0)
        state = state + torch.exp(n * lg)[..., None] * s0
    return (out * d**-0.5).to(q.dtype), state.to(q.dtype)


def retention(q, k, v, gamma, initial_state=None):
    return _retention(q, k, v, gamma, initial_state)


def retention_initial_state_undecayed(q, k, v, gamma, initial_state=None):
    """BUG: the rows see the initial state undecayed (fla #351's class)."""
    return _retention(q, k, v, gamma, initial_state, state_decayed=False)


# a retention kernel's claim: unnormalised, scale d^-1/2, a constant decay, its state S
RETENTION = {"causal": True, "normalize": False, "scale": "d^-0.5", "decay": "constant",
             "state": "S", "cost": "quadratic", "dtypes": ("float32",), "longest": 0}  # fmt: skip


def test_assert_linear_attention_passes_a_retention_kernel():
    report = assert_linear_attention(retention, "identity", **RETENTION)
    assert report.verdict == "pass", report.summary()
    ran = {row["name"] for row in report.rows if row["status"] != "not applicable"}
    assert {"reference", "decay", "state-split", "initial-state", "final-state"} <= ran


def test_assert_linear_attention_rejects_a_broken_retention_kernel():
    with pytest.raises(AssertionError, match="initial-state"):
        assert_linear_attention(retention_initial_state_undecayed, "identity", **RETENTION)


def test_assert_linear_attention_hands_grad_and_longest_to_vet(monkeypatch):
    seen = []

    def vet_in_process(impl, options):  # records what vet would run, passes
        seen.append(options)
        return SimpleNamespace(failed=[])

    monkeypatch.setattr(testing, "vet_in_process", vet_in_process)
    assert_linear_attention(retention, "identity", **RETENTION | {"grad": True})
    assert seen[0].grad and seen[0].longest == 0


def test_the_plugin_adds_the_impl_options_outside_this_repository(tmp_path):
    """The pytest11 entry point: --impl is there in a directory without our conftest."""
    (tmp_path / "test_uses_it.py").write_text(
        "def test_named(attention_under_test):\n"
        "    assert attention_under_test.spec.feature_map == 'relu'\n"
    )
    target = "linattn_verify:attention"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
         "--impl", target, "--feature-map", "relu"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_reproduce_lines_load_the_kernel_from_the_users_working_directory(tmp_path, monkeypatch):
    """Issue 51, item 5: a kernel in a module a fresh interpreter here cannot import (a test
    module pytest put on sys.path) is named by its file; an importable one by its module."""
    from linattn_verify.under_test.names import importable_name
    from tests import vet_targets

    (tmp_path / "my_kernels_elsewhere.py").write_text("def attn(q, k, v):\n    return v\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_kernels_elsewhere

    named = importable_name(my_kernels_elsewhere.attn)
    assert named == f"{tmp_path}/my_kernels_elsewhere.py:attn"
    command = [sys.executable, "-m", "linattn_verify", "check", "contract", "--impl", named]
    done = subprocess.run([*command, "--feature-map", "elu"], capture_output=True, text=True)
    assert done.returncode == 0 and "contract: pass" in done.stdout, done.stderr
    assert importable_name(vet_targets.elu_linear) == "tests.vet_targets:elu_linear"
