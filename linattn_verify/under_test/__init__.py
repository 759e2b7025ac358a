"""The implementation under test (docs/contract.md): what it is, how it is called and the
commands that name it again (implementation), the options that declare its claim (claim),
the built-in forms (builtin), how what a user names becomes one (resolve), and what a
callable is called (names)."""

from .claim import DECLARED
from .implementation import Implementation, ImplementationFailure
from .resolve import from_options, resolve

__all__ = ["DECLARED", "Implementation", "ImplementationFailure", "from_options", "resolve"]
