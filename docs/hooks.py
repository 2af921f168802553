"""MkDocs hook: the options and settings tables, made from their one definition in the
package, and the last benchmark run's write-up (``docs/bench/results.md``, made by
``bench/run.py``; ``docs/bench/instructions.md``, made by ``bench/instructions.py``), written
into the pages themselves between a start and an end marker::

    <!-- options-table:start (made by docs/hooks.py from the package) -->
    | option | default | meaning |
    ...
    <!-- options-table:end -->

so that the Markdown files read whole where they are shown as they are (GitHub's view of the
repository). The build puts what the package makes now between the markers, whatever the file
holds, and ``tests/test_docs.py`` checks that the files hold exactly that (run
:func:`fill_file` to rewrite a page after a change).

A marker that no page uses, or a page that names an unknown marker (or a start without its end),
fails the build, so a table cannot silently drop out of the docs.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery_singleton_lock._celery.lifecycle import lifecycle_table
from celery_singleton_lock._celery.options import options_table
from celery_singleton_lock._celery.settings import settings_table

DOCS = Path(__file__).resolve().parent
BENCH_RESULTS = DOCS / "bench" / "results.md"
#: bench/instructions.py's table (client instructions per job), also written by bench/run.py
INSTRUCTIONS_RESULTS = DOCS / "bench" / "instructions.md"


def bench_results() -> str:
    return BENCH_RESULTS.read_text(encoding="utf-8").rstrip("\n")


def instructions_results() -> str:
    return INSTRUCTIONS_RESULTS.read_text(encoding="utf-8").rstrip("\n")


def server_results() -> str:
    """The production page's server time per lock cycle and per task, in words, from the last
    benchmark run (``docs/bench/results.json``)."""
    results = json.loads((DOCS / "bench" / "results.json").read_text(encoding="utf-8"))
    lock = results["lock"]["uncontended"]["contenders"]
    solo = next(iter(results["celery"]["pools"].values()))["contenders"]
    ours, floor = lock["csl"], lock["floor"]
    run, plain = solo["locked-run"]["server_us_per_task"], solo["plain"]["server_us_per_task"]
    return (
        f"In the last bench run one uncontended acquire and release of the plain lock cost the "
        f"Redis server {ours['server_us_per_cycle']:.1f} µs of command time (INFO "
        f"commandstats): {ours['server_ratio_to_floor']:.1f}x the floor (`SET NX PX` and a "
        f"compare-and-delete script, {floor['server_us_per_cycle']:.1f} µs), where redis-py's "
        f"own `Lock` is {lock['redispy']['server_ratio_to_floor']:.1f}x and python-redis-lock "
        f"{lock['prl']['server_ratio_to_floor']:.1f}x. A Celery task in run mode cost "
        f"{run:.1f} µs of server time in all, broker commands included, {run - plain:.1f} µs "
        "more than a plain task."
    )


TABLES: dict[str, Callable[[], str]] = {
    "options-table": options_table,
    "lifecycle-table": lifecycle_table,
    "settings-table": settings_table,
    "bench-results": bench_results,
    "instructions-results": instructions_results,
    "server-results": server_results,
}
_START = re.compile(r"<!-- ([a-z]+-(?:table|results)):start[^>]*-->\n")
_used: set[str] = set()


def _end(name: str) -> str:
    return f"<!-- {name}:end -->"


def fill(markdown: str, where: str, used: set[str] | None = None) -> str:
    """``markdown`` with what the package makes now between each pair of markers."""
    out: list[str] = []
    at = 0
    for match in _START.finditer(markdown):
        if match.start() < at:
            continue
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"{where}: unknown table marker {name!r}")
        end = markdown.find(_end(name), match.end())
        if end < 0:
            raise ValueError(f"{where}: {match.group(0).strip()} has no {_end(name)}")
        out += [markdown[at : match.end()], TABLES[name](), "\n"]
        at = end
        if used is not None:
            used.add(name)
    out.append(markdown[at:])
    return "".join(out)


def fill_file(path: Path) -> bool:
    """Rewrite ``path`` with its tables made now; whether it changed."""
    text = path.read_text(encoding="utf-8")
    filled = fill(text, path.name)
    if filled != text:
        path.write_text(filled, encoding="utf-8")
    return filled != text


def on_pre_build(config: Any) -> None:
    _used.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return fill(markdown, page.file.src_path, _used)


#: a Sphinx role as mkdocstrings renders a docstring that uses one (``:class:`~.x.Name```):
#: the role's name, then the target in <code>
_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):<code>(~?)([^<]+)</code>")


def _role_as_code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    shown = target.rsplit(".", 1)[-1] if short or target.startswith(".") else target
    return f"<code>{shown}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The API reference: the docstrings' Sphinx roles (``:class:`Name```), which
    mkdocstrings leaves as text, shown as the code they name."""
    return _ROLE.sub(_role_as_code, html)


def on_post_build(config: Any) -> None:
    missing = sorted(set(TABLES) - _used)
    if missing:
        raise ValueError(f"no page has the marker(s) {missing}: the docs would lack those tables")


if __name__ == "__main__":  # python docs/hooks.py: rewrite the pages' tables
    for page in sorted(DOCS.glob("*.md")):
        if fill_file(page):
            print(f"rewrote the tables of {page.relative_to(DOCS.parent)}", file=sys.stderr)
