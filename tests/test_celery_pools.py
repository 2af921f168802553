"""The same locks on every pool: prefork, threads, solo, gevent and eventlet.

A run holds its lock; a duplicate delivered meanwhile is skipped (SKIPPED state naming the
holder, and a log line saying so); the lock is released as the run returns; the next publish
of the same job runs. Real ``celery worker`` subprocesses on a redis-server of the module's
own. The solo pool runs one task per process, so it gets two worker processes (how solo is
scaled), and the duplicate reaches the second one while the first is busy.

Then what is particular to the green pools (``-P gevent`` / ``-P eventlet``), whose workers
monkey-patch ``threading``, ``time`` and ``socket`` at start, so that the lock's renewal lane is
a greenlet of the same hub as the task bodies:

* a lease shorter than a cooperative sleep of the body is renewed all along, and a duplicate
  published meanwhile is skipped;
* ``lock_at="publish"`` deduplicates the publishes of many greenlets at once;
* a body that blocks the hub (a call that does not yield) longer than the lease loses the lock,
  a duplicate can then run elsewhere, and the loss is detected: ``ensure_held()`` raises at once
  (the lease's own clock), ``lock.lost`` is set as soon as the hub runs the lane again, and the
  run's release logs that the lock was lost.

Those tasks are defined here (:func:`make_pool_app`, on top of the fault tests' app): the
worker subprocesses import this module (``-A test_celery_pools:pool_app``) with the tests folder
on their path.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from celery import Celery
from celery_procs import (
    WorkerProcess,
    new_job,
    no_overlap,
    records,
    redis_base,
)
from faultapp import DATA_DB, LOCK_DB, URL_ENV, data, make_app
from lock_helpers import START_TIMEOUT, renewed_here, wait_until

from celery_singleton_lock import LockedTask, LockLostError
from celery_singleton_lock.testing import RedisServer

#: every test runs `celery worker` subprocesses
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
#: "1" in a worker subprocess of this module: build :data:`pool_app`
POOL_APP_ENV = "CSL_POOL_APP"
GREEN_POOLS = ["gevent", "eventlet"]

TaskT = TypeVar("TaskT", bound=LockedTask)


def _app_task(
    app: Celery, *, base: type[TaskT], **options: Any
) -> Callable[[Callable[..., Any]], TaskT]:
    """``app.task(base=base, **options)``, typed (celery ships no type information)."""
    return cast("Callable[[Callable[..., Any]], TaskT]", app.task(base=base, **options))


# -- what runs in the green worker ----------------------------------------------------------


def _green() -> str | None:
    """The green library that patched this process (``None`` in a plain one)."""
    gevent_monkey = sys.modules.get("gevent.monkey")
    if gevent_monkey is not None and gevent_monkey.is_module_patched("threading"):
        return "gevent"
    patcher = sys.modules.get("eventlet.patcher")
    if patcher is not None and patcher.is_monkey_patched("thread"):
        return "eventlet"
    return None


def _blocking_sleep(seconds: float) -> None:
    """Sleep without yielding to the hub: the unpatched ``time.sleep``, as a C extension, a
    busy loop or a blocking driver the patch does not cover would."""
    green = _green()
    if green == "gevent":
        importlib.import_module("gevent.monkey").get_original("time", "sleep")(seconds)
    elif green == "eventlet":
        importlib.import_module("eventlet.patcher").original("time").sleep(seconds)
    else:
        time.sleep(seconds)  # the body's work (the scenario)


def _spawn_all(calls: list[Callable[[], None]], timeout: float) -> None:
    """Run ``calls`` in greenlets of the pool's library at once, and wait for them."""
    # imported by name: neither library ships type information
    if _green() == "gevent":
        gevent = importlib.import_module("gevent")
        gevent.joinall([gevent.spawn(call) for call in calls], timeout=timeout, raise_error=True)
    else:
        eventlet = importlib.import_module("eventlet")
        pool = eventlet.GreenPool(len(calls))
        for call in calls:
            pool.spawn(call)
        with eventlet.Timeout(timeout):
            pool.waitall()


