"""Fault tests against real ``celery worker`` subprocesses (prefork, ``-c 2``) and a real Redis.

Redelivery (the same id is not the same run), release on every terminal path and the
heartbeat, with real signals sent to real processes: SIGKILL to a pool child or to the whole
worker, SIGTERM (warm shutdown), revoke with terminate, soft and hard time limits. Every wait is
bounded.

Layout: one worker for the module (started once, its pool children replaced by the worker when
a test kills them) runs the scenarios that leave it standing; a test that shuts a worker down
or needs other broker settings starts its own worker on its own redis-server, so that two
workers never consume (or restore) each other's messages.

The tasks are in ``tests/faultapp.py``; they record their runs in Redis database 3.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery_procs import (
    WorkerProcess,
    close_app,
    new_job,
    records,
    redis_base,
)
from faultapp import DATA_DB, HEARTBEAT_THREAD, LOCK_DB, VISIBILITY_ENV, make_app
from lock_helpers import lease_end, settled, wait_until

from celery_singleton_lock.testing import RedisServer

# the adversarial fault suite (`pytest -m faults`): real workers killed, revoked, stopped; slow:
# every test runs on a `celery worker` subprocess
pytestmark = [pytest.mark.faults, pytest.mark.slow]

#: a lease ends after this long (lock_ttl=30 of most fault tasks): a release "without waiting
#: for the lease" must come far sooner
PROMPT = 3.0
#: the worker's main process notices a dead pool child through the child's sentinel fd at once,
#: or at worst at its next maintain_pool() (every 5 s); then it releases
CHILD_GONE = 8.0


class Env:
    """A redis-server of its own, the test-process app on it, and clients of its databases."""

    def __init__(self, server: RedisServer, **app_options: Any) -> None:
        self.server = server
        self.base = redis_base(server.port)
        self.app: Celery = make_app(self.base, **app_options)
        self.data = server.client(db=DATA_DB)
        self.locks = server.client(db=LOCK_DB)

    def task(self, name: str) -> Any:
        return self.app.tasks[f"fault.{name}"]

    def key(self, name: str, *args: Any) -> str:
        return str(self.task(name).lock_key_for(*args))

    def starts(self, job: str) -> list[dict[str, Any]]:
        return records(self.data, "starts", job)

    def intervals(self, job: str) -> list[dict[str, Any]]:
        return records(self.data, "intervals", job)

    def started(self, job: str, count: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
        return wait_until(
            lambda: (s := self.starts(job)) and len(s) >= count and s,
            timeout,
            f"{count} start(s) of {job}",
        )

    def gone_within(self, key: str, timeout: float) -> float:
        """Seconds until ``key`` is gone (fails after ``timeout``)."""
        t0 = time.monotonic()
        wait_until(lambda: not self.locks.exists(key), timeout, f"{key} to be released", 0.01)
        return time.monotonic() - t0

    def close(self) -> None:
        close_app(self.app)
        self.data.close()
        self.locks.close()


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    with RedisServer() as server:
        env = Env(server)
        yield env
        env.close()


@pytest.fixture(scope="module")
def worker(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with WorkerProcess(env.base, tmp_path_factory.mktemp("worker")) as proc:
        yield proc


@pytest.fixture
def w(worker: WorkerProcess) -> WorkerProcess:
    assert worker.alive(), f"the module's worker died:\n{worker.log()[-4000:]}"
    return worker


@pytest.fixture
def own_env() -> Iterator[Env]:
    """A redis-server for one test that runs a worker of its own."""
    with RedisServer() as server:
        env = Env(server)
        yield env
        env.close()


# -- redelivery: the same id is not the same run -------------------------------------------------


def test_redelivery_while_first_run_alive_is_dropped(tmp_path: Path) -> None:
    """acks_late + a 2 s visibility timeout: the message is restored to the queue and delivered
    again while its first run (6 s) is still going. The second delivery must not run the body:
    it is dropped with a warning; the body ran exactly once, never two at once."""
    with RedisServer() as server:
        env = Env(server, visibility=2)
        try:
            with WorkerProcess(env.base, tmp_path, env={VISIBILITY_ENV: "2"}) as proc:
                job = new_job("redeliver")
                result = env.task("redeliver").delay(job, 6.0)
                first = env.started(job)[0]
                pid = result.get(timeout=30)
                proc.wait_log(rf"not running fault\.redeliver\[{result.id}\]", 5)
                log = proc.log()
            assert first["id"] == result.id and pid == first["pid"]
            # The message really was delivered (at least) twice...
            received = log.count(f"fault.redeliver[{result.id}] received")
            assert received >= 2, f"delivered {received} time(s):\n{log[-4000:]}"
            # ...the later delivery was refused with a warning naming the task...
            assert re.search(
                rf"WARNING/[^\]]*\] not running fault\.redeliver\[{result.id}\]: this message "
                r"was delivered again while its first run is still alive",
                log,
            ), log[-4000:]
            # ...and the body ran once, never two at once.
            starts = env.starts(job)
            assert [s["id"] for s in starts] == [result.id], starts
            assert int(env.data.get(f"max:{job}")) == 1
        finally:
            env.close()


def test_redelivery_after_child_killed_takes_over_without_waiting_for_lease(
    env: Env, w: WorkerProcess
) -> None:
    """acks_late + reject_on_worker_lost, lock_ttl=60: SIGKILL the pool child running the task;
    the worker's main process parks the lock for the redelivery (kept, unrenewed, run token
    cleared) and the message is redelivered, and the redelivered run re-enters it at once, not
    after the 60 s lease."""
    job = new_job("lost")
    key = env.key("lost", job, 30.0)
    result = env.task("lost").delay(job, 30.0)
    first = env.started(job)[0]
    assert env.locks.pttl(key) > 50_000  # held with the long lease
    killed_at = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    second = env.started(job, 2, timeout=20)[1]
    took = second["t"] - killed_at
    assert took < 15, f"the redelivered run waited {took:.1f} s"
    assert result.get(timeout=20) == second["pid"] != first["pid"]
    assert second["id"] == first["id"] == result.id
    assert second["held"] and second["redelivered"]
    assert not env.locks.exists(key)
    assert f"not running fault.lost[{result.id}]" not in w.log()
    # the main process kept the hold for the redelivery (no gap for a duplicate), not freed it
    assert "for its redelivery after its pool process ended" in w.log()


# -- released on every terminal path -------------------------------------------------------


def test_released_on_success(env: Env, w: WorkerProcess) -> None:
    job = new_job("ok")
    key = env.key("work", job, 0.3)
    result = env.task("work").delay(job, 0.3)
    env.started(job)
    assert env.locks.exists(key)
    assert result.get(timeout=15)["held"] is True
    # Released before the result was stored: gone the moment the result is visible.
    assert not env.locks.exists(key)


def test_released_on_failure(env: Env, w: WorkerProcess) -> None:
    job = new_job("fail")
    key = env.key("work", job, 0.3, True)
    result = env.task("work").delay(job, 0.3, True)
    env.started(job)
    assert env.locks.exists(key)
    with pytest.raises(ValueError, match="fails on purpose"):
        result.get(timeout=15)
    assert not env.locks.exists(key)


def test_released_on_revoke_of_queued_task(env: Env, w: WorkerProcess) -> None:
    """lock_at="publish": the hold taken at publish lives while the message is queued. Revoke
    it while queued (in a queue the worker does not consume yet), then let the worker consume
    that queue: the worker discards the message and its main process's task_revoked receiver
    releases the publish hold, without the body running."""
    job = new_job("revoke-queued")
    key = env.key("publish_work", job, 0.0)
    result = env.task("publish_work").apply_async((job, 0.0), queue="parked")
    assert env.locks.exists(key)
    assert env.locks.pttl(key) > 3_000_000  # the queue lease (3600 s), not a run lease
    replies = env.app.control.revoke(result.id, destination=[w.hostname], reply=True, timeout=5)
    assert replies, "the worker did not answer the revoke"
    settled(env.locks)  # what the worker sent before it answered has run
    assert env.locks.exists(key)  # still queued: nothing released it yet
    replies = env.app.control.add_consumer(
        "parked", destination=[w.hostname], reply=True, timeout=5
    )
    assert replies, "the worker did not answer add_consumer"
    took = env.gone_within(key, 10)
    assert took < PROMPT
    assert result.state == "REVOKED"
    w.wait_log(rf"Discarding revoked task: fault\.publish_work\[{result.id}\]", 5)
    assert env.starts(job) == []


#: Celery 5.7 marks a queued task REVOKED the moment the revoke reaches a worker; before it, the
#: state stays PENDING until a worker receives the message (and then task_revoked releases the
#: lock at once, see test_released_on_revoke_of_queued_task), so no caller can see REVOKED while
#: the publish hold is still kept, and the case below cannot arise.
_CELERY_MARKS_QUEUED_REVOKES = tuple(int(part) for part in version("celery").split(".")[:2]) >= (
    5,
    7,
)


@pytest.mark.skipif(
    not _CELERY_MARKS_QUEUED_REVOKES,
    reason="Celery < 5.7 does not mark a queued task REVOKED before a worker receives it",
)
@pytest.mark.parametrize("path", ["apply_async", "send_task"])
def test_revoked_while_queued_then_published_again_runs(
    env: Env, w: WorkerProcess, path: str
) -> None:
    """Celery marks a queued task REVOKED the moment the revoke is broadcast, long before a
    worker reaches its message (here: never, it waits in a queue nobody consumes) and releases
    its publish hold. A caller that has seen REVOKED and publishes the same job again must get
    a new run, not the revoked task's AsyncResult, and a run-time
    duplicate (``send_task`` by name) must not be skipped in favour of a holder that will never
    run."""
    job = new_job("revoke-republish")
    key = env.key("publish_work", job, 0.0)
    revoked = env.task("publish_work").apply_async((job, 0.0), queue="held-back")
    assert env.locks.exists(key)
    env.app.control.revoke(revoked.id, destination=[w.hostname], reply=True, timeout=5)
    wait_until(lambda: revoked.state == "REVOKED", 5, "the REVOKED state")
    assert env.locks.exists(key)  # the worker never saw the message: still held
    if path == "apply_async":
        again = env.task("publish_work").delay(job, 0.0)
    else:
        again = env.app.send_task("fault.publish_work", (job, 0.0))
    assert again.id != revoked.id
    assert again.get(timeout=15) in w.children()
    assert [s["id"] for s in env.starts(job)] == [again.id]
    assert not env.locks.exists(key)


def test_revoked_state_does_not_free_a_running_holder(env: Env, w: WorkerProcess) -> None:
    """The other side of the test above: a task whose run has started keeps its lock even when
    its state says REVOKED (a revoke without terminate broadcast to several workers: those
    that do not run it mark it REVOKED in the backend while it goes on running elsewhere). A
    duplicate publish still gets the running holder's result, never a second run."""
    job = new_job("revoked-running")
    key = env.key("publish_work", job, 2.0)
    holder = env.task("publish_work").delay(job, 2.0)
    env.started(job)
    env.app.backend.mark_as_revoked(holder.id, reason="revoked")  # what another worker does
    duplicate = env.task("publish_work").delay(job, 2.0)
    assert duplicate.id == holder.id
    assert env.locks.exists(key)
    wait_until(lambda: env.intervals(job), 10, "the run to end")
    assert [s["id"] for s in env.starts(job)] == [holder.id]


