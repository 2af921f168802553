"""An eager call (``task.apply()``, or a call under ``task_always_eager``) whose job's lock is
held by another holder, on a real redis-server, in every mode and with every
``lock_on_locked`` the class check admits.

An eager call runs in the caller: it cannot wait in a queue, nor come back later (Celery's
eager retry runs the retry at once, in the same stack). So it ends as a run-time duplicate
does eagerly in every mode: its body does not run, its ``EagerResult`` is ``IGNORED``
(``"skip"``, ``"wait"`` after its timeout, and ``"retry"``), or ``FAILURE`` with
``TaskLockedError`` (``"raise"``); never a ``RecursionError``, and the holder's lock is left
as it was. Eager is the scenario here, not a stand-in for a worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import app_task, configure, new_app

from celery_singleton_lock import LockedTask, TaskLockedError
from celery_singleton_lock.testing import RedisServer

MODES = ["run", "publish", "queue"]
CHOICES = ["skip", "retry", "wait", "raise"]


@pytest.fixture
def app(redis_server: RedisServer) -> Iterator[Celery]:
    made = new_app("eager")
    configure(made, redis_server)
    yield made
    made.close()


def _task(app: Celery, lock_at: str, lock_on_locked: str, **options: Any) -> Any:
    """``lock_at``: a mode, or ``rate.<mode>`` (a task name of its own)."""
    runs: list[int] = []
    if lock_on_locked == "wait":
        options["lock_wait_timeout"] = 0.2
    if lock_on_locked == "retry":
        options["lock_retry_countdown"] = 0.1

    @app_task(
        app, base=LockedTask, name=f"eager.{lock_at}.{lock_on_locked}", shared=False,
        lock_at=lock_at.rpartition(".")[2], lock_on_locked=lock_on_locked,
        lock_unique_on=["n"], **options,
    )  # fmt: skip
    def job(n: int) -> int:
        runs.append(n)
        return n

    job.runs = runs
    return job


def _hold(app: Celery, task: Any, owner: str) -> Any:
    """The job's run lock (the lock a run takes), held by ``owner``, elsewhere."""
    name = task.locking.lock_name(task.name, (7,), {})
    lock = task.locking.space(app).lock(name, ttl=30, owner=owner)
    assert lock.acquire(blocking=False)
    return lock


@pytest.mark.parametrize(
    ("lock_at", "lock_on_locked"),
    # lock_at="queue" with "raise" is refused when the class is made
    [(m, c) for m in MODES for c in CHOICES if (m, c) != ("queue", "raise")],
)
def test_an_eager_call_of_a_job_held_elsewhere_ends_as_a_duplicate(
    app: Celery, lock_at: str, lock_on_locked: str
) -> None:
    # max_retries=None: a retry that re-applied at once would never stop
    task = _task(app, lock_at, lock_on_locked, max_retries=None)
    held = _hold(app, task, "elsewhere")
    try:
        result = task.apply((7,))
        assert not isinstance(result.result, RecursionError), "the eager call recursed"
        if lock_on_locked == "raise":
            assert result.state == "FAILURE"
            assert isinstance(result.result, TaskLockedError)
            assert result.result.task_id == "elsewhere"
        else:
            assert result.state == "IGNORED", (result.state, result.result)
        assert task.runs == [], "the body ran while another holder held the job"
        assert task.lock_holder(7) == "elsewhere"
        assert task.locking.space(app).inspect(held.key).holder == "elsewhere"
    finally:
        held.release()
    assert task.apply((7,)).get() == 7, "the job did not run once its lock was free"


@pytest.mark.parametrize("lock_at", MODES)
def test_a_nested_eager_call_of_a_queue_job_ends_ignored(app: Celery, lock_at: str) -> None:
    """task_always_eager: a call nested in a run of the same job (its lock held by that run)
    ends IGNORED, and the outer run goes on."""
    app.conf.task_always_eager = True
    seen: list[Any] = []

    @app_task(
        app, base=LockedTask, name=f"eager.nested.{lock_at}", shared=False, lock_at=lock_at,
        lock_unique_on=[],
    )  # fmt: skip
    def outer(depth: int) -> str:
        if depth:
            inner = outer.delay(0)
            seen.append((inner.state, inner.info))
        return "ran"

    assert outer.delay(1).get() == "ran"
    [(state, info)] = seen
    assert state == "IGNORED", (state, info)


@pytest.mark.parametrize("lock_at", MODES)
def test_an_eager_call_refused_its_rate_turn_with_retry_ends_ignored(
    app: Celery, lock_at: str
) -> None:
    """lock_rate with lock_on_locked="retry": an eager call past lock_rate_max_delay is not
    retried at once for ever; it ends IGNORED, and its limiter keeps no turn for it."""
    task = _task(
        app, f"rate.{lock_at}", "retry", max_retries=None, lock_rate="1/m",
        lock_rate_max_delay=0,
    )  # fmt: skip
    assert task.apply((7,)).get() == 7
    result = task.apply((7,))
    assert not isinstance(result.result, RecursionError), "the eager call recursed"
    assert result.state == "IGNORED", (result.state, result.result)
    assert task.runs == [7]
    name = task.locking.lock_name(task.name, (7,), {})
    [limiter] = [r for r in task.locking.space(app).rate_limiters() if r.name == name]
    assert (limiter.used, limiter.waiting) == (1, 0)
