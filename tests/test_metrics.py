"""Metrics (``celery_singleton_lock.metrics``): what the lock counts in this process while a
test runs (:func:`metrics.enable`); and real ``celery worker`` subprocesses serving them,
scraped over HTTP."""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import faultapp
import pytest
import redis
from celery_procs import WorkerProcess, close_app, new_job, redis_base
from lock_helpers import wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock import LockBackendError, LockSpace, ReentrantLock, metrics
from celery_singleton_lock.testing import RedisServer, free_port

Sample = tuple[str, tuple[tuple[str, str], ...]]


class Counted:
    """What this process's metrics counted since it was made: the metrics are enabled once per
    process (the first registry stays), so a test reads how much each sample grew."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.start = self.samples()

    def samples(self) -> dict[Sample, float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in self.registry.collect()
            for sample in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return self.samples().get(key, 0.0) - self.start.get(key, 0.0)


@pytest.fixture
def counted() -> Iterator[Counted]:
    try:
        yield Counted(metrics.enable(CollectorRegistry()).registry)
    finally:
        metrics.disable()


def test_the_lock_counts_each_outcome(counted: Counted, redis_client: Any) -> None:
    name = f"m-{uuid.uuid4().hex}"
    holder = ReentrantLock(redis_client, name, ttl=0.6, owner="holder")
    assert holder.acquire(blocking=False)
    assert holder.acquire(blocking=False)  # nested: re-entered in this process
    other = ReentrantLock(redis_client, name, owner="other")
    assert not other.acquire(blocking=False)
    assert not other.acquire(timeout=0.3)  # waits, then gives up
    time.sleep(0.7)  # a hold of more than a lease (the scenario): kept only by renewals
    holder.release()
    holder.release()

    assert counted("celery_singleton_lock_acquires_total", outcome="acquired") == 1
    assert counted("celery_singleton_lock_acquires_total", outcome="reentered") == 1
    assert counted("celery_singleton_lock_acquires_total", outcome="refused") == 2
    assert counted("celery_singleton_lock_wait_seconds_count") == 1
    assert counted("celery_singleton_lock_wait_seconds_sum") >= 0.25
    assert counted("celery_singleton_lock_hold_seconds_count") == 1
    assert counted("celery_singleton_lock_hold_seconds_sum") >= 0.9
    assert counted("celery_singleton_lock_renewals_total") >= 2
    assert counted("celery_singleton_lock_lost_total") == 0


def test_a_lost_lease_and_a_backend_error_are_counted(counted: Counted, redis_client: Any) -> None:
    name = f"m-{uuid.uuid4().hex}"
    lock = ReentrantLock(redis_client, name, ttl=0.6)
    assert lock.acquire(blocking=False)
    LockSpace(redis_client).force_release(name)  # an operator frees it under the holder
    assert lock.lost.wait(2.0)
    assert counted("celery_singleton_lock_lost_total") == 1
    assert lock.lost.is_set()  # asking again counts nothing more
    assert counted("celery_singleton_lock_lost_total") == 1

    # (no resends: redis-py's default retry would take some 10 s to give up on a refusal)
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    with pytest.raises(LockBackendError):
        ReentrantLock(dead, name).acquire(blocking=False)
    assert counted("celery_singleton_lock_backend_errors_total") == 1


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("celery_singleton_lock_")
    }


def _total(scrapes: list[dict[Any, float]], name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return sum(scrape.get(key, 0.0) for scrape in scrapes)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.mark.slow  # a `celery worker` subprocess serves them
@pytest.mark.parametrize(("pool", "ports"), [("prefork", 3), ("threads", 1)])
def test_a_worker_serves_the_metrics(
    server: RedisServer, tmp_path: Path, pool: str, ports: int
) -> None:
    """prefork -c 2: the main process on the port, the children on port + 1 and + 2."""
    base = redis_base(server.port)
    app = faultapp.make_app(base)
    port = _free_port_block(ports)
    env = {faultapp.METRICS_ENV: str(port)}
    data = redis.Redis(port=server.port, db=faultapp.DATA_DB)
    try:
        with WorkerProcess(base, tmp_path, pool=pool, concurrency=2, env=env) as worker:
            job = new_job("metered")
            task = app.tasks["fault.short_lease"]
            first = task.delay(job, 1.5)  # lock_ttl=1: renewed while it runs
            wait_until(lambda: data.llen(f"starts:{job}") == 1, 20, "the first run to start")
            dup = task.delay(job)
            wait_until(lambda: app.AsyncResult(dup.id).state == "SKIPPED", 20, "the skip")
            first.get(timeout=20)

            def scraped() -> list[dict[Any, float]] | None:
                try:
                    return [_scrape(port + i) for i in range(ports)]
                except OSError:
                    return None  # a child still starting its server

            try:
                scrapes = wait_until(scraped, 20, "every process's metrics")
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}; the worker's log:\n{worker.log_path.read_text()}"
                ) from exc
            assert _total(scrapes, "celery_singleton_lock_acquires_total", outcome="acquired") >= 1
            assert (
                _total(
                    scrapes,
                    "celery_singleton_lock_duplicates_total",
                    task="fault.short_lease",
                    action="skipped",
                )
                == 1
            )
            assert _total(scrapes, "celery_singleton_lock_hold_seconds_count") >= 1
            assert _total(scrapes, "celery_singleton_lock_renewals_total") >= 2
            assert _total(scrapes, "celery_singleton_lock_lost_total") == 0
    finally:
        close_app(app)
        data.close()


def _free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports that can be bound now, below the ephemeral range.

    Above 32767 an outgoing connection of the worker itself (to Redis, its local port picked by
    the kernel from the ephemeral range) could take one of the ports before a pool child binds it.
    """
    import random
    import socket

    for _ in range(200):
        base = random.randrange(20000, 32000 - count)
        try:
            for port in range(base, base + count):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError(f"no {count} consecutive free ports between 20000 and 32000")
