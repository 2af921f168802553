"""``lock_at="queue"`` on real workers: the queued copy starts when the running one ends, and
is never lost, whichever worker dies.

The rules, as these tests check them (the tasks are the fault tests' app's, with the default
``lock_on_locked``, so a refused queued copy waits for the run to end):

* the queued copy starts within a second of the end of the run it waited for, however long
  that run and however short its lease (the wait no longer grows a retry backoff), and with
  ``lock_limit`` above 1 when any slot frees;
* while it waits it occupies no pool process: a two-process worker runs other jobs meanwhile;
* its wait leaves nothing behind in Redis once it ran (no lock, no wait record);
* it is never lost: not when the pool process of the run is killed (its worker's main process
  wakes it at once), not when the whole worker of the run is (it starts when the run's lease
  runs out), not when the worker that holds its delayed message is (the run's end wakes it),
  not when both are (its message comes back after the broker's visibility timeout);
* a woken copy whose pool process is killed while it runs (``acks_late``) is delivered again
  and runs, its other message unrun;
* a debounced queued copy replaced while it waits ends SKIPPED ("replaced") when woken, and
  the call that replaced it starts when the run ends; a revoked one never runs, and its wait
  ends with it; a pickled task's copy comes back with what JSON could not carry;
* the wake costs a ``lock_at="queue"`` run one Redis script more (the read at its end), and
  the other modes nothing.

The tasks are the fault tests' app's (``tests/faultapp.py``), on a redis-server of this
module's own; an in-process worker (threads pool) runs them, and the (slow) tests of a pool, a
pickling worker or a worker that dies start ``celery worker`` subprocesses (prefork) on queues
of their own. The slow test measures the queued copy's start after a 20 s body with the default
lease (``singleton_lock_ttl``, 30 s) and prints it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_procs import WorkerProcess, new_job, no_overlap, records, redis_base
from faultapp import DATA_DB, LOCK_DB, PICKLE_ENV
from lock_helpers import START_TIMEOUT, evalsha_calls, wait_until

from celery_singleton_lock import LockedTask
from celery_singleton_lock.testing import RedisServer

pytestmark = [pytest.mark.timeout(START_TIMEOUT + 120)]


#: the threads of the module's in-process worker (the conftest's ``fault_worker``)
WORKER_CONCURRENCY = 6


def _start(data: Any, job: str, task_id: str) -> float:
    return float(next(s["t"] for s in records(data, "starts", job) if s["id"] == task_id))


def _end(data: Any, job: str, task_id: str) -> float:
    return float(next(i["end"] for i in records(data, "intervals", job) if i["id"] == task_id))


def _started(data: Any, job: str, count: int = 1) -> None:
    wait_until(lambda: len(records(data, "starts", job)) >= count, 20, f"{job} to start")


def _parked(result: Any, task: LockedTask, job: str) -> None:
    """Wait until the queued copy ``result`` was refused and waits: its state is RETRY (stored
    as it starts to wait) and its wait record is written beside the job's lock."""
    assert wait_until(lambda: result.state == "RETRY", 20, "the queued copy to wait"), result.state
    space = task.locking.space(task.app)
    name = task.locking.lock_name(task.name, [job], {})
    key = space.keys(name).records("wait")
    wait_until(lambda: space.client.hexists(key, result.id), 10, "its wait record")


def _left_nothing(server: RedisServer, task: LockedTask, job: str) -> bool:
    """Neither a lock of the job nor its wait record is left in Redis."""
    locks = server.client(db=LOCK_DB)
    name = task.locking.lock_name(task.name, [job], {})
    keys = task.locking.space(task.app).keys(name)
    return not task.is_locked(job) and not locks.exists(keys.records("wait"))


def _queue() -> str:
    return f"queue-{uuid.uuid4().hex[:8]}"


