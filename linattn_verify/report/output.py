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

from ..jsonable import dumps
from ..specs import SpecError


class OutputError(SpecError):
    """The report cannot be written where asked."""


def _replaceable(destination: Path) -> None:
    """OutputError unless `destination` is absent, an empty folder, or an earlier report
    (a report.json of this tool): a report never deletes anything else."""
    if not destination.exists():
        return
    if not destination.is_dir():
        raise OutputError(f"{destination} exists and is not a folder")
    if not any(destination.iterdir()):
        return
    try:
        schema = json.loads((destination / "report.json").read_text()).get("schema", "")
    except (OSError, ValueError, AttributeError):
        schema = ""
    if not str(schema).startswith("linattn-verify report"):
        raise OutputError(
            f"{destination} holds files that are not a report of this tool: give an empty "
            "or new folder (the report replaces the whole folder)"
        )


@contextmanager
def staging(destination: Path) -> Iterator[Path]:
    """A fresh folder beside `destination` (created, with its parents, now: an unwritable
    place, or a destination that is not an earlier report, fails before any work); removed
    on exit unless publish() moved it."""
    _replaceable(destination)
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    except OSError as err:
        raise OutputError(f"cannot write a report under {destination}: {err}") from None
    folder.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would hide the report from others
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(folder: Path, destination: Path) -> None:
    """Replace `destination` by the complete `folder`: two renames on one file system (the
    old report is moved aside first, put back if the second rename fails, and removed
    last). Only a process killed between the two renames leaves the old report aside, in
    `.NAME.old.*` beside it."""
    aside = None
    if destination.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old.", dir=destination.parent))
        os.replace(destination, aside / destination.name)
    try:
        os.replace(folder, destination)
    except OSError:
        if aside is not None:
            os.replace(aside / destination.name, destination)
            aside.rmdir()
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    """path gets the whole document or stays as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(dumps(payload))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600, as a plain open would not
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
