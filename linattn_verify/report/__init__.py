"""`python -m linattn_verify report`: accuracy, positivity margins, gradients, random
features and scaling in one Markdown + JSON report with plots (build.py runs it,
markdown.py renders it, compare.py diffs two, output.py writes atomically)."""

from .build import SCHEMA, ReportOptions, make_plan, run_report, units
from .compare import ERROR_FACTOR, TIME_FACTOR, Comparison, compare
from .markdown import counts, render
from .output import OutputError, publish, staging, write_json_atomically

__all__ = [
    "ERROR_FACTOR",
    "SCHEMA",
    "TIME_FACTOR",
    "Comparison",
    "OutputError",
    "ReportOptions",
    "compare",
    "counts",
    "make_plan",
    "publish",
    "render",
    "run_report",
    "staging",
    "units",
    "write_json_atomically",
]
