"""The documentation's code: every Python block of the README and of ``docs/`` compiles, and the
"testing your own tasks" example of ``docs/development.md`` passes, run by pytest as a user's own
test file would be (a real Redis it starts, a real worker)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text(encoding="utf-8"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_compile(page: Path) -> None:
    for number, block in enumerate(python_blocks(page), 1):
        compile(block, f"{page.name} block {number}", "exec")


def test_the_pages_have_python_blocks() -> None:
    """The check above would pass on pages it fails to parse: make sure it reads real blocks."""
    assert len(python_blocks(ROOT / "docs" / "development.md")) == 1
    assert len(python_blocks(ROOT / "README.md")) >= 2


def test_testing_your_own_tasks_example_passes(tmp_path: Path) -> None:
    (example,) = python_blocks(ROOT / "docs" / "development.md")
    (tmp_path / "test_mytasks.py").write_text(example, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mytasks.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
