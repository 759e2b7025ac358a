"""One option of a claim or a run (Option), as a command line, pytest's options and Python
keywords spell it, with one parser and one error message for every entry point: the
shared grammar of under_test/claim.py's, a family's own (Family.options) and run_options'."""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .specs import SpecError


@dataclass(frozen=True)
class Option:
    """One option. name: its keyword (and dest); flag: its command-line spelling, for a
    bool the flag that sets it to `not default`; type: its Python type (float admits an
    int); choices: the strings it admits; const: its value when the flag is given alone;
    check(value, label): a further problem with a value, or None."""

    name: str
    flag: str
    type: Any
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    const: str | None = None
    check: Callable[[Any, str], str | None] | None = None

    def arguments(self) -> dict[str, Any]:
        """Keyword arguments of argparse's add_argument and pytest's addoption: values stay
        text, which `checked` parses (one error message for every entry point)."""
        kwargs = {"dest": self.name, "default": self.default, "help": self.help}
        if self.type is bool:
            return kwargs | {"action": "store_false" if self.default else "store_true"}
        if self.metavar or self.choices:
            kwargs["metavar"] = self.metavar or "{" + ",".join(self.choices) + "}"
        return kwargs | ({"nargs": "?", "const": self.const} if self.const else {})

    def words(self, value: Any) -> list[str]:
        """The command-line words that give `value` (none for the default)."""
        if value == self.default:
            return []
        return [self.flag] if self.type is bool or value == self.const else [self.flag, str(value)]

    def parse(self, text: str) -> Any:
        """The value a command line's text gives (itself when a string is admitted)."""
        if not self.admits(text):
            for kind in (int, float):
                if kind in _types(self.type):
                    try:
                        return kind(text)
                    except ValueError:
                        break
        return text  # when not admitted, `problem` names it

    def admits(self, value: Any) -> bool:
        """Whether `value` is of the option's type (a string: one of its choices)."""
        kinds = _types(self.type)
        if isinstance(value, str):
            return (
                value in self.choices or value == self.const or (not self.choices and str in kinds)
            )
        if isinstance(value, bool):  # an int to Python, not a number here
            return bool in kinds
        if value is None:
            return type(None) in kinds
        return (isinstance(value, int) and int in kinds) or (
            isinstance(value, int | float) and float in kinds
        )

    def problem(self, value: Any, label: str) -> str | None:
        """What is wrong with `value` (label: how the caller spells the option), or None."""
        if not self.admits(value):
            names = {bool: "True or False", int: "an integer", float: "a number"}
            what = [names[k] for k in _types(self.type) if k in names]
            if self.choices:
                one = "one of " * (len(self.choices) > 1) + ", ".join(self.choices)
                what.append(one)
            return f"{label} must be {' or '.join(what)}, got {value!r}"
        return self.check(value, label) if self.check else None


def checked(
    options: Iterable[Option], given: Mapping[str, Any], from_text: bool = False
) -> dict[str, Any]:
    """Each option's value in `given`, its default when absent or None; text from a command
    line (from_text) parsed. SpecError names the first that does not fit, by its flag when
    from_text, else by its keyword. A default is not checked."""
    values = {}
    for option in options:
        value = given.get(option.name)
        if value is None:
            value = option.default
        elif from_text and isinstance(value, str):
            value = option.parse(value)
        if value != option.default or type(value) is not type(option.default):
            label = option.flag if from_text else option.name
            if problem := option.problem(value, label):
                raise SpecError(problem)
        values[option.name] = value
    return values


def words(options: Iterable[Option], values: Mapping[str, Any]) -> list[str]:
    """The command-line words that give `values` (absent ones: the defaults)."""
    return [w for o in options for w in o.words(values.get(o.name, o.default))]


def _types(annotation: Any) -> tuple[Any, ...]:
    return annotation.__args__ if isinstance(annotation, types.UnionType) else (annotation,)
