"""SPEC §5 row 10: the same basic scenario on the prefork, threads and solo pools.

A run holds its lock; a duplicate delivered meanwhile is skipped (SKIPPED state naming the
holder, and a log line saying so); the lock is released as the run returns; the next publish
of the same job runs. Real ``celery worker`` subprocesses on a redis-server of the module's
own. The solo pool runs one task per process, so it gets two worker processes (how solo is
scaled), and the duplicate reaches the second one while the first is busy.

gevent and eventlet are not tested here (see the README: the heartbeat is a real thread, which
those pools monkey-patch into a greenlet).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from celery import Celery
from celery_procs import (
    WorkerProcess,
    close_app,
    new_job,
    no_overlap,
    records,
    redis_base,
    wait_for,
)
from faultapp import DATA_DB, LOCK_DB, make_app

from celery_singleton_lock.testing import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def app(server: RedisServer) -> Iterator[Celery]:
    app = make_app(redis_base(server.port))
    yield app
    close_app(app)


@pytest.mark.parametrize(("pool", "workers"), [("prefork", 1), ("threads", 1), ("solo", 2)])
def test_duplicate_skipped_and_lock_released(
    server: RedisServer, app: Celery, tmp_path: Path, pool: str, workers: int
) -> None:
    data = server.client(db=DATA_DB)
    locks = server.client(db=LOCK_DB)
    work = app.tasks["fault.work"]
    job = new_job(pool)
    key = work.lock_key_for(job, 2.5)
    with ExitStack() as stack:
        procs = [
            stack.enter_context(WorkerProcess(redis_base(server.port), tmp_path, pool=pool))
            for _ in range(workers)
        ]
        first = work.delay(job, 2.5)
        wait_for(lambda: records(data, "starts", job), 15, "the first run to start")
        assert locks.exists(key)
        duplicate = work.delay(job, 2.5)
        wait_for(lambda: duplicate.state == "SKIPPED", 10, "the duplicate to be skipped")
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
