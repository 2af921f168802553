"""The documentation's code: every Python block of the README and of ``docs/`` compiles, and the
"testing your own tasks" example of ``docs/development.md`` passes, run by pytest as a user's own
test file would be (a real Redis it starts, a real worker)."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask, install
from celery_singleton_lock._celery import run as run_module
from celery_singleton_lock._celery.install import is_installed
from celery_singleton_lock._celery.options import options_table
from celery_singleton_lock._celery.taskkey import MAX_PART, task_lock_name
from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
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


# -- claims of the docs that the code can check ---------------------------------------------------

DOCS = ROOT / "docs"


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _flat(text: str) -> str:
    """``text`` with its line breaks (and indentation) as single spaces, to find a phrase."""
    return " ".join(text.split())


def _load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("page", "marker"),
    [
        ("configuration.md", "options-table"),
        ("configuration.md", "settings-table"),
        ("benchmarks.md", "bench-results"),
        ("production.md", "server-results"),
    ],
)
def test_the_generated_tables_are_written_in_the_pages(page: str, marker: str) -> None:
    """The pages read whole on GitHub: the tables the build puts in are in the files too, equal
    to what the package (and the last benchmark run) makes now. After a change, rewrite them
    with ``python docs/hooks.py``."""
    hooks = _load_hooks()
    text = _page(page)
    start = re.search(rf"<!-- {marker}:start[^>]*-->\n", text)
    assert start is not None, f"{page} lacks <!-- {marker}:start -->"
    end = text.index(f"<!-- {marker}:end -->", start.end())
    assert text[start.end() : end] == hooks.TABLES[marker]() + "\n", (
        f"{page}: the {marker} is stale: run python docs/hooks.py"
    )
    assert hooks.fill(text, page) == text
    assert f"<!-- {marker} -->" not in text  # the old marker: a page with no table on GitHub


def test_the_hook_fills_and_rejects_what_it_must() -> None:
    hooks = _load_hooks()
    empty = "a\n<!-- options-table:start -->\nold\n<!-- options-table:end -->\nb\n"
    used: set[str] = set()
    assert hooks.fill(empty, "x.md", used) == (
        f"a\n<!-- options-table:start -->\n{options_table()}\n<!-- options-table:end -->\nb\n"
    )
    assert used == {"options-table"}
    with pytest.raises(ValueError, match="unknown table marker"):
        hooks.fill("<!-- nope-table:start -->\n<!-- nope-table:end -->\n", "x.md")
    with pytest.raises(ValueError, match="has no"):
        hooks.fill("<!-- options-table:start -->\n", "x.md")


def test_the_key_bound_the_docs_state_is_the_code_s() -> None:
    """configuration.md: a lock_key string longer than 128 characters keeps 94, then `~` and a
    32-hex-digit digest."""
    long = "x" * 300
    name = task_lock_name("t", None, (), {}, key_func=lambda: long)
    part = name.split(":", 1)[1]
    kept, digest = part.split("~")
    assert MAX_PART == 128 and len(part) == 127
    assert kept == long[:94] and re.fullmatch(r"[0-9a-f]{32}", digest)
    assert task_lock_name("t", None, (), {}, key_func=lambda: "y" * 128) == "t:" + "y" * 128
    text = _flat(_page("configuration.md"))
    assert (
        f"one longer than {MAX_PART} characters is cut to its first {len(kept)} characters, "
        f"then `~` and the {len(digest)}-hex-digit BLAKE2b digest of the whole string "
        f"({len(part)} characters in all;" in text
    )


def test_the_lock_key_example_works_for_every_call_form() -> None:
    """configuration.md's lock_key example, run: the key function gets the arguments as passed,
    and the documented one fits positional, keyword and left-out ``carrier`` alike."""
    text = _page("configuration.md")
    (block,) = [b for b in python_blocks(DOCS / "configuration.md") if "lock_key=" in b]
    app = Celery("docs_lock_key", set_as_current=False)
    namespace: dict[str, Any] = {"app": app, "LockedTask": LockedTask}
    exec(compile(block, "configuration.md lock_key block", "exec"), namespace)
    ship = namespace["ship"]
    order = {"id": 7}
    keys = {
        ship.lock_key_for(order, "ups"),
        ship.lock_key_for(order, carrier="ups"),
        ship.lock_key_for(order),
        ship.lock_key_for(order=order, carrier="ups"),
    }
    assert len(keys) == 1 and "order-7" in keys.pop()
    # what the docs warn against: a key function that takes only keywords after `order`
    bad = app.task(
        base=LockedTask, name="docs.bad_ship", shared=False, lock_key=lambda order, **_: "x"
    )(namespace["ship"].run)
    with pytest.raises(TypeError):
        bad.lock_key_for(order, "ups")
    assert "as the caller passed them" in _flat(text)


def test_the_setting_alone_does_not_lock_a_publisher() -> None:
    """configuration.md: a process that does not call install(app) (and starts no worker) keeps
    the setting's tasks plain, so it takes no lock at publish; install(app) locks them."""
    app = Celery("docs_publisher", set_as_current=False, broker="redis://127.0.0.1:1/0")
    app.conf.singleton_lock_tasks = {"docs.report": {"lock_at": "publish"}}

    def report(day: str) -> None: ...

    app.task(name="docs.report", shared=False)(report)
    app.finalize()
    assert not isinstance(app.tasks["docs.report"], LockedTask)
    assert not is_installed(app)
    install(app)
    assert isinstance(app.tasks["docs.report"], LockedTask)
    assert app.tasks["docs.report"].lock_at == "publish"
    text = _flat(_page("configuration.md"))
    assert "without `install(app)` | **no**" in text


