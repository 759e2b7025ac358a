"""The implementation under test: resolve() for every kind, the names derived from it, and
the reproduce command, which must name the same implementation again when run."""

from __future__ import annotations

import shlex

import pytest

from linattn_verify.cases import Case
from linattn_verify.cli import build_parser
from linattn_verify.cli.options import implementation
from linattn_verify.specs import SpecError
from linattn_verify.under_test import Implementation, resolve
from tests.zoo import correct

CASE = Case(1, 2, 5, 3, 2, "float32", "dominant", 2.0, seed=3)
TARGET = "tests/vet_targets.py:elu_linear"


def _closure():
    def local_kernel(q, k, v):
        return correct.elu_einsum(q, k, v)

    return local_kernel


KINDS = {
    "form-chunked": lambda: resolve(
        form="chunked", chunk_size=16, feature_map="elu", causal=True, eps=1e-6
    ),
    "form-quadratic": lambda: resolve(form="quadratic", feature_map="softmax"),
    "form-quadratic-linear-cost": lambda: resolve(
        form="quadratic", feature_map="elu", cost="linear"
    ),
    "target": lambda: resolve(TARGET, feature_map="elu", layout="bnhd", cost="quadratic"),
    "adapter": lambda: resolve("fla.based-naive", load=False),
    "adapter-other-cost": lambda: resolve("fla.based-naive", cost="linear", load=False),
    "callable": lambda: resolve(correct.elu_masked_quadratic, feature_map="elu", causal=True),
}


def _rerun(command: str):
    """The arguments `command` gives the command line's parser."""
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "linattn_verify"], command
    return build_parser().parse_args(words[3:])


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_reproduce_command_names_the_same_implementation(kind: str):
    impl: Implementation = KINDS[kind]()
    args = _rerun(impl.reproduce("reference", CASE))
    again = implementation(args, load=False)
    assert args.name == "reference" and Case.from_json(args.case) == CASE
    assert (again.spec, again.layout, again.cost) == (impl.spec, impl.layout, impl.cost)
    if impl.source.kind == "callable":  # named as the module attribute that holds it
        assert again.source.kind == "target" and again.load().fn is impl.fn
    else:
        assert again.source == impl.source


def test_the_reproduce_command_of_a_causal_callable_says_causal():
    """assert_linear_attention(fn, "elu", causal=True) once printed a line without it."""
    impl = resolve(_closure(), feature_map="elu", causal=True)
    words = shlex.split(impl.reproduce("causality", CASE))
    assert "--causal" in words and "--feature-map" in words
    assert "<_closure.<locals>.local_kernel>" in words  # it names it, and cannot load it


def test_names_and_ids_say_what_each_is():
    chunked, adapter = KINDS["form-chunked"](), KINDS["adapter"]()
    assert chunked.test_id == "elu-causal-chunked-c16-eps1e-06"
    assert chunked.name == "lv.attention elu (causal, eps=1e-06) form=chunked chunk_size=16"
    assert adapter.test_id == adapter.name == "fla.based-naive"
    assert adapter.spec.feature_map == "taylor" and adapter.cost == "quadratic"
    assert KINDS["callable"]().name == "elu_masked_quadratic"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"target": "fla.based-naive", "feature_map": "elu"},
            "its spec, layout and head dimensions are its claim",
        ),
        ({"target": "fla.based-naive", "causal": True}, "drop --causal"),
        ({"target": TARGET}, "needs --feature-map"),
        ({"target": "nocolon", "feature_map": "elu"}, "must look like module:function"),
        ({"target": "fla.simple-gla-chunkk"}, "did you mean 'fla.simple-gla-chunk'"),
        ({"target": TARGET, "form": "linear", "feature_map": "elu"}, "choose a built-in form"),
        ({"form": "fastest", "feature_map": "elu"}, "form must be one of"),
        ({"form": "linear", "feature_map": "elu", "causal": True}, "does not evaluate"),
        ({"form": "linear", "feature_map": "elu", "chunk_size": 4}, "for the chunked form"),
        ({"form": "chunked", "feature_map": "elu", "causal": True, "chunk_size": 0}, "positive"),
        ({"form": "linear", "feature_map": "elu", "layout": "bnhd"}, "describes a target"),
        ({"form": "linear", "feature_map": "elu", "cost": "cubic"}, "cost must be one of"),
        ({"form": "linear"}, "needs --feature-map"),
    ],
)
def test_what_does_not_fit_is_one_clear_error(arguments: dict, message: str):
    target = arguments.pop("target", None)
    with pytest.raises(SpecError, match=message):
        resolve(target, **arguments, load=False)


def test_a_misspelled_function_is_named_with_the_closest_one():
    with pytest.raises(SpecError, match="no attribute 'elu_cumsumm'; did you mean 'elu_cumsum'"):
        resolve("tests.zoo.textbook:elu_cumsumm", feature_map="elu")


def test_a_declared_implementation_is_loaded_only_when_asked():
    declared = resolve("no_such_module_xyz:fn", feature_map="elu", load=False)
    assert declared.fn is None
    with pytest.raises(SpecError, match="cannot import 'no_such_module_xyz'"):
        declared.load()
