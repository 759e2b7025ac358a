"""The README's and docs/' generated blocks (scripts/doc_blocks.py): the cheap ones rerun
and compared with what the files hold, so that no example output or table of figures goes
stale; every marker names a block; the JSON keys vet writes are documented."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from linattn_verify.vet import VetReport

ROOT = Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("doc_blocks", ROOT / "scripts" / "doc_blocks.py")
blocks = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = blocks  # dataclasses look their module up there
SPEC.loader.exec_module(blocks)
# filled by hand from a vet run (the README's) and benchmarks/bench_vet.py (docs/performance.md's)
NOT_GENERATED_HERE = {"vet-example", "bench-vet"}
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("name", [n for n, b in blocks.BLOCKS.items() if b.cheap])
def test_the_cheap_blocks_are_current(name: str) -> None:
    block = blocks.BLOCKS[name]
    made, held = block.make(), blocks.current(block)
    assert blocks.same(block, made, held), (
        f"{block.path}: {name} is stale: python scripts/doc_blocks.py --update {name}\n"
        f"now:\n{made}\n\nthere:\n{held}"
    )


def test_every_marker_names_a_block_and_every_block_has_its_markers() -> None:
    found = {}
    for page in PAGES:
        for match in blocks.MARKER.finditer(page.read_text()):
            found[match.group(1)] = page.relative_to(ROOT).as_posix()
    unknown = set(found) - set(blocks.BLOCKS) - NOT_GENERATED_HERE
    assert not unknown, f"markers no generator writes: {sorted(unknown)}"
    for name, block in blocks.BLOCKS.items():
        assert found.get(name) == block.path, f"{name}: expected in {block.path}"
    assert set(found) >= NOT_GENERATED_HERE, "the README's vet example, the vet time table"


def test_every_key_vet_json_writes_is_documented() -> None:
    schemas = (ROOT / "docs" / "schemas.md").read_text()
    section = schemas[schemas.index("## vet --json") : schemas.index("## Other commands")]
    keys = [*VetReport("t", "i", "s").to_dict(), "reproduce", "environment"]
    missing = [k for k in keys if not re.search(rf"`{re.escape(k)}`", section)]
    assert not missing, f"docs/schemas.md, 'vet --json', does not document {missing}"