def _os_threads() -> int:
    """OS threads of this process (``threading.enumerate`` lists greenlets once patched)."""
    return len(os.listdir("/proc/self/task"))


def _record(app: Celery, kind: str, job: str, **item: Any) -> None:
    data(app).rpush(f"{kind}:{job}", json.dumps(item))


def _held(lock: Any) -> str:
    try:
        lock.ensure_held()
    except LockLostError as exc:
        return type(exc).__name__
    return "held"


def make_pool_app(base: str) -> Celery:
    """The fault tests' app (:func:`faultapp.make_app`) plus the green-pool tasks."""
    app = make_app(base)

    @_app_task(app, base=LockedTask, bind=True, name="pool.nap", lock_ttl=2, shared=False)
    def nap(self: Any, job: str, seconds: float = 6.0) -> dict[str, Any]:
        """Sleeps cooperatively (``time.sleep``, patched) three times its lease."""
        _record(self.app, "starts", job, id=self.request.id, t=time.time())
        time.sleep(seconds)  # the body's cooperative work (the scenario)
        return {
            "green": _green(),
            "lost": self.lock.lost.is_set(),
            "ensure_held": _held(self.lock),
            "os_threads": _os_threads(),
        }

    @_app_task(
        app,
        base=LockedTask,
        bind=True,
        name="pool.block",
        lock_ttl=2,
        lock_unique_on=["job"],
        shared=False,
    )
    def block(self: Any, job: str, seconds: float = 0.0) -> dict[str, Any]:
        """Blocks the hub ``seconds`` (no yield); then says what the lock looks like right
        after (before anything yields), and after a cooperative pause in which the hub runs
        the renewal lane again."""
        start = time.time()
        _record(self.app, "starts", job, id=self.request.id, t=start)
        _blocking_sleep(seconds)
        after_block = {"lost": self.lock.lost.is_set(), "ensure_held": _held(self.lock)}
        if after_block["lost"]:
            # Yield to the hub (a patched, cooperative wait) until the renewal lane has run
            # and given the lost hold up: it logs that the lease ran out before it could be
            # renewed.
            wait_until(
                lambda: not renewed_here(self.lock), 5, "the renewal lane to give the hold up"
            )
        after_yield = {"lost": self.lock.lost.is_set(), "ensure_held": _held(self.lock)}
        end = time.time()
        _record(self.app, "intervals", job, id=self.request.id, start=start, end=end)
        return {"green": _green(), "after_block": after_block, "after_yield": after_yield}

    @_app_task(app, base=LockedTask, bind=True, name="pool.fan_out", shared=False)
    def fan_out(self: Any, job: str, count: int) -> dict[str, Any]:
        """Publishes ``fault.publish_work(job)`` from ``count`` greenlets at once; returns the
        ids they got and how many were inside ``delay()`` together at most."""
        target = self.app.tasks["fault.publish_work"]
        ids: list[str] = []
        inside = {"now": 0, "max": 0}

        def publish() -> None:
            inside["now"] += 1
            inside["max"] = max(inside["max"], inside["now"])
            try:
                ids.append(target.delay(job, 1.0).id)
            finally:
                inside["now"] -= 1

        _spawn_all([publish] * count, timeout=30)
        return {"green": _green(), "ids": ids, "most_inside": inside["max"]}

    return app


if os.environ.get(POOL_APP_ENV) == "1":
    pool_app = make_pool_app(os.environ[URL_ENV])


# -- the test process ----------------------------------------------------------------------


class PoolWorker(WorkerProcess):
    """A worker subprocess of :func:`make_pool_app`'s app, consuming ``queue``."""

    def __init__(self, base: str, log_dir: Path, *, queue: str = "fault", **options: Any) -> None:
        env = {POOL_APP_ENV: "1", **options.pop("env", {})}
        super().__init__(base, log_dir, env=env, **options)
        self.queue = queue

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("tests.faultapp")] = "test_celery_pools:pool_app"
        cmd[cmd.index("-Q") + 1] = self.queue
        return cmd

    def start(self, timeout: float = START_TIMEOUT) -> PoolWorker:
        # WorkerProcess puts the repository first on PYTHONPATH, then the environment's: the
        # tests folder goes there, so that the worker imports this module as the tests do.
        with pytest.MonkeyPatch.context() as patch:
            previous = os.environ.get("PYTHONPATH")
            patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), previous])))
            super().start(timeout)
        return self


