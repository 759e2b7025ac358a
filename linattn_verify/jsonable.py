"""Strict JSON for every --json and report.json: infinities and NaN become null (JSON has
neither; Python's json would write the invalid tokens Infinity and NaN)."""

from __future__ import annotations

import json
import math
from typing import Any


def jsonable(obj: Any) -> Any:
    """obj with every non-finite float replaced by None, recursively (dicts, lists, tuples,
    numpy scalars)."""
    if isinstance(obj, dict):
        return {key: jsonable(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(value) for value in obj]
    if hasattr(obj, "item") and not hasattr(obj, "__len__"):  # a numpy or torch scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj: Any) -> str:
    """Indented strict JSON, with a final newline; TypeError for what JSON cannot hold."""
    return json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n"
