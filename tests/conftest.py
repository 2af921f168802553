"""Shared fixtures: real Redis servers that the tests start themselves, on free ports.

No test talks to a Redis it did not start (never the shared one on 6379), and no fake or mocked
Redis is used anywhere: a lease, a Lua script or a dropped connection are only real on a real
server.

- ``redis_server``: one ``redis-server`` for the whole session (:class:`RedisServer`).
- ``redis_url``: its URL (``redis://127.0.0.1:PORT/0``).
- ``redis_client``: a fresh ``redis.Redis`` on that server, its database emptied first.
- ``make_redis_server``: start extra servers (``make_redis_server("--requirepass", "pw")``),
  stopped when the test ends; use it for tests that restart, pause or reconfigure a server.
- ``env``: a ``tests/test_celery_*.py`` module's app (its module-level ``app``) on a
  redis-server of its own with an in-process worker (threads pool): see :func:`env`.
- ``fault_server``, ``fault_app``, ``fault_worker``: the fault tests' app
  (``tests/faultapp.py``) on a redis-server of the module's own, and an in-process worker
  (threads pool) running its tasks from the ``fault`` queue.
- ``fault_beat``: start ``celery beat`` processes of the fault tests' app (slow tests only).
- ``browser``: a headless Chromium (``tests/browser_fixtures.py``) for the web page's tests;
  without one they are skipped, saying what is missing, but in CI (``CI=true``).
- ``policy``: set the module's app's ``singleton_lock_on_backend_error`` for one test.

Tests reach the package through its public names (the CLI through its entry points:
``celery_fixtures.locks_command`` and ``cli_main``; an app's lock client through
``celery_fixtures.lock_space``). The lock layer's own white-box tests may import its private
modules, and so may the checks of the package against its own definitions (its import rules,
the docs' tables); they are listed in ``tests/test_package.py`` (``LOCK_WHITE_BOX``,
``DEFINITIONS_WHITE_BOX``), which fails a test that imports a private module without being
listed. Marks and warning filters shared by every module live in ``pyproject.toml``'s pytest
configuration.
Every test ends with the apps the tests made closed (``celery_fixtures.close_apps``), before its
fixtures stop or empty a server: what an app counted is written by then, and never after into
the next test's data.

A test that starts a ``celery worker`` or ``celery beat`` subprocess is marked ``slow``: the
``not slow`` subset (what CI runs against the oldest dependencies) starts none, and a test that
does without the mark fails (:func:`_refuse_celery_processes`).
"""

from __future__ import annotations

import ast
import functools
import gc
import os
import shlex
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import faultapp
import pytest
from beatproj.harness import LEADER_SCHEDULER, Beat
from browser_fixtures import (
    browser,  # noqa: F401 - the browser tests' fixture
    skip_without_a_browser,
)
from celery import Celery
from celery_fixtures import DB_LOCKS, CeleryEnv, celery_env, close_apps, running_worker, track
from celery_procs import close_app, redis_base

from celery_singleton_lock import reload_settings
from celery_singleton_lock.testing import RedisServer

if sys.version_info < (3, 11, 8):
    # CPython before 3.11.8 keeps the AST constructor's recursion depth in interpreter-wide
    # state (gh-106905): two threads in ast.parse at once make it raise "SystemError: AST
    # constructor recursion depth mismatch". Tracebacks are formatted with ast.parse on 3.11
    # (caret anchors), by pytest in the main thread and by worker and listener threads that log
    # errors, so a suite with a Celery worker in a thread hits it now and then (once as an
    # INTERNALERROR in CI). One lock around ast.parse keeps those calls apart.
    _ast_parse_lock = threading.RLock()
    _ast_parse = ast.parse

    @functools.wraps(_ast_parse)
    def _serialized_ast_parse(*args: Any, **kwargs: Any) -> Any:
        # Not every parse goes through here (C code compiling to an AST does not), so the
        # mismatch can still strike (once in CI, in hypothesis's inspect.getsource); a parse
        # has no side effects, and the same parse again succeeds.
        with _ast_parse_lock:
            for attempt in range(3):
                try:
                    return _ast_parse(*args, **kwargs)
                except SystemError as exc:
                    if "recursion depth mismatch" not in str(exc) or attempt == 2:
                        raise
            raise AssertionError("unreachable")

    ast.parse = _serialized_ast_parse


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test session's own, on a free port; stopped at the end."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture
def locks(redis_server: RedisServer) -> Iterator[Any]:
    """The session server's lock database (``DB_LOCKS``), emptied first: what the web page's
    tests read and write (a module may define its own)."""
    client = redis_server.client(db=DB_LOCKS)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[Any]:
    """A client of the session server, with database 0 emptied (FLUSHDB) before the test."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()  # a test stopped it: bring it back for the next ones
    client = redis_server.client()
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def make_redis_server() -> Iterator[Callable[..., RedisServer]]:
    """A factory of extra, started servers: ``make_redis_server(*server_args, **RedisServer
    options)``. Every server it started is stopped (and its directory removed) after the test."""
    started: list[RedisServer] = []

    def make(*args: str, **options: Any) -> RedisServer:
        server = RedisServer(*args, **options)
        started.append(server)
        return server.start()

    yield make
    for server in started:
        try:
            if server.process is not None:
                server.process.kill()
                server.process.wait(5)
                server.process = None
        finally:
            shutil.rmtree(server.dir, ignore_errors=True)


# -- the not-slow subset starts no celery worker or beat process -----------------------------

#: the test running now in this process (set around each test's setup, call and teardown, so
#: that a module-scoped fixture started for it counts as its own)
_running: list[pytest.Item] = []


def _celery_process(args: Any) -> str | None:
    """``worker`` or ``beat`` when ``args`` (a Popen command) starts a ``celery worker`` or
    ``celery beat`` (``python -m celery ...`` or a ``celery`` script), else ``None``."""
    if isinstance(args, (list, tuple)):
        argv = [os.fsdecode(a) for a in args]
    else:  # a command line for a shell
        argv = shlex.split(os.fsdecode(args))
    celery = any(
        Path(a).name == "celery" or (a == "celery" and argv[i - 1] == "-m")
        for i, a in enumerate(argv[:4])
    )
    return next((a for a in argv if a in ("worker", "beat")), None) if celery else None


def _refuse_celery_processes(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook: a test that is not marked ``slow`` may not start a ``celery worker`` or
    ``celery beat`` subprocess. Such a test checks a process-level fault (a signal, a pool
    child's death, a beat's hand-over) and belongs in the slow run, or it should use an
    in-process worker (``env`` / ``fault_worker``, threads pool) instead."""
    if event != "subprocess.Popen" or not _running:
        return
    kind = _celery_process(args[1])
    item = _running[-1]
    if kind is not None and item.get_closest_marker("slow") is None:
        raise RuntimeError(
            f"{item.nodeid} starts a celery {kind} subprocess but is not marked slow: mark it "
            "@pytest.mark.slow, or run its tasks on an in-process worker (the env or "
            "fault_worker fixture)"
        )


