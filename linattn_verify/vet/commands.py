"""The commands that rerun what a vet task did without a case (the checks' rows carry
`check NAME ... --case JSON`): the cost growth (`scaling`), the known-answer vectors
(`known-answers run`) and the rate (`vet`, which runs it on the same draws)."""

from __future__ import annotations

import shlex

from ..under_test import Implementation


def target_words(impl: Implementation) -> list[str]:
    """The options that name `impl` (its `command`), its --impl TARGET as the positional
    TARGET that `vet` and `scaling` take."""
    words = shlex.split(impl.command)
    if words[:1] == ["--impl"]:
        return [words[1], *words[2:]]
    return words


def scaling_command(impl: Implementation, max_n: int, d: int, dtype: str) -> str:
    """The `scaling` command counting what vet's scaling task counts (N = 256 ... max_n,
    d = dv, inputs in `dtype`, W orthogonal from seed 0)."""
    words = [*target_words(impl), "--max-n", str(max_n), "--d", str(d)]
    words += [] if dtype == "float32" else ["--dtype", dtype]
    return "python -m linattn_verify scaling " + shlex.join(words)


def vet_command(impl: Implementation, *options: str) -> str:
    """A `vet` command on `impl` with `options`."""
    return "python -m linattn_verify vet " + shlex.join([*target_words(impl), *options])


def known_answers_command(impl: Implementation) -> str:
    """The `known-answers run` command on `impl`: its error on every known-answer vector."""
    return "python -m linattn_verify known-answers run " + shlex.join(target_words(impl))
