"""MkDocs hook: puts the options and settings tables, made from their one definition in the
package, where a page has ``<!-- options-table -->`` or ``<!-- settings-table -->``, and the
last benchmark run's write-up (``docs/bench/results.md``, made by ``bench/run.py``) where it
has ``<!-- bench-results -->``.

A marker that no page uses, or a page that names an unknown marker, fails the build, so a
table cannot silently drop out of the docs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from celery_singleton_lock._celery.options import options_table
from celery_singleton_lock._celery.settings import settings_table

BENCH_RESULTS = Path(__file__).resolve().parent / "bench" / "results.md"


def bench_results() -> str:
    return BENCH_RESULTS.read_text(encoding="utf-8")


TABLES = {
    "options-table": options_table,
    "settings-table": settings_table,
    "bench-results": bench_results,
}
_MARKER = re.compile(r"<!-- ([a-z]+-(?:table|results)) -->")
_used: set[str] = set()


def on_pre_build(config: Any) -> None:
    _used.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"{page.file.src_path}: unknown table marker {name!r}")
        _used.add(name)
        return TABLES[name]()

    return _MARKER.sub(table, markdown)


def on_post_build(config: Any) -> None:
    missing = sorted(set(TABLES) - _used)
    if missing:
        raise ValueError(f"no page has the marker(s) {missing}: the docs would lack those tables")
