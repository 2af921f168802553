"""Retries, release before the result, and every path into the worker, against a real worker
and a real Redis:

* ``self.retry()`` and ``autoretry_for`` keep the lock and re-enter it (same fence, the
  retry is never blocked by its own lock, no duplicate slips in during the countdown);
* the lock is released before the result is visible (a caller who saw the result and
  publishes again gets a new run, never the finished one);
* the run-time check catches duplicates on every path into the worker: ``delay``,
  ``apply_async``, ``send_task`` by name, canvas members (chain, group) and a raw protocol-2
  message published by another service with kombu.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from celery import chain, group
from celery_fixtures import CeleryEnv, Gates, app_task, new_app
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from lock_helpers import wait_until

from celery_singleton_lock import LockedTask

gates = Gates()
app = new_app("csl_flow")


def _key() -> str:
    return uuid.uuid4().hex


@app_task(app, base=LockedTask, bind=True, name="flow.retrying", lock_ttl=30)
def retrying(self: Any, key: str) -> str:
    gates.mark(key, (self.request.retries, self.lock.fence, self.lock.owned()))
    if self.request.retries < 1:
        raise self.retry(countdown=1.5)
    return "done"


@app_task(app, base=LockedTask, bind=True, name="flow.retrying_pub", lock_at="publish", lock_ttl=30)
def retrying_pub(self: Any, key: str) -> str:
    gates.mark(key, (self.request.retries, self.lock.fence, self.lock.owned()))
    if self.request.retries < 1:
        raise self.retry(countdown=1.5)
    return "done"


#: the queue lease of the two tasks below, shorter than their retry's countdown
SHORT_QUEUE_TTL, LONG_COUNTDOWN = 1.0, 4.0


@app_task(
    app,
    base=LockedTask,
    bind=True,
    name="flow.retrying_long_pub",
    lock_at="publish",
    lock_queue_ttl=SHORT_QUEUE_TTL,
)
def retrying_long_pub(self: Any, key: str) -> str:
    gates.mark(key, self.request.retries)
    if self.request.retries < 1:
        raise self.retry(countdown=LONG_COUNTDOWN)
    return "done"


@app_task(
    app, base=LockedTask, bind=True, name="flow.retrying_long", lock_queue_ttl=SHORT_QUEUE_TTL
)
def retrying_long(self: Any, key: str) -> str:
    gates.mark(key, self.request.retries)
    if self.request.retries < 1:
        raise self.retry(countdown=LONG_COUNTDOWN)
    return "done"


@app_task(
    app,
    base=LockedTask,
    bind=True,
    name="flow.autoretry",
    lock_ttl=30,
    autoretry_for=(ValueError,),
    retry_kwargs={"max_retries": 3, "countdown": 0.7},
)
def autoretry(self: Any, key: str) -> int:
    gates.mark(key, (self.request.retries, self.lock.fence, self.lock.owned()))
    if self.request.retries < 2:
        raise ValueError("again")
    return int(self.request.retries)


@app_task(
    app,
    base=LockedTask,
    bind=True,
    name="flow.autoretry_fail",
    lock_ttl=30,
    autoretry_for=(ValueError,),
    retry_kwargs={"max_retries": 1, "countdown": 0.2},
)
def autoretry_fail(self: Any, key: str) -> None:
    gates.mark(key, self.lock.fence)
    raise ValueError("always")


class SlowHooks(LockedTask):
    """A task whose after_return hook is slow (as hooks and postrun receivers can be): the
    result is visible while it runs, so a lock released only there would be seen held."""

    def after_return(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.2)  # the slow hook (the scenario)
        super().after_return(*args, **kwargs)


@app_task(app, base=SlowHooks, name="flow.quick", lock_at="publish")
def quick(key: str, i: int = 0) -> int:
    gates.mark(key)
    return i


@app_task(app, base=LockedTask, name="flow.guarded", lock_ttl=30)
def guarded(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, base=LockedTask, name="flow.guarded_pub", lock_at="publish", lock_ttl=30)
def guarded_pub(key: str) -> str:
    gates.enter(key)
    return key


@app_task(app, name="flow.after")
def after(key: str) -> None:
    gates.mark(key)


#: the in-process worker and the settings of the conftest ``env`` fixture
CELERY_ENV = {"concurrency": 10}


# -- retries keep and re-enter the lock ------------------------------------------------------


@pytest.mark.parametrize("task", [retrying, retrying_pub], ids=["run", "publish"])
def test_self_retry_keeps_the_lock_through_the_countdown(env: CeleryEnv, task: Any) -> None:
    k = _key()
    r = task.delay(k)
    wait_until(lambda: gates.runs[k] == 1, 10)
    # the retry waits in its countdown: the lock is still the task's
    wait_until(lambda: env.state(r.id) == "RETRY", 5)
    assert task.lock_holder(k) == r.id
    dup = task.delay(k)
    if task is retrying_pub:
        assert dup.id == r.id  # deduplicated onto the retrying task
    else:
        env.wait_state(dup.id, "SKIPPED")
        assert env.meta(dup.id)["holder"] == r.id
    assert r.get(timeout=10) == "done"
    runs = gates.data[k]
    assert [retries for retries, _, _ in runs] == [0, 1]  # the retry ran: not blocked
    assert runs[0][1] == runs[1][1]  # one hold across the retry: the same fencing token
    assert all(owned for _, _, owned in runs)
    wait_until(lambda: not task.is_locked(k), 3)


@pytest.mark.parametrize("task", [retrying_long_pub, retrying_long], ids=["publish", "run"])
def test_a_parked_retry_keeps_the_lock_for_a_countdown_longer_than_the_queue_lease(
    env: CeleryEnv, task: Any
) -> None:
    """The parked hold's lease covers the retry's countdown plus ``lock_queue_ttl``, not the
    queue lease alone: past the queue lease (1 s), well inside the countdown (4 s), the lock
    is still the retrying task's and a duplicate is refused (deduplicated onto it at publish,
    skipped at run time)."""
    k = _key()
    r = task.delay(k)
    wait_until(lambda: env.state(r.id) == "RETRY", 10, "the retry to be sent")
    retried_at = time.monotonic()
    # a real duration (the scenario): the queue lease alone would have run out by then
    time.sleep(max(0.0, retried_at + SHORT_QUEUE_TTL + 1.0 - time.monotonic()))
    assert env.state(r.id) == "RETRY"  # still in its countdown
    assert task.lock_holder(k) == r.id
    dup = task.delay(k)
    if task is retrying_long_pub:
        assert dup.id == r.id  # deduplicated onto the retrying task
    else:
        env.wait_state(dup.id, "SKIPPED")
        assert env.meta(dup.id)["holder"] == r.id
    assert r.get(timeout=LONG_COUNTDOWN + 10) == "done"
    assert gates.data[k] == [0, 1]  # the first try and its retry; the duplicate never ran
    wait_until(lambda: not task.is_locked(k), 3)


def test_autoretry_for_keeps_the_lock_and_re_enters_it(env: CeleryEnv) -> None:
    k = _key()
    r = autoretry.delay(k)
    wait_until(lambda: gates.runs[k] == 1, 10)
    wait_until(lambda: env.state(r.id) == "RETRY", 5)
    dup = autoretry.delay(k)
    env.wait_state(dup.id, "SKIPPED")
    assert env.meta(dup.id)["holder"] == r.id
    assert r.get(timeout=10) == 2
    runs = gates.data[k]
    assert [retries for retries, _, _ in runs] == [0, 1, 2]
    assert len({fence for _, fence, _ in runs}) == 1
    assert all(owned for _, _, owned in runs)
    wait_until(lambda: not autoretry.is_locked(k), 3)


def test_autoretry_that_runs_out_of_retries_frees_the_lock(env: CeleryEnv) -> None:
    k = _key()
    r = autoretry_fail.delay(k)
    env.wait_state(r.id, "FAILURE")
    assert gates.runs[k] == 2
    assert len(set(gates.data[k])) == 1
    wait_until(lambda: not env.locks.exists(autoretry_fail.lock_key_for(k)), 3)


# -- released before the result is visible ---------------------------------------------------


def test_a_caller_who_saw_the_result_gets_a_new_run(env: CeleryEnv) -> None:
    k = _key()
    for i in range(30):
        r = quick.delay(k)
        assert r.get(timeout=10) == 0
        r2 = quick.delay(k)
        assert r2.id != r.id, f"iteration {i}: deduplicated onto the finished task"
        assert r2.get(timeout=10) == 0
    assert gates.runs[k] == 60  # every publish ran


# -- every path into the worker --------------------------------------------------------------


def _raw_message(env: CeleryEnv, name: str, args: list[Any]) -> str:
    """Publish a protocol-2 task message the way another service would: kombu only, no
    Celery publisher, no lock header."""
    task_id = str(uuid.uuid4())
    with Connection(env.app.conf.broker_url) as conn:  # type: ignore[no-untyped-call]  # kombu: unannotated
        producer = conn.Producer(serializer="json")
        producer.publish(
            [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
            exchange=Exchange("celery", "direct"),  # type: ignore[no-untyped-call]  # kombu: unannotated
            routing_key="celery",
            headers={
                "lang": "py",
                "task": name,
                "id": task_id,
                "root_id": task_id,
                "parent_id": None,
                "group": None,
                "shadow": None,
                "eta": None,
                "expires": None,
                "retries": 0,
                "timelimit": [None, None],
                "argsrepr": repr(args),
                "kwargsrepr": "{}",
                "origin": "another-service@host",
            },
            correlation_id=task_id,
            declare=[
                Queue("celery", Exchange("celery", "direct"), "celery"),  # type: ignore[no-untyped-call]  # kombu: unannotated
            ],
        )
    return task_id


def _duplicate(env: CeleryEnv, task: Any, path: str, k: str) -> list[str]:
    """Send the duplicate of ``task(k)`` through ``path``; the ids of the messages sent."""
    if path == "delay":
        return [task.delay(k).id]
    if path == "apply_async":
        return [task.apply_async(args=(k,)).id]
    if path == "send_task":
        return [env.app.send_task(task.name, args=[k]).id]
    if path == "chain":
        k2 = _key()
        res = chain(task.si(k), after.si(k2)).apply_async()
        env.wait_state(res.parent.id, "SKIPPED")
        assert gates.runs[k2] == 0  # the chain stopped at the skipped member
        return [res.parent.id]
    if path == "group":
        res = group(task.si(k), task.si(k)).apply_async()
        return [child.id for child in res.results]
    if path == "raw":
        return [_raw_message(env, task.name, [k])]
    raise AssertionError(path)


@pytest.mark.parametrize(
    "task,path",
    [
        (guarded, "delay"),
        (guarded, "apply_async"),
        (guarded, "send_task"),
        (guarded, "chain"),
        (guarded, "group"),
        (guarded, "raw"),
        (guarded_pub, "send_task"),
        (guarded_pub, "raw"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.name.split(".")[-1],
)
def test_the_run_time_check_catches_duplicates_on_every_path(
    env: CeleryEnv, task: Any, path: str
) -> None:
    k = _key()
    holder = task.delay(k)
    gates.wait_started(k)
    ids = _duplicate(env, task, path, k)
    assert ids and holder.id not in ids
    for task_id in ids:
        env.wait_state(task_id, "SKIPPED")
        assert env.meta(task_id)["holder"] == holder.id
    assert task.lock_holder(k) == holder.id  # the holder's lock is untouched
    gates.open(k)
    assert holder.get(timeout=10) == k
    assert gates.runs[k] == 1  # no duplicate's body ran
    wait_until(lambda: not task.is_locked(k), 3)


def test_a_raw_message_from_another_service_runs_and_locks(env: CeleryEnv) -> None:
    # the message has no lock header: the worker computes the key from its arguments
    k = _key()
    task_id = _raw_message(env, guarded.name, [k])
    gates.wait_started(k)
    assert guarded.lock_holder(k) == task_id
    dup = guarded.delay(k)
    env.wait_state(dup.id, "SKIPPED")
    gates.open(k)
    env.wait_state(task_id, "SUCCESS")
    wait_until(lambda: not guarded.is_locked(k), 3)


def test_a_canvas_member_of_a_publish_mode_task_is_deduplicated_at_publish(
    env: CeleryEnv,
) -> None:
    # lock_at="publish": the member goes through apply_async, so the duplicate is not even
    # sent (the run-time check is the second line, for the paths that bypass apply_async)
    k, k2 = _key(), _key()
    holder = guarded_pub.delay(k)
    gates.wait_started(k)
    res = chain(guarded_pub.si(k), after.si(k2)).apply_async()
    member = res.parent.id
    assert member != holder.id
    assert guarded_pub.lock_holder(k) == holder.id
    gates.open(k)
    assert holder.get(timeout=10) == k
    wait_until(lambda: not guarded_pub.is_locked(k), 3)
    assert env.state(member) == "FAILURE"  # never sent, never run: recorded failed
    assert gates.runs[k] == 1 and gates.runs[k2] == 0
