"""One definition of the options that name a spec or a contract (linattn_verify.run_options):
vet's arguments, the pytest plugin's options, assert_linear_attention's keywords and the
reproduce commands all take every one, with its default, and nothing else of the kind;
a bad value is one SpecError naming the option at every entry point."""

from __future__ import annotations

import argparse
import inspect
import shlex
import typing

import pytest

from linattn_verify import pytest_plugin
from linattn_verify.cli import build_parser, main
from linattn_verify.grammar import Option, checked, words
from linattn_verify.run_options import OPTIONS, RUN
from linattn_verify.specs import SpecError
from linattn_verify.testing import assert_linear_attention
from linattn_verify.under_test import from_options, resolve
from linattn_verify.under_test.claim import CLAIM
from tests.zoo.correct import elu_einsum

# what each entry point takes besides the options: vet's own (what to run, how to report)
VET_ONLY = {"target", "form", "chunk_size", "list", "dtypes", "device", "sampler",
            "claim", "kat", "thorough", "smallest", "seed", "no_envelope", "fail_on", "strict",
            "timeout", "json", "quiet", "verbose", "repro"}  # fmt: skip
PLUGIN_ONLY = {"impl", "form", "chunk_size", "fail_on", "strict_accuracy"}
ASSERT_ONLY = {"fn", "dtypes", "device", "thorough", "smallest", "fail_on", "strict"}
TARGET = "tests/vet_targets.py:elu_linear"


def _vet_arguments(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """vet's arguments by dest."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return _vet_arguments_of(commands.choices["vet"])


def _vet_arguments_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """A parser's own arguments by dest (as vet's)."""
    return {a.dest: a for a in parser._actions if a.dest != "help"}


class _Plugin:
    """A stand-in for pytest's parser: the options the plugin adds, by dest."""

    def __init__(self) -> None:
        self.options: dict[str, tuple[tuple[str, ...], dict]] = {}
        pytest_plugin.pytest_addoption(self)

    def getgroup(self, name: str) -> _Plugin:
        return self

    def addoption(self, *flags: str, **kwargs) -> None:
        self.options[kwargs.get("dest", flags[0][2:].replace("-", "_"))] = (flags, kwargs)


def _parameters(fn) -> dict[str, tuple[object, object]]:
    """fn's parameters: (default, type) by name."""
    hints = typing.get_type_hints(fn)
    return {n: (p.default, hints.get(n)) for n, p in inspect.signature(fn).parameters.items()}


def _same_parameter(option: Option, default: object, kind: object) -> bool:
    """A keyword as the option: its default and type, or required where the option's
    default None stands for a value the caller must give (assert's feature_map)."""
    if default is inspect.Parameter.empty:
        return option.default is None and option.type == kind | None
    return (
        default == option.default
        and type(default) is type(option.default)
        and (kind == option.type)
    )


def disagreements(vet: dict, plugin: dict, parameters: dict, options=OPTIONS) -> list[str]:
    """Where vet's arguments, the plugin's options and assert_linear_attention's keywords
    depart from `options`: one missing or with another flag or default, or one of the kind
    that only one of them takes."""
    found = []
    for o in options:
        action = vet.get(o.name)
        if action is None or o.flag not in action.option_strings or action.default != o.default:
            found.append(f"vet {o.flag}")
        flags, kwargs = plugin.get(o.name, ((), {}))
        if o.flag not in flags or kwargs.get("default") != o.default:
            found.append(f"plugin {o.flag}")
        if o.name not in parameters or not _same_parameter(o, *parameters[o.name]):
            found.append(f"assert_linear_attention {o.name}")
    names = {o.name for o in options}
    found += [f"vet only: {d}" for d in vet if d not in names | VET_ONLY]
    found += [f"plugin only: {d}" for d in plugin if d not in names | PLUGIN_ONLY]
    found += [
        f"assert_linear_attention only: {n}" for n in parameters if n not in names | ASSERT_ONLY
    ]
    return found


