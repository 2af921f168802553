"""The suite's own rules: what a test's app writes in the background ends with the test, and
a test that needs a tool says so when it is missing.

An app counts its duplicates, refusals and lost locks (``singleton_lock_counts``, on by
default), and a thread of the app writes them about a second after each count. Each test ends
with its apps closed (``conftest.pytest_runtest_teardown`` calls ``celery_fixtures.close_apps``,
which calls :func:`celery_singleton_lock.close`), before its fixtures stop or empty a server:
a count a test made is in Redis when the test ends, and nothing is written after, into what
the next test put on the same server.

The browser tests need Chromium and its chromedriver: without them they are skipped, each
saying what is missing and how to install it, but in CI (``CI=true``), where they fail saying
the same (``browser_fixtures.skip_without_a_browser``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery_fixtures import DB_LOCKS, app_task, configure, new_app

from celery_singleton_lock import LockedTask
from celery_singleton_lock.testing import RedisServer

#: longer than a few of the writer's intervals (one second each): a write still to come has
#: come by then
WRITER_INTERVALS = 3.0


@pytest.fixture
def next_test_server(make_redis_server: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    """A server of the test's own. Once the test has ended (and its apps were closed): its
    counts are in the lock database already; that database is emptied, as the next test's
    fixture would, and stays empty."""
    server = make_redis_server()
    yield server
    locks = server.client(db=DB_LOCKS)
    try:
        counted = sorted(locks.scan_iter("lock:counts:*"))
        locks.flushdb()  # the next test's empty database
        time.sleep(WRITER_INTERVALS)  # the scenario: a write still to come would come now
        late = sorted(locks.scan_iter())
        assert counted and late == [], (
            f"written by the test's end: {counted} (wanted its counts); written after, into "
            f"the next test's database: {late} (wanted nothing)"
        )
    finally:
        locks.close()


def test_a_test_s_counts_are_written_before_it_ends_and_never_after(
    next_test_server: RedisServer,
) -> None:
    app = new_app("isolation")
    configure(app, next_test_server)

    @app_task(app, base=LockedTask, name="isolation.job", lock_at="publish", shared=False)
    def job() -> None:
        return None

    first = job.delay()  # queued for a worker that never comes: its publish lock stays held
    assert job.delay().id == first.id  # the duplicate, counted: the test ends right here


#: a pytest project whose one test is a browser test, on a machine without Chromium: the
#: suite's own fixture and hook, with the browser's path pointing nowhere
_NO_CHROMIUM_CONFTEST = """
from pathlib import Path

import browser_fixtures
from browser_fixtures import browser  # noqa: F401

browser_fixtures.CHROMIUM = Path("/nonexistent/chromium")


def pytest_collection_modifyitems(items):
    browser_fixtures.skip_without_a_browser(items)
"""
_BROWSER_TEST = """
import pytest


@pytest.mark.browser
def test_the_page(browser):
    pass
"""


def _run_without_chromium(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "conftest.py").write_text(_NO_CHROMIUM_CONFTEST, encoding="utf-8")
    (tmp_path / "test_page.py").write_text(_BROWSER_TEST, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-o", "markers=browser: a browser test", "test_page.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_without_chromium_a_browser_test_is_skipped_saying_what_is_missing(
    tmp_path: Path,
) -> None:
    out = _run_without_chromium(tmp_path, ci=None)
    assert "1 skipped" in out, out
    said = " ".join(out.split())
    assert "/nonexistent/chromium not found" in said, out
    assert "apt-get install -y chromium chromium-driver" in said, out


def test_in_ci_a_browser_test_without_chromium_fails_saying_what_is_missing(
    tmp_path: Path,
) -> None:
    out = _run_without_chromium(tmp_path, ci="true")
    assert "1 error" in out and "1 skipped" not in out, out
    assert "/nonexistent/chromium not found" in " ".join(out.split()), out
