"""Shared fixtures: real Redis servers that the tests start themselves, on free ports.

No test talks to a Redis it did not start (never the shared one on 6379), and no fake or mocked
Redis is used anywhere: a lease, a Lua script or a dropped connection are only real on a real
server.

- ``redis_server``: one ``redis-server`` for the whole session (:class:`RedisServer`).
- ``redis_url``: its URL (``redis://127.0.0.1:PORT/0``).
- ``redis_client``: a fresh ``redis.Redis`` on that server, its database emptied first.
- ``make_redis_server``: start extra servers (``make_redis_server("--requirepass", "pw")``),
  stopped when the test ends; use it for tests that restart, pause or reconfigure a server.
"""

from __future__ import annotations

import ast
import functools
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

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
