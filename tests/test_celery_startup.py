"""Settings are checked where a mistake is cheap to fix, and named as the user wrote them:
Django's system check, a worker's and beat's start (they refuse to start), the first publish of
a process (it raises before anything is written). A misspelt setting name is reported with a
suggestion. The ``singleton_lock_tasks`` setting locks its tasks in the worker of an app that
uses the package (a ``LockedTask``) with no ``install()`` call anywhere; the worker of an app
that never uses it gets nothing from the package being installed. A run that fails before its
body frees its job's publish lock. Real processes: ``manage.py check``, ``celery worker``,
``celery beat``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery_fixtures import Gates, app_task, configure, own_redis_server, running_worker
from celery_procs import WorkerProcess, redis_base
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import LockBackendError, LockedTask
from celery_singleton_lock.testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "djangoproj"

WRONG_TTL = {"CELERY_SINGLETON_LOCK_TTL": "30s"}
MISSPELT = {"CELERY_SINGLETON_LOCK_TIMEOUT": 5}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with own_redis_server() as server:
        yield server


def _env(server: RedisServer | None, extra: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env["CSL_DJANGO_EXTRA"] = json.dumps(extra)
    env["CSL_DJANGO_REDIS"] = redis_base(server.port) if server else "redis://127.0.0.1:1"
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(
    args: list[str],
    server: RedisServer | None,
    extra: dict[str, Any],
    timeout: float = START_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT,
        env=_env(server, extra),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- Django's system check ---------------------------------------------------------------------


def test_manage_py_check_passes_good_settings() -> None:
    done = _run(["manage.py", "check"], None, {})
    assert done.returncode == 0, done.stderr


def test_manage_py_check_names_a_wrong_setting_as_written() -> None:
    done = _run(["manage.py", "check"], None, WRONG_TTL)
    assert done.returncode != 0
    assert "celery_singleton_lock.E001" in done.stderr
    assert "CELERY_SINGLETON_LOCK_TTL must be a number of seconds such as 30, got '30s'" in (
        done.stderr
    )


def test_manage_py_check_suggests_the_setting_a_misspelt_name_meant() -> None:
    done = _run(["manage.py", "check"], None, MISSPELT)
    assert done.returncode != 0
    assert (
        "CELERY_SINGLETON_LOCK_TIMEOUT is not a celery-singleton-lock setting (did you mean "
        "CELERY_SINGLETON_LOCK_" in done.stderr
    )


# -- the worker, beat and the first publish -----------------------------------------------------


@pytest.mark.slow  # a `celery worker` process
@pytest.mark.parametrize("extra", [WRONG_TTL, MISSPELT], ids=["wrong-value", "misspelt-name"])
def test_a_worker_with_a_setting_it_cannot_use_does_not_start(
    server: RedisServer, extra: dict[str, Any]
) -> None:
    done = _run(
        ["-m", "celery", "-A", "djangoproj", "worker", "-P", "solo", "--without-mingle"],
        server,
        extra,
    )
    assert done.returncode != 0
    name = next(iter(extra))
    said = done.stderr + done.stdout
    assert said.count(f"the worker cannot start: {name}") == 1, said  # said once, not twice


@pytest.mark.slow  # a `celery beat` process
def test_beat_with_a_wrong_setting_does_not_start(server: RedisServer, tmp_path: Path) -> None:
    done = _run(
        ["-m", "celery", "-A", "djangoproj", "beat", "-s", str(tmp_path / "schedule")],
        server,
        WRONG_TTL,
    )
    assert done.returncode != 0
    said = done.stderr + done.stdout
    assert said.count("beat cannot start: CELERY_SINGLETON_LOCK_TTL must be") == 1, said


def test_the_first_publish_with_a_wrong_setting_raises_before_writing(
    server: RedisServer,
) -> None:
    locks = server.client(db=2)
    broker = server.client(db=0)
    locks.flushdb()
    broker.flushdb()
    publish = (
        "import djangoproj\n"
        "from djangoproj.celery import report\n"
        "try:\n"
        "    report.delay(7)\n"
        "except TypeError as exc:\n"
        "    print('raised:', exc)\n"
        "else:\n"
        "    print('published')\n"
    )
    done = _run(["-c", publish], server, WRONG_TTL)
    assert done.returncode == 0, done.stderr
    assert "raised: CELERY_SINGLETON_LOCK_TTL must be a number of seconds" in done.stdout
    assert locks.dbsize() == 0, "a lock was taken for a publish that failed"
    assert broker.llen("celery") == 0, "a message was sent"


# -- singleton_lock_tasks with no install() anywhere --------------------------------------------


class SettingsAppWorker(WorkerProcess):
    """A ``celery worker`` of tests/settingsapp.py, which uses the package through a
    ``LockedTask`` only and never calls ``install()``."""

    module = "tests.settingsapp"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "celery", "-A", self.module, "worker",
            "-P", self.pool, "-c", str(self.concurrency), "-n", self.hostname,
            "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "info",
        ]  # fmt: skip


class PlainAppWorker(SettingsAppWorker):
    """A ``celery worker`` of tests/plainapp.py, which never uses the package, logging at DEBUG
    with each line's logger name."""

    module = "tests.plainapp"

    def command(self) -> list[str]:
        return [*super().command()[:-1], "debug"]


