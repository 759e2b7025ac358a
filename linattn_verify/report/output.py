"""Atomic output: a report is assembled in a staging folder beside its destination and
moved into place only when complete, so a crash leaves the previous report as it was."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..specs import SpecError


class OutputError(SpecError):
    """The report cannot be written where asked."""


@contextmanager
def staging(destination: Path) -> Iterator[Path]:
    """A fresh folder beside `destination` (created, with its parents, now: an unwritable
    place fails before any work); removed on exit unless publish() moved it."""
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    except OSError as err:
        raise OutputError(f"cannot write a report under {destination}: {err}") from None
    if destination.exists() and not destination.is_dir():
        shutil.rmtree(folder)
        raise OutputError(f"{destination} exists and is not a folder")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(folder: Path, destination: Path) -> None:
    """Replace `destination` by the complete `folder`: two renames on one file system (the
    old report is moved aside first and removed last)."""
    aside = None
    if destination.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", dir=destination.parent))
        os.replace(destination, aside / destination.name)
    os.replace(folder, destination)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    """path gets the whole document or stays as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(json.dumps(payload, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
