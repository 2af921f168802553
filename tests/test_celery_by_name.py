"""A task sent by name from a process that does not import it, beside the same task called
through its object: one job, one lock, whichever publisher sent it.

``install(app, tasks=...)`` in a process that only knows the task's name locks its messages
with a stand-in that has the task's options but not its parameters. The worker names a call's
lock after the arguments bound to the task's parameters, so the stand-in takes a lock at publish
only where its name is the worker's (``lock_key``, or every ``lock_unique_on`` argument given by
keyword); any other call is sent without one and checked by the worker as it starts. These
tests run the fault tests' app on a prefork ``celery worker``; the name-only publisher is an app
of its own that registers none of the tasks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import new_app
from celery_procs import WorkerProcess, close_app, new_job, records, redis_base
from faultapp import BROKER_DB, DATA_DB, LOCK_DB, RESULT_DB, _job_key
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import install
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(START_TIMEOUT + 120)]

#: a queue no worker reads: the message waits there, holding what its publish took
NOWHERE = "by-name-nowhere"


@pytest.fixture(scope="module")
def worker(fault_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with WorkerProcess(
        redis_base(fault_server.port), tmp_path_factory.mktemp("by-name"), concurrency=3
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def names(fault_server: RedisServer) -> Iterator[Celery]:
    """A publisher that does not import the tasks: it knows their names and lock options."""
    base = redis_base(fault_server.port)
    app = new_app("byname")
    app.conf.update(
        broker_url=f"{base}/{BROKER_DB}",
        result_backend=f"{base}/{RESULT_DB}",
        singleton_lock_redis_url=f"{base}/{LOCK_DB}",
        task_default_queue="fault",
    )
    install(
        app,
        tasks={
            "fault.digest": {"lock_at": "publish", "lock_unique_on": ["job"]},
            "fault.digest_all": {"lock_at": "publish"},
            "fault.web_queued": {"lock_at": "queue", "lock_key": _job_key},
        },
    )
    yield app
    close_app(app)


def _state(app: Celery, task_id: str) -> str | None:
    raw = app.backend.client.get(f"celery-task-meta-{task_id}")
    return None if raw is None else str(json.loads(raw)["status"])


def _holder(app: Celery, task_id: str) -> str:
    raw = app.backend.client.get(f"celery-task-meta-{task_id}")
    return str(json.loads(raw)["result"]["holder"])


def _starts(data: Any, job: str) -> list[str]:
    return [s["id"] for s in records(data, "starts", job)]


def test_a_call_sent_by_name_never_takes_another_job_s_lock(
    fault_server: RedisServer, fault_app: Celery, names: Celery, worker: Any
) -> None:
    """``lock_unique_on=["job"]``: user 8's call sent by name runs while user 7's job runs
    (the stand-in used to name every call's lock after ``job=None``: one lock for all, and the
    worker skipped user 8 as a duplicate of user 7); user 7's own duplicate is skipped."""
    data = fault_server.client(db=DATA_DB)
    digest = fault_app.tasks["fault.digest"]
    user7, user8 = new_job("user7"), new_job("user8")
    first = digest.delay(user7)
    wait_until(lambda: _starts(data, user7) == [first.id], 20, "user 7's job to start")
    data.set(f"go:{user8}", 1)
    other = names.send_task("fault.digest", args=[user8])
    wait_until(lambda: _state(names, other.id) in ("SUCCESS", "SKIPPED"), 20, "user 8's call")
    assert _state(names, other.id) == "SUCCESS", worker.log()[-3000:]
    assert _starts(data, user8) == [other.id]
    dup = names.send_task("fault.digest", args=[user7], kwargs={"day": "monday"})
    wait_until(lambda: _state(names, dup.id) is not None, 20, "user 7's duplicate to end")
    assert _state(names, dup.id) == "SKIPPED"
    assert _holder(names, dup.id) == first.id
    data.set(f"go:{user7}", 1)
    assert first.get(timeout=20) == first.id
    assert _starts(data, user7) == [first.id]


def test_the_same_call_by_name_and_through_the_task_is_one_job(
    fault_server: RedisServer,
    fault_app: Celery,
    names: Celery,
    worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without ``lock_unique_on`` the lock is named after every argument, defaults filled in:
    the stand-in cannot name it, so it sends the call without a lock, and the worker checks it
    under the name ``.delay()`` takes. Both ways round, one run (the stand-in's own name made
    two locks of one job: both ran at once)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.digest_all"]
    # The task object first, then by name: the message by name is skipped at the worker.
    job = new_job("object-first")
    first = task.delay(job)
    wait_until(lambda: _starts(data, job) == [first.id], 20, "the first run")
    with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.install"):
        dup = names.send_task("fault.digest_all", args=[job])
    assert "does not import the task" in caplog.text
    wait_until(
        lambda: _state(names, dup.id) is not None or len(_starts(data, job)) > 1,
        20,
        "the call by name to be skipped",
    )
    assert _starts(data, job) == [first.id]
    assert _state(names, dup.id) == "SKIPPED"
    assert _holder(names, dup.id) == first.id
    data.set(f"go:{job}", 1)
    assert first.get(timeout=20) == first.id
    # By name first, then the task object: the run holds the lock under the task's name for
    # the call, and the publish through the task object is deduplicated onto it.
    job = new_job("name-first")
    by_name = names.send_task("fault.digest_all", args=[job])
    wait_until(lambda: _starts(data, job) == [by_name.id], 20, "the run sent by name")
    assert task.lock_holder(job) == by_name.id
    assert task.delay(job, 30.0).id == by_name.id
    data.set(f"go:{job}", 1)
    assert by_name.get(timeout=20) == by_name.id
    assert _starts(data, job) == [by_name.id]


def test_the_stand_in_takes_the_worker_s_lock_where_it_can_name_it(
    fault_app: Celery, names: Celery, worker: Any
) -> None:
    """Every ``lock_unique_on`` argument by keyword, or a ``lock_key``: the stand-in names the
    lock as the worker does, takes it at publish, and the task object's publish of the same
    job (positional, another value of an argument outside the key) finds it."""
    digest = fault_app.tasks["fault.digest"]
    job = new_job("keyword")
    sent = names.send_task("fault.digest", kwargs={"job": job, "day": "friday"}, queue=NOWHERE)
    assert digest.lock_holder(job) == sent.id
    assert digest.delay(job, "monday").id == sent.id
    assert digest.release_lock(job)
    queued = fault_app.tasks["fault.web_queued"]
    job = new_job("lock-key")
    sent = names.send_task("fault.web_queued", args=[job], queue=NOWHERE)
    assert queued.lock_holder(job) == sent.id
    assert queued.release_lock(job)
