"""The implementation under test (docs/contract.md): what it is and how it is called
(implementation), the options that declare its claim (claim), the built-in forms (builtin),
how what a user names becomes one (resolve), and the commands that name it again
(commands)."""

from .claim import DECLARED
from .implementation import Implementation, ImplementationFailure
from .resolve import from_options, resolve

__all__ = ["DECLARED", "Implementation", "ImplementationFailure", "from_options", "resolve"]