@pytest.mark.parametrize("signame", ["TERM", "KILL"])
def test_released_on_revoke_terminate_of_running_task(
    env: Env, w: WorkerProcess, signame: str
) -> None:
    """revoke(terminate=True): with SIGTERM the body ends with an exception and the child or
    the main process releases, whichever comes first; with SIGKILL the child cannot, and the
    main process's task_revoked receiver must."""
    job = new_job("revoke-running")
    key = env.key("work", job, 30.0)
    result = env.task("work").delay(job, 30.0)
    env.started(job)
    assert env.locks.exists(key)
    env.app.control.revoke(
        result.id,
        terminate=True,
        signal=signame,
        destination=[w.hostname],
        reply=True,
        timeout=5,
    )
    took = env.gone_within(key, 10)
    assert took < PROMPT
    wait_until(lambda: result.state == "REVOKED", 10, "REVOKED state")
    # The body was stopped (SIGTERM ends it with an exception, so its `finally` may record an
    # end): it did not run its 30 s.
    assert all(i["end"] - i["start"] < 5 for i in env.intervals(job))
    if signame == "KILL":
        assert env.intervals(job) == []
        w.wait_log(rf"released \S+ of fault\.work\[{result.id}\] after revoke \(terminated\)", 5)


def test_released_on_soft_time_limit(env: Env, w: WorkerProcess) -> None:
    job = new_job("soft")
    key = env.key("soft", job, 10.0)
    result = env.task("soft").delay(job, 10.0)
    env.started(job)
    assert env.locks.exists(key)
    with pytest.raises(Exception) as caught:
        result.get(timeout=15)
    assert type(caught.value).__name__ == "SoftTimeLimitExceeded"
    # SoftTimeLimitExceeded was raised in the body, which released on its way out.
    assert not env.locks.exists(key)
    soft = records(env.data, "soft", job)
    assert len(soft) == 1 and soft[0]["held"]
    assert soft[0]["t"] - env.starts(job)[0]["t"] < 3


