"""Packed batches (--varlen): the offsets' validation, the built-in forms' packed batches,
and the contract (declaring, calling). The check itself is judged by the zoo
(tests/zoo/varlen.py)."""

from __future__ import annotations

import shlex

import pytest
import torch

from linattn_verify.cases import Case
from linattn_verify.cli import main
from linattn_verify.families import attention, attention_varlen
from linattn_verify.inputs import check_cu_seqlens
from linattn_verify.specs import SpecError
from linattn_verify.under_test import ImplementationFailure, resolve

BAD_OFFSETS = {
    "not starting at 0": ([1, 4, 6], "start at 0"),
    "decreasing": ([0, 4, 3, 6], "not decrease"),
    "not ending at T": ([0, 4, 5], "end at the 6 packed tokens"),
    "floats": (torch.tensor([0.0, 6.0]), "integer"),
    "2-d": (torch.tensor([[0, 6]]), "1-d"),
    "one offset": ([0], "at least two"),
}


@pytest.mark.parametrize(("offsets", "message"), BAD_OFFSETS.values(), ids=BAD_OFFSETS.keys())
def test_bad_offsets_are_named(offsets, message):
    cu = offsets if isinstance(offsets, torch.Tensor) else torch.tensor(offsets)
    with pytest.raises(SpecError, match=message):
        check_cu_seqlens(cu, 6)
    q = torch.randn(1, 2, 6, 3)
    with pytest.raises(SpecError, match=message):
        attention_varlen(q, q, q, cu_seqlens=cu)


@pytest.mark.parametrize(
    ("name", "causal", "form"),
    [("elu", True, "chunked"), ("cosformer", False, "linear"), ("softmax", True, "quadratic")],
)
def test_a_packed_batch_of_the_built_in_forms_is_each_sequence_by_itself(name, causal, form):
    q, k, v = (torch.randn(1, 2, 11, 4, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 5, 5, 6, 11])
    out = attention_varlen(q, k, v, cu, feature_map=name, causal=causal, form=form)
    for a, b in ((0, 5), (5, 6), (6, 11)):
        own = attention(q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], name, causal, form)
        torch.testing.assert_close(out[..., a:b, :], own, rtol=1e-12, atol=1e-14, equal_nan=True)


def test_declaring_a_packed_batch_that_cannot_be_is_a_spec_error():
    with pytest.raises(SpecError, match="takes no packed batch"):
        resolve("fla.linear-attn-naive", varlen=True, load=False)
    with pytest.raises(SpecError, match="not supported"):
        resolve(None, feature_map="elu", causal=True, form="chunked", varlen=True,
                state="declared")  # fmt: skip


def test_a_packed_output_of_the_wrong_shape_is_an_implementation_failure():
    def whole_row_only(q, k, v, cu_seqlens=None):
        return attention(q, k, v, "elu")[..., :1, :]

    impl = resolve(whole_row_only, feature_map="elu", varlen=True)
    q = torch.randn(1, 2, 6, 3)
    with pytest.raises(ImplementationFailure, match="for a packed batch, expected"):
        impl.call_varlen(q, q, q, None, torch.tensor([0, 6]))


def test_the_reproduce_command_names_the_packed_batch(capsys):
    impl = resolve(None, feature_map="elu", causal=True, form="recurrent", varlen=True)
    words = shlex.split(impl.reproduce("varlen", Case(1, 2, 9, 4, 3, "float32")))
    assert "--varlen" in words
    assert main(words[3:]) == 0
    assert "varlen: pass" in capsys.readouterr().out
