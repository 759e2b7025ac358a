"""Loading an implementation named on the command line: `module:attr` or `path.py:attr`."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from .specs import SpecError


def did_you_mean(word: str, known) -> str:
    """ "; did you mean X?" for the name of `known` closest to a misspelled `word`, or ""."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


def split_target(target: str) -> tuple[str, str]:
    """(module or path.py, attribute) of `target`; SpecError unless it looks like
    module:function or path/file.py:function."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise SpecError(
            f"target {target!r} must look like module:function or path/file.py:function"
        )
    return module_name, attr


def load_target(target: str) -> Callable:
    """The callable `attr` of `module` (importable from the current directory or
    PYTHONPATH) or of the file `path.py`; SpecError naming what failed."""
    module_name, attr = split_target(target)
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise SpecError(f"target file {path} does not exist")
            spec = importlib.util.spec_from_file_location(f"_linattn_target_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")
            module = importlib.import_module(module_name)
    except SpecError:
        raise
    except Exception as err:  # an import that fails for any reason is the user's to fix
        raise SpecError(f"cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            public = [name for name in dir(module) if not name.startswith("_")]
            hint = did_you_mean(attr, public) if "." not in attr else ""
            raise SpecError(f"{module_name!r} has no attribute {attr!r}{hint}")
    if not callable(fn):
        raise SpecError(f"{target!r} is not callable")
    return fn