@pytest.mark.slow  # a `celery worker` process
def test_an_app_that_never_uses_the_package_is_not_changed_by_it(
    server: RedisServer, tmp_path: Path
) -> None:
    """The ``celery`` command loads the package's ``locks`` command (an entry point) for every
    run; that is all it does. A worker of an app that sets ``singleton_lock_tasks`` and a
    misspelt ``singleton_lock_tll`` but never imports the package starts, runs the listed task
    as a plain task, has none of the package's signal receivers, logs nothing from the
    package's loggers and writes nothing to Redis but Celery's own keys."""
    base = redis_base(server.port)
    broker = server.client(db=0)
    broker.flushdb()
    publisher = Celery("plainapp-publisher", set_as_current=False)
    publisher.conf.update(broker_url=f"{base}/0", result_backend=f"{base}/1")
    env = {"CSL_PLAIN_REDIS": base}
    with PlainAppWorker(base, tmp_path, pool="solo", env=env) as worker:
        first = publisher.send_task("plainapp.report", (7,))
        second = publisher.send_task("plainapp.report", (7,))
        done = first.get(timeout=15)
        assert second.get(timeout=15) == done  # the duplicate ran too: nothing locks it
        log = worker.log()
    publisher.close()
    assert done == {"day": 7, "classes": [], "receivers": []}
    assert "celery_singleton_lock" not in log, log
    assert "singleton_lock_tll" not in log, log  # not read, so not reported
    # the format is in use (a line of the package's would show its logger's name)
    received = r"celery\.worker\.strategy\] Task plainapp\.report\[[-0-9a-f]+\] received"
    assert re.search(received, log), log
    assert not [k for k in broker.scan_iter() if not k.startswith((b"_kombu", b"unacked"))]


@pytest.mark.slow  # a `celery worker` process
def test_a_worker_of_an_app_using_only_locked_task_checks_its_settings(
    server: RedisServer, tmp_path: Path
) -> None:
    """The same misspelt name in an app that uses the package (a ``LockedTask``, no
    ``install()``) stops its worker, with the name it meant."""
    env = {
        "CSL_SETTINGS_REDIS": redis_base(server.port),
        "CSL_SETTINGS_EXTRA": json.dumps({"singleton_lock_tll": 30}),
    }
    worker = SettingsAppWorker(redis_base(server.port), tmp_path, pool="solo", env=env)
    with pytest.raises(AssertionError, match="worker exited with 1 at start") as stopped:
        worker.start()
    said = str(stopped.value)
    assert said.count("the worker cannot start: singleton_lock_tll is not a") == 1, said
    assert "did you mean singleton_lock_ttl" in said, said