def test_released_on_hard_time_limit(env: Env, w: WorkerProcess) -> None:
    """time_limit=2, the body sleeps 10 s: the pool child is killed and the worker's main
    process releases the lock (lock_ttl=30)."""
    job = new_job("hard")
    key = env.key("hard", job, 10.0)
    result = env.task("hard").delay(job, 10.0)
    started = env.started(job)[0]["t"]
    assert env.locks.exists(key)
    env.gone_within(key, 10)
    after = time.time() - started
    assert 1.5 < after < 2 + PROMPT, f"released {after:.1f} s after the start"
    with pytest.raises(Exception) as caught:
        result.get(timeout=10)
    assert type(caught.value).__name__ == "TimeLimitExceeded"
    assert env.intervals(job) == []
    w.wait_log(rf"released \S+ of fault\.hard\[{result.id}\] after", 5)


def test_released_when_pool_child_sigkilled(env: Env, w: WorkerProcess) -> None:
    job = new_job("sigkill-child")
    key = env.key("work", job, 30.0)
    result = env.task("work").delay(job, 30.0)
    pid = env.started(job)[0]["pid"]
    assert pid in w.children()
    assert w.accepted(env.app, result.id) == pid
    assert env.locks.exists(key)
    os.kill(pid, signal.SIGKILL)
    took = env.gone_within(key, 15)
    assert took < CHILD_GONE, f"released {took:.1f} s after the kill (lease 30 s)"
    with pytest.raises(Exception) as caught:
        result.get(timeout=10)
    assert type(caught.value).__name__ == "WorkerLostError"
    w.wait_log(rf"released \S+ of fault\.work\[{result.id}\] after its pool process ended", 5)


