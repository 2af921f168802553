"""The celery-once drop-in, against a real worker and a real Redis.

Written from celery-once 3.0.1's documented behaviour, with only the import changed: a
duplicate ``.delay()`` raises ``AlreadyQueued`` (``countdown``, ``message``) or, ``graceful``,
returns a ``REJECTED`` result; a new id once the first has ended; ``keys`` picks the key;
``timeout`` (task, call, ``ONCE["settings"]["default_timeout"]``) sets the queued lock's lease;
``unlock_before_run``; ``once_backend.clear_lock``. Then where we behave better on purpose: a
retry keeps its lock and runs, a ``send_task`` duplicate is skipped at run time, a killed
worker's lock ends within one running lease.
"""

from __future__ import annotations

import pickle
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_fixtures import (
    CeleryEnv,
    Gates,
    app_task,
    bare_app,
    new_app,
)
from celery_procs import close_app, hanging_job
from lock_helpers import wait_until

from celery_singleton_lock import AlreadyQueuedError, MisconfiguredError
from celery_singleton_lock.compat.once import AlreadyQueued, QueueOnce
from celery_singleton_lock.testing import RedisServer

gates = Gates()
app = new_app("csl_compat_once")


def _key() -> str:
    return uuid.uuid4().hex


@app_task(app, base=QueueOnce, shared=False, name="once.held")
def held(key: str, n: int = 0) -> str:
    gates.enter(key)
    return key


@app_task(app, base=QueueOnce, shared=False, name="once.graceful", once={"graceful": True})
def graceful(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=QueueOnce, shared=False, name="once.keyed", once={"keys": ["key"]})
def keyed(key: str, note: str) -> str:
    gates.enter(key)
    return note


@app_task(app, base=QueueOnce, shared=False, name="once.early", once={"unlock_before_run": True})
def early(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=QueueOnce, shared=False, name="once.failing")
def failing(key: str) -> None:
    gates.mark(key)
    raise ValueError("fails on purpose")


@app_task(app, base=QueueOnce, shared=False, bind=True, name="once.retrying")
def retrying(self: Any, key: str) -> int:
    gates.mark(key, self.request.retries)
    if self.request.retries < 1:
        raise self.retry(countdown=1.5)
    return int(self.request.retries)


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 6}


def test_a_duplicate_raises_already_queued_and_a_new_id_follows_the_end(env: CeleryEnv) -> None:
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    with pytest.raises(AlreadyQueued) as caught:
        held.delay(key)
    error = caught.value
    assert 0 < error.countdown <= 30  # the running lease left (renewed), in seconds
    assert error.message == f"Expires in {error.countdown} seconds" == str(error)
    assert isinstance(error, AlreadyQueuedError) and error.task_id == first.id
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.countdown, copy.task_id, copy.message) == (
        error.countdown,
        first.id,
        error.message,
    )
    assert held.delay(key, 1).id != first.id  # other arguments: another job
    gates.open(key)
    assert first.get(timeout=10) == key
    again = held.delay(key)
    gates.open(key)
    assert again.get(timeout=10) == key


def test_a_failed_task_frees_its_lock(env: CeleryEnv) -> None:
    key = _key()
    first = failing.delay(key)
    with pytest.raises(ValueError, match="fails on purpose"):
        first.get(timeout=10)
    assert failing.delay(key).id != first.id


def test_graceful_on_the_task_or_the_call_returns_a_rejected_result(env: CeleryEnv) -> None:
    key = _key()
    first = graceful.delay(key)
    gates.wait_started(key)
    duplicate = graceful.delay(key)
    assert duplicate.state == "REJECTED" and duplicate.result is None
    other = _key()
    held_first = held.delay(other)
    gates.wait_started(other)
    assert held.apply_async(args=(other,), once={"graceful": True}).state == "REJECTED"
    with pytest.raises(AlreadyQueued):
        graceful.apply_async(args=(key,), once={"graceful": False})  # the call wins
    gates.open(key)
    gates.open(other)
    first.get(timeout=10)
    held_first.get(timeout=10)


def test_a_call_accepts_every_once_key_celery_once_accepts(
    env: CeleryEnv, caplog: pytest.LogCaptureFixture
) -> None:
    """celery-once's ``apply_async(once=...)`` takes the task's keys too (its docs list
    ``keys``) and applies ``graceful`` and ``timeout`` only: so does the drop-in, and says that
    the others do nothing there; a misspelt key still raises."""
    key = _key()
    first = held.apply_async((key,), once={"keys": ["key"], "unlock_before_run": True})
    gates.wait_started(key)
    assert "ignores ['keys', 'unlock_before_run']" in caplog.text
    duplicate = held.apply_async((key,), once={"graceful": True, "keys": ["n"], "timeout": 5})
    assert duplicate.state == "REJECTED"
    with pytest.raises(TypeError, match=r"unknown key\(s\) \['key'\]"):
        held.apply_async((key,), once={"key": ["key"]})
    gates.open(key)
    first.get(timeout=10)


def test_keys_pick_the_key(env: CeleryEnv) -> None:
    key = _key()
    first = keyed.delay(key, "a")
    gates.wait_started(key)
    with pytest.raises(AlreadyQueued):
        keyed.delay(key, "b")  # note is not part of the key
    with pytest.raises(AlreadyQueued):
        keyed.delay(note="c", key=key)
    gates.open(key)
    assert first.get(timeout=10) == "a"