@pytest.mark.slow  # a `celery worker` process
def test_the_setting_s_tasks_are_locked_without_install(
    server: RedisServer, tmp_path: Path
) -> None:
    base = redis_base(server.port)
    # the publisher: the same settings, no import of settingsapp, no install()
    publisher = Celery("settingsapp-publisher", set_as_current=False)
    publisher.conf.update(broker_url=f"{base}/0", result_backend=f"{base}/1")
    data = server.client(db=3)
    key = uuid.uuid4().hex
    env = {"CSL_SETTINGS_REDIS": base}
    with SettingsAppWorker(base, tmp_path, concurrency=2, env=env) as worker:
        worker.wait_log(r"locking settingsapp\.report, settingsapp\.slow in this worker", 5)
        first = publisher.send_task("settingsapp.slow", (key, 3.0))
        wait_until(lambda: data.llen(f"runs:{key}") == 1, 15, "the first run to start")
        duplicate = publisher.send_task("settingsapp.slow", (key, 3.0))
        wait_until(
            lambda: publisher.AsyncResult(duplicate.id).state == "SKIPPED",
            15,
            "the duplicate to be skipped",
        )
        assert first.get(timeout=15) == key
        assert data.llen(f"runs:{key}") == 1, "the duplicate ran beside the first"
    publisher.close()


@pytest.mark.slow  # a `celery worker` process
def test_without_install_a_duplicate_queued_behind_the_first_runs_again(
    server: RedisServer, tmp_path: Path
) -> None:
    """What the docs say of the setting alone: a lock_at="publish" task published by a process
    without install(app) is not kept out of the queue, and a duplicate that reaches the worker
    after the first run ended (queued behind it, one worker process) is no duplicate to the
    run-time lock: both run."""
    base = redis_base(server.port)
    publisher = Celery("settingsapp-publisher", set_as_current=False)
    publisher.conf.update(broker_url=f"{base}/0", result_backend=f"{base}/1")
    data = server.client(db=3)
    key = uuid.uuid4().hex
    # both queued before any worker runs: the second reaches the worker after the first ended
    first = publisher.send_task("settingsapp.report", (key,))
    second = publisher.send_task("settingsapp.report", (key,))
    assert first.id != second.id
    env = {"CSL_SETTINGS_REDIS": base}
    with SettingsAppWorker(base, tmp_path, concurrency=1, env=env):
        assert first.get(timeout=15) == key
        assert second.get(timeout=15) == key
    assert data.llen(f"runs:{key}") == 2, "the duplicate queued behind the first did not run"
    publisher.close()
    for page in ("configuration.md", "django.md"):
        text = " ".join((ROOT / "docs" / page).read_text(encoding="utf-8").split())
        assert "only while the job it duplicates still runs" in text, page


# -- a run that fails before its body -----------------------------------------------------------

gates = Gates()
app = Celery("csl_startup", set_as_current=False)


@app_task(app, base=LockedTask, name="startup.pub", lock_at="publish")
def pub(key: str) -> str:
    gates.mark(key)
    return key


def test_a_run_that_fails_before_its_body_frees_its_publish_lock() -> None:
    """The locks' Redis stalls (SIGSTOP) as the run starts: the run fails with
    LockBackendError; once Redis answers again its publish lock is gone (released from the
    background), so publishing the job again sends a new one instead of returning the failed
    one for the rest of the queue lease."""
    with own_redis_server() as broker, own_redis_server() as lock_server:
        configure(
            app,
            broker,
            singleton_lock_redis_url=f"redis://127.0.0.1:{lock_server.port}/0",
            singleton_lock_redis_options={"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
            # each call gives up after a second (the default, 5 s, only makes the test longer)
            singleton_lock_backend_timeout=1.0,
        )
        locks: redis.Redis = lock_server.client()
        with running_worker(app, concurrency=2):
            key = uuid.uuid4().hex
            first = pub.apply_async((key,), countdown=1.5)
            assert locks.dbsize() > 0, "the publish took no lock"
            assert lock_server.process is not None
            os.kill(lock_server.process.pid, signal.SIGSTOP)
            try:
                with pytest.raises(LockBackendError):
                    first.get(timeout=30)
            finally:
                os.kill(lock_server.process.pid, signal.SIGCONT)
            assert gates.runs[key] == 0
            wait_until(lambda: not pub.is_locked(key), 15, "the failed job's publish lock to go")
            again = pub.delay(key)
            assert again.id != first.id
            assert again.get(timeout=15) == key
