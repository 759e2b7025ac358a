"""The long-context check's inputs for decayed specs and the delta rule (checks/long_context.py
inputs, Family.long_arguments): the decay's memory is what the check claims, thousands of
tokens on one head and longer than the sequence on the other, so that neither kills the
state within a few tokens nor leaves it undecayed."""

from __future__ import annotations

import math

import pytest
import torch

from linattn_verify.checks.long_context import (
    MEMORIES,
    default_longest,
    inputs,
    not_applicable,
)
from linattn_verify.families.delta.inputs import delta_arguments
from linattn_verify.specs import Spec
from linattn_verify.under_test import resolve

N = 2**14


def _spec(decay: str, **kw) -> Spec:
    return Spec("identity", causal=True, normalize=False, scale="d^-0.5", decay=decay, **kw)


def _decay(decay: str) -> torch.Tensor:
    return inputs(_spec(decay), N, 1, 2, 16, "float64", 0, "cpu")[4]


def test_constant_decay_keeps_each_heads_memory():
    gamma = _decay("constant")
    assert torch.allclose(-1 / torch.log(gamma), torch.tensor(MEMORIES, dtype=torch.float64))


@pytest.mark.parametrize("decay", ["gates", "channel-gates"])
def test_gates_have_the_mean_rate_of_each_heads_memory(decay: str):
    g = _decay(decay)
    assert g.shape == ((1, 2, N) if decay == "gates" else (1, 2, N, 16)) and (g <= 0).all()
    per_channel = g.reshape(2, N, -1)
    octaves = 2.0 ** -(torch.arange(per_channel.shape[-1]) % 4 - 1)
    for h, memory in enumerate(MEMORIES):
        rates = -per_channel[h].mean(dim=0) / (octaves if decay == "channel-gates" else 1)
        # the mean of N exponentials of rate 1/memory: relative sd 1/sqrt(N) = 0.8 %; six
        # standard deviations miss with probability 2e-9 per channel
        assert torch.allclose(rates * memory, torch.ones_like(rates), rtol=6 / math.sqrt(N))


def test_delta_inputs_are_unit_keys_and_beta_in_the_unit_interval():
    spec = Spec("identity", causal=True, normalize=False, scale="d^-0.5", delta_rule=True,
                decay="gates")  # fmt: skip
    _, k, _, _, packed = inputs(spec, 256, 1, 2, 16, "float64", 0, "cpu")
    assert torch.allclose(k.norm(dim=-1), torch.ones(1, 2, 256, dtype=torch.float64))
    beta = delta_arguments(spec, packed)["beta"]
    assert ((beta > 0) & (beta < 1)).all()


def test_every_decayed_spec_and_the_delta_rule_are_checked():
    for decay in ("constant", "gates", "channel-gates"):
        assert not_applicable(resolve(form="chunked", spec=_spec(decay)), ("float32",)) is None
    delta = resolve(form="chunked", spec=_spec("gates", delta_rule=True))
    assert not_applicable(delta, ("float32",)) is None
    assert default_longest(False, stepwise=True) < default_longest(False)
