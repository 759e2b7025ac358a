"""assert_linear_attention and the pytest plugin, as another project would use them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import linattn_verify as lv
from linattn_verify.testing import assert_linear_attention
from tests.zoo.broken import float32_output


def test_assert_linear_attention_passes_a_correct_kernel():
    def my_attention(q, k, v):
        return lv.attention(q, k, v, "elu", causal=True, form="chunked", chunk_size=8)

    report = assert_linear_attention(
        my_attention, "elu", causal=True, dtypes=("float32",), longest=0
    )
    assert report.verdict == "pass"
    assert "causality" in {row["name"] for row in report.rows}


def test_assert_linear_attention_raises_with_the_summary():
    with pytest.raises(AssertionError, match=r"wrong on typical inputs: contract\n.*float32"):
        assert_linear_attention(float32_output, "elu", dtypes=("float16",), longest=0)


def test_the_plugin_adds_the_impl_options_outside_this_repository(tmp_path):
    """The pytest11 entry point: --impl is there in a directory without our conftest."""
    (tmp_path / "test_uses_it.py").write_text(
        "def test_named(attention_under_test):\n"
        "    assert attention_under_test.spec.feature_map == 'relu'\n"
    )
    target = "linattn_verify.implementations:attention"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
         "--impl", target, "--feature-map", "relu"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
