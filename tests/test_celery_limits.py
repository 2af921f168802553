"""Beyond one at a time, on a real worker: ``lock_limit``, ``lock_cooldown``,
``lock_at="queue"`` and ``lock_debounce``.

Each option's rule, as these tests check it:

* ``lock_limit=3``: at most three runs of one key at once; the fourth is a duplicate
  (skipped here); a worker SIGKILLed with its slots held gives them back within one lease. A
  pool child SIGKILLed alone (``lock_limit=2``, lease 60 s) has its slot released by the
  worker's main process within seconds, the other slot left to its holder.
* ``lock_cooldown=3``: a duplicate within three seconds of the end of the last run is refused
  (SKIPPED, the holder is the last run, ``celery locks list`` shows the cooldown left), and a
  call after them runs; a failed run starts it too unless ``lock_cooldown_on_failure=False``.
  The cooldown is the whole ``lock_cooldown`` (5 s with ``lock_at="publish"``): the lease
  Redis keeps ends no sooner than that after the run's end, and a duplicate published when
  80 % of it has gone by is refused.
* ``lock_at="queue"``: one copy queued and one running; a publish while one is queued returns
  the queued one; the queued copy runs after the running one ends and is never dropped (the
  task has ``max_retries=0`` and still comes through).
* ``lock_debounce=1``: only the last of calls made within a second of each other runs, a
  second after it; the replaced ones end SKIPPED naming the task that replaced them. A call
  made while the job runs replaces nothing: it gets the running job back. A call
  with a countdown or an eta of its own replaces the waiting one and runs at its own time.

The tasks are the fault tests' app's (``tests/faultapp.py``), on a redis-server of this
module's own; an in-process worker (threads pool) runs them, and the (slow) tests that kill a
worker or a pool child start ``celery worker`` subprocesses (prefork) on queues of their own.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_fixtures import app_task, cli_main, new_app
from celery_procs import WorkerProcess, close_app, new_job, no_overlap, records, redis_base
from faultapp import DATA_DB, LOCK_DB
from lock_helpers import START_TIMEOUT, lease_end, server_time, wait_until

from celery_singleton_lock import AlreadyQueuedError, LockedTask, LockSpace
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.timeout(START_TIMEOUT + 120)]

#: the worker's main process notices a dead pool child through the child's sentinel fd at once,
#: or at worst at its next maintain_pool() (every 5 s); then it releases
CHILD_GONE = 8.0


#: the threads of the module's in-process worker (the conftest's ``fault_worker``)
WORKER_CONCURRENCY = 6


#: the state of a hold kept after its run for ``lock_cooldown`` (docs/upgrading.md)
COOLDOWN = "cooldown"


def _listed_locks(server: RedisServer) -> list[dict[str, Any]]:
    """The locks ``locks list --json`` lists in the server's lock database."""
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit):
        cli_main(["list", "--url", f"{redis_base(server.port)}/{LOCK_DB}", "--json"])
    return [row for row in json.loads(out.getvalue()) if row["kind"] == "lock"]


def _space(app: Celery) -> LockSpace:
    task: LockedTask = app.tasks["fault.limited"]
    return task.locking.space(app)