def test_the_queued_copy_starts_when_the_run_ends(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """Four jobs, each a 5 s run with a 4 s lease and a queued copy: each copy starts within a
    second of its run's end (a retry backoff capped by the lease came back anywhere in the
    lease after it)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_wake"]
    jobs = [new_job("wake") for _ in range(4)]
    running = [task.delay(job, 5.0) for job in jobs]
    for job in jobs:
        _started(data, job)
    waiting = [task.delay(job, 0.0) for job in jobs]
    for result in waiting:
        assert result.get(timeout=30) == result.id
    gaps = [
        _start(data, job, w.id) - _end(data, job, r.id)
        for job, r, w in zip(jobs, running, waiting, strict=True)
    ]
    assert all(0 <= gap < 1.0 for gap in gaps), gaps
    for job in jobs:
        assert no_overlap(records(data, "intervals", job))
        assert wait_until(lambda: _left_nothing(fault_server, task, job), 5)  # noqa: B023  # called before the loop moves on


def test_with_a_lock_limit_the_queued_copy_starts_when_a_slot_frees(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_limited"]
    job = new_job("wake-limit")
    first = task.delay(job, 3.0)
    _started(data, job)  # (until then it is the one queued copy: a call would get it back)
    second = task.delay(job, 6.0)
    _started(data, job, 2)
    waiting = task.delay(job, 0.0)
    assert waiting.get(timeout=30) == waiting.id
    assert 0 <= _start(data, job, waiting.id) - _end(data, job, first.id) < 1.0
    assert second.get(timeout=30) == second.id
    assert int(data.get(f"max:{job}")) == 2
    assert wait_until(lambda: _left_nothing(fault_server, task, job), 5)


@pytest.mark.slow
def test_a_pickled_queued_copy_comes_back_whole(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """A task whose messages are pickled: its queued copy, woken, gets the set it was called
    with (what JSON cannot carry)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_pickled"]
    queue = _queue()
    env = {PICKLE_ENV: "1", "C_FORCE_ROOT": "1"}  # a worker run as root refuses pickle without
    with WorkerProcess(
        redis_base(fault_server.port), tmp_path, concurrency=2, env=env, args=("-Q", queue)
    ):
        job = new_job("wake-pickle")
        running = task.apply_async((job, 3.0), queue=queue)
        _started(data, job)
        waiting = task.apply_async((job, 0.0, {3, 1, 2}), queue=queue)
        _parked(waiting, task, job)
        assert waiting.get(timeout=30) == "set:[1, 2, 3]"
    assert 0 <= _start(data, job, waiting.id) - _end(data, job, running.id) < 1.0


def test_a_replaced_waiting_copy_ends_replaced_and_its_replacement_starts_at_the_end(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """lock_debounce with lock_at="queue": a call replaces the queued copy while that copy
    waits for the run; woken at the run's end, the replaced copy ends SKIPPED ("replaced"),
    and the call that replaced it starts within a second."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_debounced"]
    job = new_job("wake-debounce")
    running = task.delay(job, 4.0)
    _started(data, job)
    replaced = task.delay(job, 0.0)
    _parked(replaced, task, job)
    last = task.delay(job, 0.0)
    _parked(last, task, job)
    assert last.get(timeout=30) == last.id
    assert 0 <= _start(data, job, last.id) - _end(data, job, running.id) < 1.0
    assert wait_until(lambda: replaced.state == "SKIPPED", 10), replaced.state
    assert replaced.info["reason"] == "replaced" and replaced.info["replaced_by"] == last.id
    assert [s["id"] for s in records(data, "starts", job)] == [running.id, last.id]
    assert wait_until(lambda: _left_nothing(fault_server, task, job), 5)


def test_a_revoked_waiting_copy_never_runs_and_its_wait_ends(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_wake"]
    job = new_job("wake-revoke")
    running = task.delay(job, 2.0)
    _started(data, job)
    waiting = task.delay(job, 0.0)
    _parked(waiting, task, job)
    fault_app.control.revoke(waiting.id)
    assert running.get(timeout=20) == running.id
    assert wait_until(lambda: waiting.state == "REVOKED", 15), waiting.state
    assert wait_until(lambda: _left_nothing(fault_server, task, job), 10)
    assert [s["id"] for s in records(data, "starts", job)] == [running.id]
    # ... and a new call runs (no wait record of the revoked copy wakes anything)
    again = task.delay(job, 0.0)
    assert again.get(timeout=20) == again.id


@pytest.mark.slow
def test_a_waiting_copy_leaves_the_pool_to_other_jobs(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """A two-process worker: one process runs the job, and while its queued copy waits the
    other runs other jobs' tasks one after another."""
    data = fault_server.client(db=DATA_DB)
    task, other = fault_app.tasks["fault.queue_wake"], fault_app.tasks["fault.work"]
    queue = _queue()
    with WorkerProcess(redis_base(fault_server.port), tmp_path, concurrency=2, args=("-Q", queue)):
        job = new_job("wake-pool")
        running = task.apply_async((job, 5.0), queue=queue)
        _started(data, job)
        waiting = task.apply_async((job, 0.0), queue=queue)
        _parked(waiting, task, job)
        others = [new_job("other") for _ in range(3)]
        for key in others:
            other.apply_async((key, 0.3), queue=queue).get(timeout=10)
        assert waiting.get(timeout=30) == waiting.id
    end = _end(data, job, running.id)
    assert all(_end(data, key, records(data, "starts", key)[0]["id"]) < end for key in others)
    assert 0 <= _start(data, job, waiting.id) - end < 1.0


# -- a worker dies -------------------------------------------------------------------------


@pytest.mark.slow
def test_a_woken_copy_killed_while_it_runs_is_delivered_again_and_runs(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """acks_late + reject_on_worker_lost: the woken copy's pool process is killed while it
    runs; its message, delivered again, still holds its claim on the wait and runs the copy
    (the copy's other message, its fallback, ends unrun)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_lost"]
    job = new_job("wake-lost")
    queue = _queue()  # a prefork worker of its own: its pool process is killed
    with WorkerProcess(redis_base(fault_server.port), tmp_path, args=("-Q", queue)):
        running = task.apply_async((job, 2.0), queue=queue)
        _started(data, job)
        waiting = task.apply_async((job, 60.0, 0.0), queue=queue)
        _parked(waiting, task, job)
        _started(data, job, 2)  # woken when the run ended
        os.kill(records(data, "starts", job)[1]["pid"], signal.SIGKILL)
        assert waiting.get(timeout=30) == waiting.id
        assert running.get(timeout=5) == running.id
    assert [s["id"] for s in records(data, "starts", job)] == [running.id, *[waiting.id] * 2]
    assert wait_until(lambda: _left_nothing(fault_server, task, job), 10)


def _two_workers(server: RedisServer, tmp_path: Path, **options: Any) -> tuple[Any, Any, str, str]:
    """A one-process worker for the run (queue ``a``) and one for the queued copy (``b``)."""
    a, b = _queue(), _queue()
    base = redis_base(server.port)
    runner = WorkerProcess(base, tmp_path, concurrency=1, args=("-Q", a), **options)
    holder = WorkerProcess(base, tmp_path, concurrency=1, args=("-Q", b), **options)
    return runner, holder, a, b


@pytest.mark.slow
def test_a_killed_run_process_wakes_the_queued_copy_at_once(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """SIGKILL the pool process of the run: its worker's main process, once it notices (at
    once, or at its next pool check), frees the job and wakes the queued copy, which starts
    within a second of that (its fallback would come back in 30 s)."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_patient"]
    runner, holder, a, b = _two_workers(fault_server, tmp_path)
    with runner, holder:
        job = new_job("wake-child")
        running = task.apply_async((job, 60.0), queue=a)
        _started(data, job)
        waiting = task.apply_async((job, 0.0), queue=b)
        _parked(waiting, task, job)
        pid = records(data, "starts", job)[0]["pid"]
        assert runner.accepted(fault_app, running.id) == pid
        os.kill(pid, signal.SIGKILL)  # the main process stays
        released = runner.wait_log(
            rf"\[([-\d]+ [:\d]+,\d+): INFO/MainProcess\] released \S+ of "
            rf"fault\.queue_patient\[{running.id}\] after its pool process ended",
            15,
        )[0]
        assert waiting.get(timeout=30) == waiting.id
    at = datetime.strptime(released.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    assert 0 <= _start(data, job, waiting.id) - at < 1.0


@pytest.mark.slow
def test_a_killed_run_worker_lets_the_queued_copy_start_within_a_lease(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """SIGKILL the whole worker of the run (nobody frees the job): the queued copy starts
    when the run's lease runs out (4 s), not later."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_wake"]
    runner, holder, a, b = _two_workers(fault_server, tmp_path)
    with runner, holder:
        job = new_job("wake-runner")
        task.apply_async((job, 60.0), queue=a)
        _started(data, job)
        waiting = task.apply_async((job, 0.0), queue=b)
        _parked(waiting, task, job)
        killed_at = time.time()
        runner.kill_group()
        assert waiting.get(timeout=30) == waiting.id
    assert _start(data, job, waiting.id) - killed_at < 4.0 + 1.5


@pytest.mark.slow
def test_a_killed_holder_of_the_queued_copy_does_not_lose_it(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """SIGKILL the worker that holds the queued copy's delayed message while the job runs:
    that message is gone with it (until the broker's visibility timeout, an hour), and the
    run's end wakes the copy on another worker of its queue within a second."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_wake"]
    runner, holder, a, b = _two_workers(fault_server, tmp_path)
    with runner, holder:
        job = new_job("wake-holder")
        running = task.apply_async((job, 8.0), queue=a)
        _started(data, job)
        waiting = task.apply_async((job, 0.0), queue=b)
        _parked(waiting, task, job)
        holder.kill_group()
        holder.wait(10)
        with WorkerProcess(redis_base(fault_server.port), tmp_path, concurrency=1, args=("-Q", b)):
            ready = time.time()
            assert waiting.get(timeout=30) == waiting.id
    end = _end(data, job, running.id)
    assert 0 <= _start(data, job, waiting.id) - max(end, ready) < 1.0


@pytest.mark.slow
def test_both_killed_the_queued_copy_comes_back_after_the_visibility_timeout(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path
) -> None:
    """One worker runs the job and holds its queued copy's delayed message; SIGKILL it whole.
    Nobody wakes the copy: its message comes back after the broker's visibility timeout (6 s
    here) on another worker, and runs then."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_wake"]
    queue = _queue()
    base = redis_base(fault_server.port)
    env = {"CSL_FAULT_VISIBILITY": "6"}
    both = WorkerProcess(base, tmp_path, concurrency=2, env=env, args=("-Q", queue)).start()
    try:
        job = new_job("wake-both")
        task.apply_async((job, 60.0), queue=queue)
        _started(data, job)
        waiting = task.apply_async((job, 0.0), queue=queue)
        _parked(waiting, task, job)
        both.kill_group()
        both.wait(10)
    finally:
        both.stop()
    with WorkerProcess(base, tmp_path, concurrency=1, env=env, args=("-Q", queue)):
        assert waiting.get(timeout=60) == waiting.id
    assert [s["id"] for s in records(data, "starts", job)][-1] == waiting.id
    assert wait_until(lambda: _left_nothing(fault_server, task, job), 10)


@pytest.mark.slow
def test_the_queued_copy_starts_right_after_a_20_s_body(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """The measurement: a 20 s run with the app's lease (30 s), a copy queued right after it
    started; prints when the copy started after the run ended."""
    data = fault_server.client(db=DATA_DB)
    task = fault_app.tasks["fault.queue_default"]
    job = new_job("wake-20s")
    running = task.delay(job, 20.0)
    _started(data, job)
    waiting = task.delay(job, 0.0)
    assert waiting.get(timeout=90) == waiting.id
    gap = _start(data, job, waiting.id) - _end(data, job, running.id)
    print(f"\nthe queued copy started {gap:.3f} s after the 20 s body ended")
    assert 0 <= gap < 1.0


def test_what_a_run_costs_in_redis(
    fault_server: RedisServer, fault_app: Celery, fault_worker: Any
) -> None:
    """Lock scripts run (EVALSHA) per call, nobody waiting: the wake adds one to a
    lock_at="queue" run (its end reads the copies waiting for it), nothing to the others."""
    admin = fault_server.client()
    data = fault_server.client(db=DATA_DB)

    def scripts(task_name: str) -> int:
        """The fewest of three calls (a late message of an earlier test's job may run
        meanwhile, on the module's worker: it can only add)."""
        counts = []
        for _ in range(3):
            job = new_job("cost")
            before = evalsha_calls(admin)
            fault_app.tasks[task_name].delay(job, 0.0).get(timeout=20)
            wait_until(lambda: records(data, "intervals", job), 5, "the run to end")  # noqa: B023  # called before the loop moves on
            counts.append(evalsha_calls(admin) - before)
        return min(counts)

    for name in ("fault.work", "fault.publish_work", "fault.queue_wake"):
        scripts(name)  # the server loads each script at its first call (NOSCRIPT, then again)
    # run: acquire, release; publish: its publish's take too
    assert scripts("fault.work") == 2
    assert scripts("fault.publish_work") == 3
    # queue: the publish's take, the run's re-entry of the queued lock, acquire, the release
    # of the queued lock, the release, and the read of the copies waiting
    assert scripts("fault.queue_wake") == 6