def test_unlock_before_run_frees_the_lock_as_the_run_starts(env: CeleryEnv) -> None:
    key = _key()
    first = early.delay(key)
    gates.wait_started(key)
    second = early.delay(key)  # the first runs, its lock is gone: not a duplicate
    assert second.id != first.id
    gates.open(key)
    first.get(timeout=10)
    second.get(timeout=10)


def test_clear_lock_frees_a_job(env: CeleryEnv) -> None:
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    assert held.once_backend.clear_lock(held.get_key((key,))) is True
    second = held.delay(key)
    assert second.id != first.id
    gates.open(key)
    first.get(timeout=10)
    second.get(timeout=10)


# -- where we behave better on purpose -----------------------------------------------------


def test_a_retry_keeps_its_lock_and_runs(env: CeleryEnv) -> None:
    """celery-once let a duplicate in while the retry waited (the lock was cleared as the
    first try returned)."""
    key = _key()
    first = retrying.delay(key)
    wait_until(lambda: gates.data[key] == [0], 10)
    # the retry sent, its countdown running
    wait_until(lambda: env.state(first.id) == "RETRY", 10, "the retry to be sent")
    with pytest.raises(AlreadyQueued):
        retrying.delay(key)
    assert first.get(timeout=15) == 1
    assert gates.data[key] == [0, 1]


def test_a_send_task_duplicate_is_skipped_at_run_time(env: CeleryEnv) -> None:
    key = _key()
    first = held.delay(key)
    gates.wait_started(key)
    by_name = env.app.send_task("once.held", args=(key,))
    assert env.wait_state(by_name.id, "SKIPPED") == "SKIPPED"
    gates.open(key)
    first.get(timeout=10)
    assert gates.runs[key] == 1


# -- the ONCE setting, without a worker -----------------------------------------------------


def test_the_once_setting_gives_the_redis_and_the_timeouts(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/8"
    bare = bare_app(
        redis_server,
        "csl_compat_once_bare",
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": url, "default_timeout": 120},
        },
    )

    @app_task(bare, base=QueueOnce, shared=False, name="bare.job")
    def job(x: int) -> int:
        return x

    @app_task(bare, base=QueueOnce, shared=False, name="bare.short", once={"timeout": 40})
    def short(x: int) -> int:
        return x

    db8 = redis.Redis(port=redis_server.port, db=8, decode_responses=True)
    db8.flushdb()

    def lease(task: Any, *args: Any) -> int:
        return int(db8.pttl(f"lock:{{{task.get_key(args)}}}"))

    try:
        job.delay(1)
        assert 110_000 < lease(job, 1) <= 120_000  # default_timeout
        short.delay(1)
        assert 30_000 < lease(short, 1) <= 40_000  # the task's timeout wins
        job.apply_async(args=(2,), once={"timeout": 10})
        assert 0 < lease(job, 2) <= 10_000  # the call's wins
        assert job.default_timeout == 120
        with pytest.raises(AlreadyQueued):
            job.delay(1)
    finally:
        db8.flushdb()
        close_app(bare)


def test_the_file_backend_is_refused_when_the_task_is_bound(redis_server: RedisServer) -> None:
    bare = bare_app(
        redis_server,
        "csl_compat_once_bare",
        ONCE={"backend": "celery_once.backends.File", "settings": {"location": "/tmp/x"}},
    )

    @app_task(bare, base=QueueOnce, shared=False, name="bare.job")
    def job(x: int) -> int:
        return x

    with pytest.raises(MisconfiguredError, match=r"File backend is not supported.*Redis"):
        bare.finalize()
    close_app(bare)


@pytest.mark.parametrize(
    ("once", "error", "match"),
    [
        ({"gracefull": True}, TypeError, r"unknown key\(s\) \['gracefull'\]"),
        ({"graceful": "yes"}, TypeError, r"once\['graceful'\] must be True or False"),
        ({"timeout": 0}, ValueError, r"once\['timeout'\] must be > 0"),
        ({"keys": ["nope"]}, ValueError, r"once\['keys'\] \(lock_unique_on\) names \['nope'\]"),
    ],
)
def test_bad_once_values_name_the_option(
    once: dict[str, Any], error: type[Exception], match: str
) -> None:
    bare = new_app("csl_compat_once_bad")

    @app_task(bare, base=QueueOnce, shared=False, name="bad.job", once=once)
    def job(x: int) -> None: ...

    with pytest.raises(error, match=match):
        bare.finalize()
    close_app(bare)


# -- a killed worker ------------------------------------------------------------------------


@pytest.mark.faults
@pytest.mark.slow  # a `celery worker` process, SIGKILLed
def test_a_killed_workers_lock_ends_within_one_running_lease(
    make_redis_server: Any, tmp_path: Path
) -> None:
    """celery-once kept it for the whole timeout (an hour by default)."""
    server: RedisServer = make_redis_server()
    with hanging_job(server.port, tmp_path, "fault.once_hang") as (task, job, _, worker):
        with pytest.raises(AlreadyQueued):
            task.delay(job, 60)
        worker.kill_group()
        killed = time.monotonic()

        def accepted() -> bool:
            try:
                task.delay(job, 60)
            except AlreadyQueued:
                return False
            return True

        wait_until(accepted, 10)
        assert time.monotonic() - killed < 2 + 1.5  # the running lease (lock_ttl=2), plus slack
