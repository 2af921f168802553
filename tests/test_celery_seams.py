"""Where an operator command or one feature meets another, on a real worker (and a real beat):
each hold is in a state of its own, and what acts on some holds acts on those only.

* ``celery locks purge --queued`` (after ``celery purge``) frees the locks of messages that wait
  in a queue unrun, and nothing else: not a running job's, not a cooldown's, not a retry's
  parked hold, not the beat leader's, not a plain lock under the same prefix.
* A debounced call made while a job's retry waits out its countdown does not replace that job:
  its run has started, so the call gets that job back.

The tasks are the fault tests' app's (``tests/faultapp.py``), run by an in-process worker
(threads pool) on a redis-server of this module's own; the beat is a ``celery beat`` process.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

import pytest
from beatproj.harness import Beat, leader
from celery import Celery
from celery_fixtures import cli_main
from celery_procs import new_job, records, redis_base
from faultapp import DATA_DB, LOCK_DB
from lock_helpers import START_TIMEOUT, wait_until

from celery_singleton_lock import LockSpace, ReentrantLock
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.timeout(START_TIMEOUT + 120)]


#: the threads of the module's in-process worker (the conftest's ``fault_worker``)
WORKER_CONCURRENCY = 3


def _state(app: Celery, task_id: str) -> str:
    return str(app.AsyncResult(task_id).state)


def _wait_state(app: Celery, task_id: str, state: str, timeout: float = 15.0) -> None:
    wait_until(lambda: _state(app, task_id) == state, timeout, f"task {task_id} to be {state}")


def _purge_queued(server: RedisServer) -> int:
    out = io.StringIO()
    url = f"{redis_base(server.port)}/{LOCK_DB}"
    with redirect_stdout(out), pytest.raises(SystemExit) as done:
        cli_main(["purge", "--queued", "--yes", "--json", "--url", url])
    assert done.value.code == 0, out.getvalue()
    released: int = json.loads(out.getvalue())["released"]
    return released


@pytest.mark.slow
def test_purge_queued_frees_only_the_locks_of_messages_that_wait_unrun(
    fault_server: RedisServer,
    fault_app: Celery,
    fault_worker: Any,
    fault_beat: Callable[..., Beat],
) -> None:
    locks = fault_server.client(db=LOCK_DB)
    space = LockSpace(locks)
    beat = fault_beat(fault_server)
    # A message that waits unrun: published to a queue no worker consumes.
    queued_job = new_job("queued")
    publish_work = fault_app.tasks["fault.publish_work"]
    queued = publish_work.apply_async((queued_job,), queue=new_job("nobody"))
    # A job that runs now (a run token of its own).
    running_job = new_job("running")
    running = fault_app.tasks["fault.work"].delay(running_job, 30.0)
    # A job that ran and cools down for a minute.
    cooled_job = new_job("cooled")
    cooled = fault_app.tasks["fault.cooled_long"].delay(cooled_job)
    # A job whose run asked for a retry in a minute: its hold waits, parked, for it.
    retried_job = new_job("retried")
    retried = fault_app.tasks["fault.retry_later"].delay(retried_job, 60.0)
    # A plain lock under the same prefix, and the beat leader's.
    plain = ReentrantLock(locks, new_job("plain"), ttl=60, renew=False)
    assert plain.acquire(blocking=False)
    wait_until(lambda: leader([beat], locks, "beat:faultapp"), START_TIMEOUT, "the beat to lead")

    _wait_state(fault_app, cooled.id, "SUCCESS")
    _wait_state(fault_app, retried.id, "RETRY")
    wait_until(lambda: records(fault_server.client(db=DATA_DB), "starts", running_job), 15)
    held_before = {
        "running": fault_app.tasks["fault.work"].lock_holder(running_job, 30.0),
        "cooldown": fault_app.tasks["fault.cooled_long"].lock_holder(cooled_job),
        "retry": fault_app.tasks["fault.retry_later"].lock_holder(retried_job),
    }
    assert held_before == {"running": running.id, "cooldown": cooled.id, "retry": retried.id}
    assert publish_work.lock_holder(queued_job) == queued.id

    assert _purge_queued(fault_server) == 1

    assert publish_work.lock_holder(queued_job) is None
    assert {
        "running": fault_app.tasks["fault.work"].lock_holder(running_job, 30.0),
        "cooldown": fault_app.tasks["fault.cooled_long"].lock_holder(cooled_job),
        "retry": fault_app.tasks["fault.retry_later"].lock_holder(retried_job),
    } == held_before
    assert space.inspect(plain.name).holder == plain.owner
    assert leader([beat], locks, "beat:faultapp") is beat
    # The freed job can be published again; the job cooling down cannot.
    assert publish_work.apply_async((queued_job,), queue=new_job("nobody")).id != queued.id
    plain.release()


def test_a_debounced_call_during_a_retry_countdown_gets_that_job_back(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.debounced_retry"]
    job = new_job("debounced-retry")
    first = task.delay(job, 3.0)
    # Its first run started and asked for a retry in 3 s: the retry waits, its hold parked.
    _wait_state(fault_app, first.id, "RETRY")
    assert len(records(data, "starts", job)) == 1
    second = task.delay(job, 3.0)
    assert second.id == first.id  # not replaced: its run has started
    _wait_state(fault_app, first.id, "SUCCESS")
    starts = records(data, "starts", job)
    assert [s["id"] for s in starts] == [first.id, first.id]  # the run, then its retry
    assert task.lock_holder(job) is None
