"""The Redis of the locks is down: nothing listens, so connections are refused (the broker and
the result backend are fine). A publish raises ``LockBackendError`` and sends nothing, a run
fails loudly; with ``singleton_lock_on_backend_error="proceed"`` both go on without the lock and
log at ERROR. Nothing is dropped silently. (A Redis that hangs instead, accepting connections and
never answering, is the slow case: see test_celery_hung_redis.py.)"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery_fixtures import CeleryEnv, Gates, app_task, celery_env, new_app
from lock_helpers import command_calls

from celery_singleton_lock import LockBackendError, LockedTask
from celery_singleton_lock.testing import free_port

# the adversarial fault suite (`pytest -m faults`): real workers killed, revoked, stopped
pytestmark = pytest.mark.faults

gates = Gates()
app = new_app("csl_down")


@app_task(app, base=LockedTask, name="down.pub", lock_at="publish")
def pub(key: str) -> str:
    gates.mark(key)
    return key


@app_task(app, base=LockedTask, name="down.run")
def run(key: str) -> str:
    gates.mark(key)
    return key


@pytest.fixture(scope="module")
def env() -> Iterator[CeleryEnv]:
    closed = free_port()  # nothing listens here
    with celery_env(
        app,
        gates,
        concurrency=4,
        singleton_lock_redis_url=f"redis://127.0.0.1:{closed}/0",
        singleton_lock_redis_options={"socket_timeout": 0.3, "socket_connect_timeout": 0.3},
    ) as env:
        yield env


def test_a_publish_raises_and_sends_nothing(env: CeleryEnv, policy: Any) -> None:
    policy("raise")
    k = uuid.uuid4().hex
    started = time.monotonic()
    with pytest.raises(LockBackendError) as info:
        pub.apply_async((k,), queue="csl-nowhere")
    assert time.monotonic() - started < 5  # bounded, no hang
    assert isinstance(info.value.__cause__, redis.RedisError)
    assert env.broker.llen("csl-nowhere") == 0  # nothing was sent
    pushed = command_calls(env.broker).get("lpush", 0)
    with pytest.raises(LockBackendError):
        pub.delay(k)
    # not sent either (a message is an LPUSH), so nothing can run
    assert command_calls(env.broker).get("lpush", 0) == pushed
    assert gates.runs[k] == 0


def test_a_run_fails_loudly_instead_of_running_unlocked(env: CeleryEnv, policy: Any) -> None:
    policy("raise")
    k = uuid.uuid4().hex
    r = run.delay(k)  # lock_at="run": the publish does not touch Redis
    env.wait_state(r.id, "FAILURE")
    assert isinstance(r.result, LockBackendError)
    assert gates.runs[k] == 0


def test_proceed_publishes_runs_and_logs_at_error(
    env: CeleryEnv, policy: Any, caplog: pytest.LogCaptureFixture
) -> None:
    policy("proceed")
    caplog.set_level(logging.ERROR, logger="celery_singleton_lock")
    k = uuid.uuid4().hex
    r1 = pub.delay(k)
    assert r1.get(timeout=10) == k
    r2 = run.delay(k)
    assert r2.get(timeout=10) == k
    assert gates.runs[k] == 2
    # ours only, of this test's tasks: Celery's trace logger may report a task of an earlier
    # test ending now, and a background retry of an earlier test its end
    errors = [
        rec
        for rec in caplog.records
        if rec.levelno >= logging.ERROR
        and rec.name.startswith("celery_singleton_lock")
        and any(name in rec.getMessage() for name in ("down.pub", "down.run"))
    ]
    loggers = {rec.name for rec in errors}
    assert "celery_singleton_lock.publish" in loggers  # the publish went on without the lock
    assert "celery_singleton_lock.run" in loggers  # so did the runs
    assert all("WITHOUT the lock" in rec.getMessage() for rec in errors)
    assert any("down.pub" in rec.getMessage() for rec in errors)