def test_released_on_warm_shutdown(own_env: Env, tmp_path: Path) -> None:
    """SIGTERM to the worker's main process while a task runs: the task finishes, its lock is
    released, and the worker exits."""
    env = own_env
    job = new_job("warm")
    key = env.key("work", job, 3.0)
    with WorkerProcess(env.base, tmp_path) as proc:
        result = env.task("work").delay(job, 3.0)
        env.started(job)
        assert env.locks.exists(key)
        proc.signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.log()[-4000:]
        assert result.get(timeout=5)["held"] is True
        assert not env.locks.exists(key)
        interval = env.intervals(job)
        assert len(interval) == 1 and interval[0]["end"] - interval[0]["start"] >= 2.9
        assert "Warm shutdown" in proc.log()


def test_whole_worker_sigkilled_lock_frees_within_one_lease(own_env: Env, tmp_path: Path) -> None:
    """SIGKILL the worker's main process and its pool children at once (lock_ttl=3): nobody
    is left to release or renew, and the lock frees itself within one lease."""
    env = own_env
    job = new_job("kill-all")
    key = env.key("lease3", job, 30.0)
    with WorkerProcess(env.base, tmp_path) as proc:
        env.task("lease3").delay(job, 30.0)
        started = env.started(job)[0]
        assert started["pid"] in proc.children()
        # The heartbeat renews it: its lease ends later than it did.
        first_end = lease_end(env.locks, key)
        assert first_end is not None
        wait_until(lambda: (lease_end(env.locks, key) or 0) > first_end, 5, "a renewal")
        proc.kill_group()
        proc.wait(10)
        # Nobody renews it now: the lease it has left, read from Redis, ends it.
        assert 0 < env.locks.pttl(key) <= 3000
        env.gone_within(key, 10)
        assert not os.path.exists(f"/proc/{started['pid']}")


# -- the heartbeat -------------------------------------------------------------------------------