def test_limit_three_runs_at_once(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    limited = fault_app.tasks["fault.limited"]
    job = new_job("limit")
    calls = [limited.delay(job, 2.0) for _ in range(6)]
    assert wait_until(lambda: all(c.state in ("SUCCESS", "SKIPPED") for c in calls), 30), [
        c.state for c in calls
    ]
    states = sorted(c.state for c in calls)
    assert states == ["SKIPPED"] * 3 + ["SUCCESS"] * 3
    assert int(data.get(f"max:{job}")) == 3
    ran = {c.id for c in calls if c.state == "SUCCESS"}
    skipped = [c for c in calls if c.state == "SKIPPED"]
    assert all(c.info["holder"] in ran and c.info["reason"] == "limit" for c in skipped)
    # every slot was let go as its run returned
    name = limited.locking.lock_name(limited.name, [job], {})
    assert not any(s.held for s in _space(fault_app).named(name, 3).inspect())


def test_release_lock_force_releases_every_slot_and_says_so(
    fault_server: RedisServer,
    fault_app: Celery,
    fault_worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``release_lock(job)`` of a ``lock_limit=3`` job with three runs in flight: an operator's
    force release of all three slots, logged as such with each holder."""
    data = fault_server.client(db=DATA_DB)
    limited = fault_app.tasks["fault.limited"]
    job = new_job("limit-release")
    calls = [limited.delay(job, 3.0) for _ in range(3)]
    wait_until(lambda: len(records(data, "starts", job)) == 3, 20, "three runs to start")
    with caplog.at_level(logging.WARNING, logger="celery_singleton_lock.release"):
        assert limited.release_lock(job) is True
    assert not limited.is_locked(job)
    said = [r.getMessage() for r in caplog.records if r.msg.startswith("release_lock:")]
    assert len(said) == 1 and "force-released 3 lock(s) of fault.limited" in said[0], said
    assert all(c.id in said[0] for c in calls), said
    assert [c.get(timeout=20) for c in calls] == [c.id for c in calls]  # they ran on, unlocked


@pytest.mark.slow
def test_slots_of_a_killed_worker_come_back_within_one_lease(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    data = fault_server.client(db=DATA_DB)
    limited = fault_app.tasks["fault.limited"]
    job = new_job("limit-kill")
    name = limited.locking.lock_name(limited.name, [job], {})
    space = _space(fault_app)
    queue = ("-Q", "limits-kill")  # not the module's worker's queue: only these workers run it
    with WorkerProcess(
        redis_base(fault_server.port), tmp_path, concurrency=3, args=queue
    ) as doomed:
        for _ in range(3):
            limited.apply_async((job, 60), queue=queue[1])
        wait_until(lambda: len(records(data, "starts", job)) == 3, 20, "three runs to start")
        assert all(s.held for s in space.named(name, 3).inspect())
        doomed.kill_group()  # main process too: nobody releases, the leases must end
        doomed.wait(10)
    # Nobody renews them now: the lease each slot has left, read from Redis, ends it.
    lease = limited.locking.bound(fault_app).ttl
    assert all(0 < (s.lease_left or 0) <= lease for s in space.named(name, 3).inspect())
    wait_until(
        lambda: not any(s.held for s in space.named(name, 3).inspect()),
        lease + 5,
        "the slots of the killed runs to be freed",
    )
    with WorkerProcess(redis_base(fault_server.port), tmp_path, concurrency=3, args=queue):
        again = [limited.apply_async((job, 0.2), queue=queue[1]) for _ in range(3)]
        assert all(r.get(timeout=20) == r.id for r in again)


@pytest.mark.slow
def test_the_slot_of_a_killed_pool_child_is_released_by_the_main_process(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """SIGKILL only the pool child that runs a job of two slots (lease 60 s): the worker's
    main process releases that child's slot within seconds, which nothing else would do
    before the lease ends, and leaves the other slot to its holder."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.limited_long"]
    job = new_job("limit-child")
    name = task.locking.lock_name(task.name, [job], {})
    space = task.locking.space(fault_app)
    # Another owner holds the first slot (the plain lock's key), so the run takes the second:
    # a release that went to the first slot only would leave the run's slot held.
    assert space.named(name).take("other-holder", 60).acquired
    queue = ("-Q", "limits-child")  # a prefork worker of its own: its pool child is killed
    try:
        with WorkerProcess(redis_base(fault_server.port), tmp_path, args=queue) as worker:
            result = task.apply_async((job, 60.0), queue=queue[1])
            pid = wait_until(
                lambda: (starts := records(data, "starts", job)) and starts[0]["pid"],
                20,
                "the run to start",
            )
            assert pid in worker.children()
            assert worker.accepted(fault_app, result.id) == pid
            assert [s.holder for s in space.named(name, 2).inspect()] == ["other-holder", result.id]
            os.kill(pid, signal.SIGKILL)
            wait_until(
                lambda: not space.named(name, 2).inspect()[1].held,
                CHILD_GONE,
                "the killed run's slot to be released (its lease is 60 s)",
            )
            assert space.named(name, 2).inspect()[0].holder == "other-holder"
            worker.wait_log(
                rf"released \S+ of fault\.limited_long\[{result.id}\] after its pool process ended",
                5,
            )
            with pytest.raises(Exception) as caught:
                result.get(timeout=10)
            assert type(caught.value).__name__ == "WorkerLostError"
    finally:
        space.named(name).release("other-holder")


def test_cooldown_after_a_run(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    cooled = fault_app.tasks["fault.cooled"]
    job = new_job("cool")
    first = cooled.delay(job)
    assert first.get(timeout=20) == first.id
    too_soon = cooled.delay(job)
    assert wait_until(lambda: too_soon.state == "SKIPPED", 10), too_soon.state
    assert too_soon.info["holder"] == first.id and too_soon.info["reason"] == "cooldown"
    state = cooled.lock_space(fault_app).inspect(cooled.lock_key_for(job))
    assert state.holder == first.id and state.state == COOLDOWN
    assert state.lease_left is not None and 0 < state.lease_left <= 3.0
    wait_until(lambda: not cooled.is_locked(job), 6, "the cooldown to end")
    later = cooled.delay(job)
    assert later.get(timeout=20) == later.id
    assert [s["id"] for s in records(data, "starts", job)] == [first.id, later.id]


def test_the_cooldown_lasts_as_long_as_configured(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """Not only at most ``lock_cooldown``: at least that. The lease Redis keeps on the job's
    lock ends no sooner than ``lock_cooldown`` after the run's body ended (read from Redis, so
    how long the test takes to ask does not matter), and a duplicate published when 80 % of
    it has gone by (on the server's clock) is refused; then it ends and a call runs."""
    data, locks = fault_server.client(db=DATA_DB), fault_server.client(db=LOCK_DB)
    cooled = fault_app.tasks["fault.cooled_publish"]
    cooldown = cooled.locking.options.lock_cooldown
    job = new_job("cool-length")
    key = cooled.lock_key_for(job)
    first = cooled.delay(job)
    assert first.get(timeout=20) == first.id
    ended = records(data, "intervals", job)[0]["end"]  # before the run parks its hold
    until = lease_end(locks, key)
    assert until is not None, "the cooldown was over before the test could read it"
    # (the server and the worker share this host's clock; 50 ms for the lease's rounding)
    assert until >= ended + cooldown - 0.05, (
        f"the cooldown ends {until - ended:.2f} s after the run, not {cooldown} s"
    )
    assert until - server_time(locks) <= cooldown
    wait_until(
        lambda: server_time(locks) >= ended + 0.8 * cooldown, cooldown, "80 % of the cooldown"
    )
    assert cooled.delay(job).id == first.id, "a duplicate at 80 % of the cooldown was sent"
    wait_until(lambda: not cooled.is_locked(job), cooldown, "the cooldown to end")
    later = cooled.delay(job)
    assert later.id != first.id and later.get(timeout=20) == later.id


def test_a_failed_run_starts_the_cooldown_unless_told_not_to(
    fault_app: Celery, fault_worker: Any
) -> None:
    cooled, on_success = fault_app.tasks["fault.cooled"], fault_app.tasks["fault.cooled_on_success"]
    job = new_job("cool-fail")
    failed = cooled.delay(job, 0.0, True)
    with pytest.raises(ValueError, match="fails on purpose"):
        failed.get(timeout=20)
    too_soon = cooled.delay(job)
    assert wait_until(lambda: too_soon.state == "SKIPPED", 10), too_soon.state

    job = new_job("cool-success-only")
    failed = on_success.delay(job, True)
    with pytest.raises(ValueError, match="fails on purpose"):
        failed.get(timeout=20)
    assert not on_success.is_locked(job)
    right_after = on_success.delay(job)
    assert right_after.get(timeout=20) == right_after.id


def test_queue_one_queued_and_one_running(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    queued = fault_app.tasks["fault.queued"]
    job = new_job("queue")
    running = queued.delay(job, 1.5)
    wait_until(lambda: records(data, "starts", job), 15, "the first run to start")
    waiting = queued.delay(job, 0.0)
    assert waiting.id != running.id
    again = queued.delay(job, 0.0)
    assert again.id == waiting.id  # the queued one, not a third copy
    assert running.get(timeout=20) == running.id
    assert waiting.get(timeout=20) == waiting.id  # never dropped (max_retries=0)
    starts = [s["id"] for s in records(data, "starts", job)]
    assert starts == [running.id, waiting.id]
    assert no_overlap(records(data, "intervals", job))
    assert not queued.is_locked(job)


def test_queue_skips_a_copy_sent_by_name_while_one_waits(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """A publish by name (no install() here) cannot be stopped at publish: its run finds the
    job's queued copy held by another task and is skipped, the queued copy still runs."""
    data = fault_server.client(db=DATA_DB)
    queued = fault_app.tasks["fault.queued"]
    job = new_job("queue-by-name")
    running = queued.delay(job, 1.5)
    wait_until(lambda: records(data, "starts", job), 15, "the first run to start")
    waiting = queued.delay(job, 0.0)
    by_name = fault_app.send_task("fault.queued", (job, 0.0))
    assert wait_until(lambda: by_name.state == "SKIPPED", 10), by_name.state
    assert by_name.info["reason"] == "queued" and by_name.info["holder"] == waiting.id
    assert waiting.get(timeout=20) == waiting.id
    assert [s["id"] for s in records(data, "starts", job)] == [running.id, waiting.id]


def test_debounce_runs_the_last_call(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    debounced = fault_app.tasks["fault.debounced"]
    job = new_job("debounce")
    calls = []
    for value in range(3):
        calls.append(debounced.delay(job, value))
    last_sent = time.time()
    assert len({c.id for c in calls}) == 3
    assert calls[-1].get(timeout=20) == calls[-1].id
    starts = records(data, "starts", job)
    assert [s["id"] for s in starts] == [calls[-1].id]
    assert starts[0]["t"] >= last_sent + 0.9  # a second after the last call
    for replaced in calls[:-1]:
        assert wait_until(lambda: replaced.state == "SKIPPED", 10), replaced.state  # noqa: B023  # called before the loop moves on
        assert replaced.info["reason"] == "replaced"
        assert replaced.info["replaced_by"] in {c.id for c in calls}


def test_debounce_does_not_replace_a_running_job(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """With lock_at="publish", a call made while the job *runs* (its run entered the lock)
    replaces nothing: it came too late for that run and gets it back; the run goes on alone,
    holding its lock, and nothing else runs."""
    data = fault_server.client(db=DATA_DB)
    debounced = fault_app.tasks["fault.debounced"]
    job = new_job("debounce-running")
    running = debounced.delay(job, 0, 60.0)  # its body runs until the test says go
    try:
        wait_until(lambda: records(data, "starts", job), 15, "the first call to run")
        late = debounced.delay(job, 1)
        assert late.id == running.id, "a call made while the job ran replaced it"
        assert debounced.lock_holder(job) == running.id
    finally:
        data.set(f"go:{job}", 1)
    assert running.get(timeout=20) == running.id
    assert [s["id"] for s in records(data, "starts", job)] == [running.id]
    assert not debounced.is_locked(job)


def test_a_caller_s_countdown_or_eta_replaces_the_debounce_delay(
    fault_server: RedisServer,
    fault_app: Celery,
    fault_worker: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """lock_debounce=1: a call with a countdown or an eta of its own still replaces the call
    waiting, and runs at the caller's time (3 s after the call), not the debounce's (1 s); the
    publisher says so at DEBUG, naming the call."""
    caplog.set_level(logging.DEBUG, logger="celery_singleton_lock.debounce")
    data = fault_server.client(db=DATA_DB)
    debounced = fault_app.tasks["fault.debounced"]
    jobs = new_job("debounce-countdown"), new_job("debounce-eta")
    waiting = [debounced.delay(job, 0) for job in jobs]
    sent = time.time()
    later = [
        debounced.apply_async((jobs[0], 1), countdown=3),
        debounced.apply_async((jobs[1], 1), eta=datetime.now(UTC) + timedelta(seconds=3)),
    ]
    for job, replaced, last in zip(jobs, waiting, later, strict=True):
        assert last.id != replaced.id
        assert last.get(timeout=20) == last.id
        starts = records(data, "starts", job)
        assert [s["id"] for s in starts] == [last.id]
        assert starts[0]["t"] >= sent + 2.9  # the caller's 3 s, not the debounce's 1 s
        assert wait_until(lambda: replaced.state == "SKIPPED", 10), replaced.state  # noqa: B023  # called before the loop moves on
        assert replaced.info["replaced_by"] == last.id
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "celery_singleton_lock.debounce" and r.levelno == logging.DEBUG
    ]
    for what, call in zip(("countdown", "eta"), later, strict=True):
        assert any(f"[{call.id}]: the caller's {what} replaces lock_debounce" in m for m in said)


def test_debounce_with_queue_runs_the_last_call_after_the_running_one(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """With lock_at="queue", calls made while the job runs are debounced into one queued copy
    that runs after it (with "publish" they would get the running job back)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.debounced_queue"]
    job = new_job("debounce-queue")
    running = task.delay(job, 1.5)
    wait_until(lambda: records(data, "starts", job), 15, "the first run to start")
    replaced, last = task.delay(job, 0.0), task.delay(job, 0.0)
    assert replaced.id != last.id != running.id
    assert last.get(timeout=20) == last.id
    assert wait_until(lambda: replaced.state == "SKIPPED", 10), replaced.state
    assert replaced.info["replaced_by"] == last.id
    assert [s["id"] for s in records(data, "starts", job)] == [running.id, last.id]
    assert no_overlap(records(data, "intervals", job))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fault.debounced", "fault.queue_debounced"])
def test_a_replaced_call_that_arrives_after_its_replacement_ran_is_still_skipped(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path, name: str
) -> None:
    """lock_debounce, lock_at="publish" and "queue", on a prefork worker: call A is sent 4 s
    later, call B replaces it with a countdown of its own (0), runs at once and lets the lock
    go. When A's message arrives, 4 s after it was sent, the lock is free again: A must still
    end SKIPPED as replaced by B, and only B runs."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks[name]
    job = new_job("replaced-late")
    queue = ("-Q", new_job("replaced-late-q"))
    with WorkerProcess(redis_base(fault_server.port), tmp_path, args=queue):
        replaced = task.apply_async((job,), countdown=4, queue=queue[1])
        due = time.time() + 4
        last = task.apply_async((job,), countdown=0, queue=queue[1])
        assert last.id != replaced.id, "the second call did not replace the first"
        assert last.get(timeout=20) == last.id
        [ended] = records(data, "intervals", job)
        assert ended["end"] < due - 0.5, "the replacement did not end before A arrived"
        assert not task.is_locked(job), "the replacement did not let the lock go"
        assert wait_until(lambda: replaced.state in ("SKIPPED", "SUCCESS"), 20), replaced.state
        assert replaced.state == "SKIPPED", "the replaced call ran after its replacement"
        assert replaced.info["reason"] == "replaced"
        assert replaced.info["replaced_by"] == last.id
    assert [s["id"] for s in records(data, "starts", job)] == [last.id]


# -- options checked when the class is made -------------------------------------------------


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"lock_limit": 0}, ValueError, "lock_limit must be at least 1"),
        ({"lock_limit": -2}, ValueError, "lock_limit must be at least 1"),
        ({"lock_limit": True}, TypeError, "lock_limit must be a whole number"),
        ({"lock_limit": 2.5}, TypeError, "lock_limit must be a whole number"),
        ({"lock_limit": "3"}, TypeError, "lock_limit must be a whole number"),
        ({"lock_cooldown": -1}, ValueError, "lock_cooldown"),
        ({"lock_cooldown": 0}, ValueError, "lock_cooldown"),
        ({"lock_cooldown": "5"}, TypeError, "lock_cooldown"),
        ({"lock_cooldown_on_failure": False}, ValueError, "lock_cooldown is not"),
        ({"lock_cooldown_on_failure": 1}, TypeError, "lock_cooldown_on_failure"),
        ({"lock_debounce": 1.0}, ValueError, "lock_debounce .* needs lock_at='publish'"),
        ({"lock_debounce": -1.0, "lock_at": "publish"}, ValueError, "lock_debounce"),
        (
            {"lock_debounce": 1.0, "lock_at": "publish", "lock_limit": 2},
            ValueError,
            "lock_debounce .* needs lock_limit=1",
        ),
        ({"lock_at": "queue", "lock_on_locked": "raise"}, ValueError, "never drops"),
        ({"lock_at": "queued"}, ValueError, "lock_at must be one of 'run', 'publish', 'queue'"),
        (
            {"lock_at": "publish", "lock_release_on_start": True, "lock_cooldown": 5},
            ValueError,
            "lock_cooldown needs a lock held to the end",
        ),
        ({"lock_limt": 3}, TypeError, "did you mean lock_limit"),
    ],
)
def test_bad_options_are_refused_when_the_class_is_made(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    app = new_app("bad-options")
    app.finalize()  # so that app.task makes the class now, not at first use

    def bad(job: str) -> None:
        """Never made."""

    with pytest.raises(error, match=says) as raised:
        app.task(base=LockedTask, name="limits.bad", shared=False, **options)(bad)
    assert "limits.bad" in str(raised.value)
    app.close()


# -- publish side, in this process: slots in `celery locks list`, metrics ------------------


@pytest.fixture
def local_app(fault_server: RedisServer) -> Iterator[Celery]:
    """An app whose messages nobody consumes (its own queue): what a publish does only."""
    app = new_app("limits-local")
    base = redis_base(fault_server.port)
    app.conf.update(
        broker_url=f"{base}/0",
        result_backend=f"{base}/1",
        singleton_lock_redis_url=f"{base}/{LOCK_DB}",
        task_default_queue=new_job("nobody"),
    )
    yield app
    close_app(app)


def test_publish_slots_listed_and_refusals_counted(
    local_app: Celery, fault_server: RedisServer
) -> None:
    from prometheus_client import CollectorRegistry

    from celery_singleton_lock import metrics

    # the first registry enabled in this process stays: read the one enable() counts into
    registry = metrics.enable(CollectorRegistry()).registry
    try:

        def report_body(day: str) -> None:
            """Never runs: nobody consumes this queue."""

        def reindex_body(index: str) -> None:
            """Never runs."""

        report: Any = local_app.task(
            base=LockedTask, name="limits.report", lock_at="publish", lock_limit=2, shared=False
        )(report_body)
        reindex: Any = local_app.task(
            base=LockedTask,
            name="limits.reindex",
            lock_at="publish",
            lock_debounce=30.0,
            shared=False,
        )(reindex_body)

        day = new_job("day")
        first, second = report.delay(day), report.delay(day)
        third = report.delay(day)
        assert first.id != second.id
        assert third.id in {first.id, second.id}  # over the limit: a job already queued
        rows = [r for r in _listed_locks(fault_server) if r["holder"] in {first.id, second.id}]
        assert sorted(r["holder"] for r in rows) == sorted([first.id, second.id])
        assert {r["slots"] for r in rows} == {"2/2"}
        assert (
            registry.get_sample_value(
                "celery_singleton_lock_refusals_total", {"task": "limits.report", "reason": "limit"}
            )
            == 1.0
        )

        # A cooldown, as a run of the job leaves it: its hold kept, unrenewed, in state "cooldown".
        cooled_day = new_job("cooled")
        space = report.locking.space(local_app)
        report_name = report.locking.lock_name(report.name, [cooled_day], {})
        assert space.named(report_name, 2).take("last-run", 30).acquired
        info = json.dumps({"task": report.name, "id": "last-run"})  # what `locks list` shows
        assert space.named(report_name, 2).park("last-run", 5, info=info, state=COOLDOWN)
        assert space.named(report_name, 2).take("other-run", 30).acquired  # the second slot
        # the refusal names the slot that frees first (the one cooling down); this task has
        # no lock_cooldown of its own, so the refusal is the limit's
        assert report.delay(cooled_day).id == "last-run"
        assert (
            registry.get_sample_value(
                "celery_singleton_lock_refusals_total", {"task": "limits.report", "reason": "limit"}
            )
            == 2.0
        )
        report_raising: Any = local_app.task(
            base=LockedTask,
            name="limits.report_raising",
            lock_at="publish",
            lock_cooldown=60.0,
            lock_on_duplicate="raise",
            shared=False,
        )(report_body)
        raising_name = report_raising.locking.lock_name(report_raising.name, [cooled_day], {})
        assert space.named(raising_name).take("last-run", 30).acquired
        assert space.named(raising_name).park("last-run", 5, info=info, state=COOLDOWN)
        with pytest.raises(AlreadyQueuedError, match="cools down for") as refused:
            report_raising.delay(cooled_day)
        assert refused.value.cooldown and refused.value.task_id == "last-run"
        assert 0 < refused.value.ttl <= 5
        assert (
            registry.get_sample_value(
                "celery_singleton_lock_refusals_total",
                {"task": "limits.report_raising", "reason": "cooldown"},
            )
            == 1.0
        )
        out = io.StringIO()
        with redirect_stdout(out), pytest.raises(SystemExit):
            cli_main(["list", "--url", f"{redis_base(fault_server.port)}/{LOCK_DB}"])
        table = out.getvalue()
        assert "SLOTS" in table and "2/2" in table and "cooldown" in table

        index = new_job("index")
        calls = [reindex.delay(index) for _ in range(3)]
        assert len({c.id for c in calls}) == 3
        assert reindex.lock_holder(index) == calls[-1].id
        assert (
            registry.get_sample_value(
                "celery_singleton_lock_duplicates_total",
                {"task": "limits.reindex", "action": "replaced"},
            )
            == 2.0
        )
    finally:
        metrics.disable()


def test_a_cooldown_redis_cannot_start_leaves_the_lock_to_its_lease(
    make_redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The end of a run with a cooldown while Redis hangs (SIGSTOP, sent by the body as it
    ends; an eager run, in this process): the caller is held no longer than the backend
    timeout (the package's client stops its resends there), says so, and the hold is renewed
    no more: it ends with its lease, or with the cooldown if the park ran when Redis woke."""
    server: RedisServer = make_redis_server()
    assert server.process is not None
    pid = server.process.pid
    app = new_app("cool-stall")
    app.conf.update(
        singleton_lock_redis_url=f"redis://127.0.0.1:{server.port}/0",
        singleton_lock_backend_timeout=1,
        singleton_lock_counts=False,  # nothing else of the app's talks to the hung server
    )
    ended: list[float] = []

    @app_task(app, base=LockedTask, name="cool.stall", lock_ttl=2, lock_cooldown=3.0, shared=False)
    def stall() -> None:
        os.kill(pid, signal.SIGSTOP)
        ended.append(time.monotonic())

    key = stall.lock_key_for()
    try:
        stall.apply()
        assert ended and time.monotonic() - ended[0] < 2.5
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "could not start the cooldown of" in caplog.text
    wait_until(lambda: not server.client().exists(key), 6, "the hold to end")
    close_app(app)