sys.addaudithook(_refuse_celery_processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.remove(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """As a test ends, before its fixtures stop or empty a server: the apps the tests made
    write their recent counts now, and their writer threads end (``celery_fixtures``). A count
    is written about a second after it is made, by a thread of its app: left running, it
    writes this test's counts into what the next test put on the same server."""
    close_apps()


# -- Celery apps on servers of their own ----------------------------------------------------


@pytest.fixture(scope="module")
def env(request: pytest.FixtureRequest) -> Iterator[CeleryEnv]:
    """The test module's ``app`` on a redis-server of its own, with a worker in this process
    (threads pool) running its tasks; the module's ``gates`` (if any) are opened at the end.
    ``CELERY_ENV`` (a dict, optional) in the module gives the worker's ``concurrency`` and
    settings for the app (``{"concurrency": 12, "singleton_lock_ttl": 20}``)."""
    module = request.module
    options = dict(getattr(module, "CELERY_ENV", {}))
    with celery_env(module.app, getattr(module, "gates", None), **options) as made:
        yield made


@pytest.fixture
def policy(env: CeleryEnv) -> Iterator[Callable[[str], None]]:
    """``policy(value)`` sets ``singleton_lock_on_backend_error`` of the module's ``env`` app;
    back to ``"raise"`` after the test."""

    def set_policy(value: str) -> None:
        env.app.conf.singleton_lock_on_backend_error = value
        reload_settings(env.app)

    yield set_policy
    set_policy("raise")


@pytest.fixture(scope="module")
def fault_server() -> Iterator[RedisServer]:
    """A redis-server of the test module's own, for the fault tests' app."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def fault_app(fault_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[Celery]:
    """The fault tests' app (``tests/faultapp.py``) on ``fault_server``; a module's
    ``make_fault_app`` (``faultapp.make_app`` and tasks of its own) makes it instead."""
    make = getattr(request.module, "make_fault_app", faultapp.make_app)
    app = track(make(redis_base(fault_server.port)))
    yield app
    close_app(app)
    gc.collect()  # the module's AsyncResults, while their result backend still answers


@pytest.fixture(scope="module")
def fault_worker(fault_app: Celery, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A worker in this process (threads pool) running ``fault_app``'s tasks from the
    ``fault`` queue: for the tests that check no process-level fault. ``WORKER_CONCURRENCY``
    in the module sets its threads (default 4). A test that kills a pool child or a whole
    worker starts a ``celery_procs.WorkerProcess`` on a queue of its own, and is ``slow``."""
    concurrency = int(getattr(request.module, "WORKER_CONCURRENCY", 4))
    with running_worker(fault_app, concurrency=concurrency, queues=["fault"]) as worker:
        try:
            yield worker
        finally:
            faultapp.ABORT.set()  # the bodies still running end now: the worker stops at once
    faultapp.ABORT.clear()


@pytest.fixture
def fault_beat(tmp_path: Path) -> Iterator[Callable[..., Beat]]:
    """``fault_beat(server, lease=None, scheduler=LEADER_SCHEDULER)`` starts a ``celery beat``
    of the fault tests' app on ``server`` (``fault.tick`` due every second; ``lease``: its
    ``singleton_lock_ttl``) and returns it; every beat started is stopped after the test."""
    beats: list[Beat] = []

    def start(server: RedisServer, lease: float | None = None, scheduler: str = "") -> Beat:
        env = {faultapp.URL_ENV: redis_base(server.port), faultapp.BEAT_ENV: "1"}
        if lease is not None:
            env[faultapp.TTL_ENV] = str(lease)
        beat = Beat("tests.faultapp", tmp_path, len(beats) + 1, env, scheduler or LEADER_SCHEDULER)
        beats.append(beat)
        return beat

    yield start
    for beat in beats:
        beat.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long job model run (``model_long``: more examples per combination, a few minutes)
    runs only when asked for by name (``-m model_long``); the suite's own run keeps
    the fast share of the same test. Deselected, not skipped: nothing is hidden.

    The browser tests are skipped, saying what is missing and how to install it, on a machine
    without Chromium and its chromedriver, but in CI (``CI=true``), where they fail instead."""
    skip_without_a_browser(items)
    if "model_long" in (config.getoption("markexpr") or ""):
        return
    long_runs = [item for item in items if item.get_closest_marker("model_long") is not None]
    if long_runs:
        config.hook.pytest_deselected(items=long_runs)
        items[:] = [item for item in items if item.get_closest_marker("model_long") is None]