def test_heartbeat_keeps_running_lock_alive(env: Env, w: WorkerProcess) -> None:
    """lock_ttl=1 and a 6 s run: the lock is present throughout (renewed), a duplicate
    published meanwhile is skipped, and it is gone after the run."""
    job = new_job("heartbeat")
    key = env.key("short_lease", job, 6.0)
    result = env.task("short_lease").delay(job, 6.0)
    env.started(job)
    duplicate = None
    samples: list[tuple[float, int]] = []  # (time the PTTL answer was in, PTTL)
    deadline = time.monotonic() + 20
    while not result.ready() and time.monotonic() < deadline:
        pttl = env.locks.pttl(key)
        samples.append((time.time(), pttl))
        if duplicate is None and len(samples) == 50:
            duplicate = env.task("short_lease").delay(job, 6.0)
        time.sleep(0.02)  # the watch's sampling interval: the span watched is the scenario
    reply = result.get(timeout=1)
    assert reply["lost"] is False
    assert not env.locks.exists(key)
    (interval,) = env.intervals(job)
    assert interval["end"] - interval["start"] >= 6.0
    # Every answer that came in before the body ended (the run records its end before it
    # releases): the lock was there, with a lease of at most 1 s, renewed all along.
    during = [pttl for at, pttl in samples if interval["start"] < at < interval["end"]]
    assert len(during) > 100, len(during)
    assert all(0 < pttl <= 1000 for pttl in during), [p for p in during if not 0 < p <= 1000]
    assert duplicate is not None
    wait_until(lambda: duplicate.state == "SKIPPED", 10, "the duplicate to be skipped")
    assert duplicate.info["holder"] == result.id
    assert [s["id"] for s in env.starts(job)] == [result.id]
    w.wait_log(
        rf"skipped fault\.short_lease\[{duplicate.id}\]: lock \S+ is held by task "
        rf"{result.id}",
        5,
    )


def test_one_heartbeat_thread_per_process_started_after_fork(env: Env, w: WorkerProcess) -> None:
    """Several locked tasks (sequential and concurrent, after the earlier tests' runs): every
    pool child has exactly one heartbeat thread, its own (started in the child), and the
    worker's main process has none (nothing to inherit at fork)."""
    jobs = [new_job("threads") for _ in range(8)]
    results = [env.task("threads").delay(job, 0.3) for job in jobs[:4]]
    replies = [r.get(timeout=20) for r in results]
    for job in jobs[4:]:
        replies.append(env.task("threads").delay(job, 0.0).get(timeout=20))
    children = set(w.children())
    for reply in replies:
        assert reply["threads"].count(HEARTBEAT_THREAD) == 1, reply
        assert reply["heartbeat_pid"] == reply["pid"] != w.pid
        assert reply["pid"] in children
    assert len({r["pid"] for r in replies}) >= 2  # both pool children ran some
    (answer,) = env.app.control.broadcast(
        "fault_threads", destination=[w.hostname], reply=True, timeout=5
    )
    main = answer[w.hostname]
    assert main["pid"] == w.pid
    assert HEARTBEAT_THREAD not in main["threads"], main


def test_lock_lost_is_set_when_lease_gone(env: Env, w: WorkerProcess) -> None:
    """The test deletes a running task's lock (lock_ttl=1): the heartbeat finds it gone at its
    next renewal and sets ``self.lock.lost``; ``ensure_held()`` raises LockLostError; the run's
    end logs the loss and does not bring the lock back."""
    job = new_job("lost-lease")
    key = env.key("lose", job, 8.0)
    result = env.task("lose").delay(job, 8.0)
    wait_until(lambda: env.data.get(f"ready:{job}"), 20, "the task to be ready")
    assert env.locks.exists(key)
    deleted_at = time.time()
    env.locks.delete(key)
    reply = result.get(timeout=20)
    assert reply["lost_at"] is not None, "lock.lost was never set"
    noticed = reply["lost_at"] - deleted_at
    assert 0 <= noticed < 1.0, f"lost set {noticed:.2f} s after the lease was deleted"
    assert reply["ensure_held"] == "LockLostError"
    assert not env.locks.exists(key)
    log = w.wait_log(rf"the lock {key} of task {result.id} was lost during its run", 5)
    assert log
    assert f"the lease of {key} (owner {result.id}) is gone" in w.log()


def test_worker_survived(w: WorkerProcess) -> None:
    """The module's worker outlived every kill above (only pool children were killed)."""
    assert w.alive()
    assert len(w.children()) >= 2