#: the app of the conftest's ``fault_app`` fixture (on ``fault_server``)
make_fault_app = make_pool_app


@pytest.mark.parametrize(
    ("pool", "workers"),
    [("prefork", 1), ("threads", 1), ("solo", 2), ("gevent", 1), ("eventlet", 1)],
)
def test_duplicate_skipped_and_lock_released(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path, pool: str, workers: int
) -> None:
    data = fault_server.client(db=DATA_DB)
    locks = fault_server.client(db=LOCK_DB)
    work = fault_app.tasks["fault.work"]
    job = new_job(pool)
    key = work.lock_key_for(job, 2.5)
    with ExitStack() as stack:
        procs = [
            stack.enter_context(WorkerProcess(redis_base(fault_server.port), tmp_path, pool=pool))
            for _ in range(workers)
        ]
        first = work.delay(job, 2.5)
        wait_until(lambda: records(data, "starts", job), 15, "the first run to start")
        assert locks.exists(key)
        duplicate = work.delay(job, 2.5)
        wait_until(lambda: duplicate.state == "SKIPPED", 10, "the duplicate to be skipped")
        assert duplicate.info["holder"] == first.id
        assert first.get(timeout=15)["held"] is True
        assert not locks.exists(key)  # released before the result was stored
        again = work.delay(job, 2.5)
        assert again.get(timeout=15)["held"] is True
        assert not locks.exists(key)
        logs = [p.log() for p in procs]
        log = "".join(logs)
    runs = records(data, "intervals", job)
    assert [r["id"] for r in runs] == [first.id, again.id]
    assert no_overlap(runs)
    assert int(data.get(f"max:{job}")) == 1
    assert re.search(
        rf"skipped fault\.work\[{duplicate.id}\]: lock {re.escape(key)} is held by task "
        rf"{first.id}",
        log,
    ), log[-4000:]
    if pool == "solo":  # the duplicate ran into the lock in the other worker process
        ran = {i for i, text in enumerate(logs) if f"fault.work[{first.id}] succeeded" in text}
        skipped = {
            i for i, text in enumerate(logs) if f"skipped fault.work[{duplicate.id}]" in text
        }
        assert len(ran) == len(skipped) == 1 and ran != skipped
    data.close()
    locks.close()


# -- the green pools ------------------------------------------------------------------------


@pytest.mark.parametrize("pool", GREEN_POOLS)
def test_a_cooperative_sleep_longer_than_the_lease_keeps_the_lock(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path, pool: str
) -> None:
    """lock_ttl=2, the body sleeps 6 s with the patched ``time.sleep``: the hub runs the renewal
    lane meanwhile, so at 4.5 s the run still holds its lock and a duplicate is skipped."""
    data_db = fault_server.client(db=DATA_DB)
    locks = fault_server.client(db=LOCK_DB)
    nap = fault_app.tasks["pool.nap"]
    job = new_job(f"nap-{pool}")
    key = nap.lock_key_for(job, 6.0)
    with PoolWorker(redis_base(fault_server.port), tmp_path, pool=pool, concurrency=4) as worker:
        first = nap.delay(job, 6.0)
        [start] = wait_until(lambda: records(data_db, "starts", job), 15, "the run to start")
        wait_until(lambda: time.time() >= start["t"] + 4.0, 10, "4 s into the run")
        duplicate = nap.delay(job, 6.0)
        wait_until(lambda: duplicate.state == "SKIPPED", 5, "the duplicate to be skipped")
        assert duplicate.info["holder"] == first.id
        assert time.time() < start["t"] + 5.5  # checked while the body still sleeps
        assert nap.lock_holder(job, 6.0) == first.id
        assert 0 < locks.pttl(key) <= 2000
        reply = first.get(timeout=15)
        log = worker.log()
    assert reply["green"] == pool
    assert reply["lost"] is False and reply["ensure_held"] == "held"
    assert [s["id"] for s in records(data_db, "starts", job)] == [first.id]
    assert not locks.exists(key)
    assert not re.search(r"(is|was) lost", log), log[-4000:]
    data_db.close()
    locks.close()