def test_an_eager_duplicate_ends_ignored_as_the_docs_say() -> None:
    """django.md and gotchas.md: with task_always_eager, a run-time duplicate's EagerResult is
    IGNORED (Celery's Ignore() as its info), not SKIPPED with the holder."""
    with RedisServer() as server:
        app = Celery(
            "docs_eager", set_as_current=False, broker=f"redis://127.0.0.1:{server.port}/0"
        )
        app.conf.task_always_eager = True
        seen: list[Any] = []

        def nested(depth: int) -> str:
            if depth:
                inner = job.delay(0)  # same key (lock_unique_on=[]): held by this run
                seen.append((inner.state, inner.info))
            return "ran"

        job = app.task(base=LockedTask, name="docs.eager", shared=False, lock_unique_on=[])(nested)
        assert job.delay(1).get() == "ran"
        app.close()
    [(state, info)] = seen
    assert state == "IGNORED" and type(info).__name__ == "Ignore"
    for page in ("django.md", "gotchas.md"):
        assert "`IGNORED`" in _page(page), page
    assert "its `EagerResult` is `IGNORED` (not `SKIPPED`)" in _flat(_page("django.md"))


def _format_strings(path: Path, start: str) -> list[str]:
    return [
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(start)
    ]


def test_the_examples_readme_quotes_the_worker_s_skip_line() -> None:
    """examples/README.md quotes the worker's log line of a skipped duplicate: with its
    placeholders as ``%s`` it is the format string the worker logs with."""
    formats = _format_strings(Path(run_module.__file__ or ""), "skipped %s")
    (fmt,) = [f for f in formats if "is held by task" in f]  # (the other: a cooldown's)
    readme = _flat((ROOT / "examples" / "README.md").read_text(encoding="utf-8"))
    quoted = [q for q in re.findall(r"`(skipped <[^`]*)`", readme) if "[" in q]
    assert len(quoted) == 1, quoted
    assert re.sub(r"<[^>]+>", "%s", quoted[0]) == fmt
    assert "celery_singleton_lock.run" in readme and run_module.log_run.name == (
        "celery_singleton_lock.run"
    )


def test_the_committed_diagrams_are_their_source_s() -> None:
    """docs/diagrams/*.svg are what docs/diagrams/make.py draws (run it after changing it)."""
    spec = importlib.util.spec_from_file_location("make_diagrams", DOCS / "diagrams" / "make.py")
    assert spec is not None and spec.loader is not None
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    for name, draw in make.DIAGRAMS.items():
        assert (DOCS / "diagrams" / name).read_text(encoding="utf-8") == draw(), name


def test_the_site_is_built_offline() -> None:
    """No page loads anything from another host: highlighting is done at build time, the
    theme's web fonts are off, the diagrams and the chart are files of the site."""
    config = (ROOT / "mkdocs.yml").read_text()
    assert "font: false" in config and "use_pygments: true" in config
    for page in DOCS.glob("*.md"):
        assert not re.search(r"!\[[^\]]*\]\(https?://", page.read_text()), page.name


def test_every_cli_flag_the_docs_name_exists() -> None:
    """Each ``--flag`` the operating page and the README give ``celery locks`` is an option
    of one of its commands (or of ``python -m celery_singleton_lock``'s ``--url``)."""
    from celery_singleton_lock._ops.cli import locks

    known = {
        opt
        for command in locks.commands.values()
        for param in command.params
        for opt in getattr(param, "opts", [])
        if opt.startswith("--")
    }
    for page in ("docs/operating.md", "README.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        cli_lines = [
            line
            for line in text.splitlines()
            if "locks " in line or "celery_singleton_lock --" in line
        ]
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", "\n".join(cli_lines)))
        assert named, page
        assert named <= known, f"{page} names {sorted(named - known)}, not options of `locks`"
