"""docs/combinations.md's matrix of every pair of task options is the class check's: each row's
verdict (supported or refused) is what making a ``LockedTask`` with the row's options says, every
pair of two options' settings has one row, every option (of the README's options table) has a
setting, and each supported row names the tests that prove it (tests that exist)."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "combinations.md"
#: every task option: the first column of the README's options table
OPTION_NAMES = re.findall(
    r"^\| `(lock_\w+)` \|", (ROOT / "README.md").read_text(encoding="utf-8"), re.M
)
#: the model-based test of every admitted combination (cited by every supported row)
MODEL = "tests/test_job_model.py"


def _options(cell: str) -> dict[str, Any]:
    """The options a cell's code names: ``name=literal`` parts split by ``;``
    (``lock_key=callable``: a callable)."""
    code = cell.strip().strip("`")
    options: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in code.split(";"))):
        name, sep, value = part.partition("=")
        assert sep and name in OPTION_NAMES, f"not an option setting: {part!r}"
        options[name] = str if value == "callable" else ast.literal_eval(value)
    return options


def _rows() -> list[list[str]]:
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("<!-- the matrix: scripts/combinations.py -->", 1)[1]
    table = table.split("<!-- end of the matrix -->", 1)[0]
    rows = []
    for line in table.strip().splitlines()[2:]:  # past the header and its rule
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == 5, line
        rows.append(cells)
    return rows


ROWS = _rows()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[0]} + {r[1]}" for r in ROWS])
def test_each_row_says_what_the_class_check_says(row: list[str]) -> None:
    first, second, needed, said, why = row
    options = {**_options(needed), **_options(first), **_options(second)}
    app = Celery("matrix", set_as_current=False)
    app.finalize()  # so that app.task makes the class now, and checks its options

    def job(n: int = 0) -> None: ...  # the parameter the rows' lock_unique_on names

    try:
        app.task(base=LockedTask, name="matrix.job", shared=False, **options)(job)
    except (TypeError, ValueError) as exc:
        refused: str | None = str(exc)
    else:
        refused = None
    if refused is not None:
        assert said == "**refused**", f"the class check refuses it: {refused}"
        assert why, "a refused row gives the reason"
        return
    assert said == "supported", "the class check admits it"
    cited = re.findall(r"`([^`]+)`", why)
    assert cited[:1] == [MODEL], "a supported row cites the model test first"
    for test in cited[1:]:
        path, _, name = test.partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}\(", source, re.M), f"no test {test}"


def test_every_pair_of_two_options_has_one_row() -> None:
    settings = {cell for row in ROWS for cell in row[:2]}
    named = {cell: next(iter(_options(cell))) for cell in settings}
    assert set(named.values()) == set(OPTION_NAMES), "an option has no setting in the matrix"
    pairs = [frozenset(row[:2]) for row in ROWS]
    assert len(pairs) == len(set(pairs)), "a pair has two rows"
    wanted = {
        frozenset((a, b))
        for a, b in itertools.combinations(sorted(settings), 2)
        if named[a] != named[b]
    }
    assert set(pairs) == wanted