@pytest.mark.parametrize("pool", GREEN_POOLS)
def test_publishes_from_many_greenlets_make_one_task(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path, pool: str
) -> None:
    """``lock_at="publish"``: 20 greenlets publish the same job together, one task is queued
    and every greenlet gets its id."""
    data_db = fault_server.client(db=DATA_DB)
    job = new_job(f"fan-{pool}")
    with PoolWorker(redis_base(fault_server.port), tmp_path, pool=pool, concurrency=4):
        reply = fault_app.tasks["pool.fan_out"].delay(job, 20).get(timeout=30)
        assert reply["green"] == pool
        assert len(reply["ids"]) == 20
        assert reply["most_inside"] > 1  # the publishes did overlap
        [task_id] = set(reply["ids"])
        fault_app.AsyncResult(task_id).get(timeout=15)
        runs = records(data_db, "intervals", job)
    assert [r["id"] for r in runs] == [task_id]
    data_db.close()


@pytest.mark.parametrize("pool", GREEN_POOLS)
def test_a_body_that_blocks_the_hub_past_the_lease_loses_the_lock_and_says_so(
    fault_server: RedisServer, fault_app: Celery, tmp_path: Path, pool: str
) -> None:
    """lock_ttl=2, the body blocks the hub 6 s (an unpatched sleep): nothing renews the lease,
    it ends about 2 s after the last renewal, and a duplicate run on another worker gets in.
    The loss is detected as soon as the body goes on, before anything yields: ``lock.lost`` and
    ``ensure_held()`` read the lease's own clock. The lane, run again by the hub, logs that the
    lease ran out before it could be renewed, and the run's release logs the loss too."""
    data_db = fault_server.client(db=DATA_DB)
    locks = fault_server.client(db=LOCK_DB)
    block = fault_app.tasks["pool.block"]
    job = new_job(f"block-{pool}")
    key = block.lock_key_for(job)
    base = redis_base(fault_server.port)
    with (
        PoolWorker(base, tmp_path, pool=pool, concurrency=4) as green,
        PoolWorker(base, tmp_path, pool="threads", concurrency=2, queue="other") as other,
    ):
        first = block.delay(job, 6.0)
        [start] = wait_until(lambda: records(data_db, "starts", job), 15, "the run to start")
        gone = wait_until(lambda: not locks.exists(key) and time.time(), 5, "the lease to end")
        assert gone - start["t"] < 2 + 1.0  # one lease after the last renewal, at the start
        intruder = block.apply_async((job, 0.0), queue="other")
        assert intruder.get(timeout=10)["after_block"]["ensure_held"] == "held"
        assert time.time() < start["t"] + 6.0  # it ran while the first still blocked
        reply = first.get(timeout=15)
        green.wait_log(r"was lost during its run", 5)
        log = green.log()
        other_log = other.log()
    assert reply["green"] == pool
    assert reply["after_block"] == {"lost": True, "ensure_held": "LockLostError"}
    assert reply["after_yield"] == {"lost": True, "ensure_held": "LockLostError"}
    ran_out = re.search(
        rf"ERROR.*the lease of {re.escape(key)} ran out ([\d.]+) s ago before it could be "
        r"renewed; the lock is lost",
        log,
    )
    assert ran_out is not None, log[-4000:]
    assert 3.0 < float(ran_out.group(1)) < 5.0  # the block (6 s) less the lease (2 s)
    assert re.search(
        rf"WARNING.*the lock {re.escape(key)} of task {first.id} was lost during its run", log
    ), log[-4000:]
    runs = records(data_db, "intervals", job)
    assert {r["id"] for r in runs} == {first.id, intruder.id}
    assert not no_overlap(runs)  # the duplicate ran inside the blocked run
    assert not re.search(r"(is|was) lost", other_log), other_log[-4000:]
    data_db.close()
    locks.close()