def _entry_points() -> tuple[dict, dict, dict]:
    return (
        _vet_arguments(build_parser()),
        _Plugin().options,
        _parameters(assert_linear_attention),
    )


def test_every_entry_point_takes_every_option_with_its_default():
    assert disagreements(*_entry_points()) == []
    assert all(f"{o.name}" in assert_linear_attention.__doc__ for o in OPTIONS)


def test_an_option_added_in_one_place_only_is_caught():
    vet, plugin, parameters = _entry_points()
    parser = argparse.ArgumentParser()
    parser.add_argument("--gate-dim", type=int)  # a claim written into vet by hand
    assert disagreements(vet | _vet_arguments_of(parser), plugin, parameters) == [
        "vet only: gate_dim"
    ]
    extra = Option("gate_dim", "--gate-dim", int | None, None, "the gates' width")
    parser = argparse.ArgumentParser()  # added to the definition, and so to vet and the plugin
    parser.add_argument(extra.flag, **extra.arguments())
    plugin = plugin | {"gate_dim": ((extra.flag,), extra.arguments())}
    with_extra = (*OPTIONS, extra)
    assert disagreements(vet | _vet_arguments_of(parser), plugin, parameters, with_extra) == [
        "assert_linear_attention gate_dim"
    ]

    def widened(fn, feature_map: str, *, gate_dim: int | None = None, **rest): ...

    assert "assert_linear_attention only: gate_dim" in disagreements(
        vet, _Plugin().options, _parameters(widened)
    )


def retention(q, k, v, gamma, initial_state=None): ...  # named by the reproduce command


@pytest.mark.parametrize(
    "claim",
    [
        {"feature_map": "identity", "causal": True, "normalize": False, "scale": "d^-0.5",
         "decay": "constant", "state": "S", "layout": "bnhd", "cost": "quadratic"},
        {"feature_map": "elu", "causal": True, "eps": 1e-3, "scale": 0.5, "decay": "gates",
         "varlen": True},
    ],
)  # fmt: skip
def test_the_reproduce_command_gives_every_option_again(claim):
    impl = resolve(retention, **claim)
    command = impl.command
    for option in CLAIM:
        assert (option.flag in shlex.split(command)) == (option.name in claim), command
    args = build_parser().parse_args(["check", "all", *shlex.split(command)])
    again = from_options(args.target, vars(args), load=False)
    assert (again.spec, again.layout, again.cost, again.state, again.varlen) == (
        impl.spec, impl.layout, impl.cost, impl.state, impl.varlen
    )  # fmt: skip


def test_vet_gives_its_run_options_again():
    given = {"grad": True, "longest": 0, "long_grad": 1024}
    args = build_parser().parse_args(["vet", TARGET, "--feature-map", "elu", *words(RUN, given)])
    assert checked(RUN, vars(args), from_text=True) == given


BAD = [
    ("eps", "x", "--eps"),
    ("normalize", "no", "--no-normalize"),
    ("scale", "abc", "--scale"),
    ("decay", "linear", "--decay"),
    ("state", "SZ", "--state"),
    ("layout", "xyz", "--layout"),
    ("cost", "cubic", "--cost"),
    ("longest", -1, "--long"),
    ("longest", 100, "--long"),
]


@pytest.mark.parametrize(("name", "value", "flag"), BAD, ids=[f"{n}={v}" for n, v, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_option(name, value, flag, capsys):
    with pytest.raises(SpecError, match=f"^{name} must be") as err:
        assert_linear_attention(elu_einsum, "elu", **{name: value})
    assert "\n" not in str(err.value)
    if name == "normalize":  # a flag has no value to get wrong on a command line
        return
    assert main(["vet", TARGET, "--feature-map", "elu", flag, str(value), "--quiet"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {flag} must be"), line


@pytest.mark.parametrize(("name", "value"), [("grad", "yes"), ("varlen", 1), ("causal", "no")])
def test_a_flag_takes_true_or_false(name, value):
    with pytest.raises(SpecError, match=f"^{name} must be True or False, got {value!r}$"):
        assert_linear_attention(elu_einsum, "elu", **{name: value})
