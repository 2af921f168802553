"""TLS (``rediss://``): the lock and the Celery settings path on a server that only the test's
own CA vouches for (see :mod:`tls_helpers`)."""

from __future__ import annotations

import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery_fixtures import BASE_CONF, Gates, app_task, lock_space, new_app, running_worker
from lock_helpers import wait_until, wake_subscribers
from tls_helpers import TlsRedis, tls_redis

from celery_singleton_lock import LockBackendError, LockedTask, ReentrantLock, reload_settings


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    with tls_redis(tmp_path_factory.mktemp("tls")) as server:
        yield server


def _client(tls: TlsRedis, **options: Any) -> redis.Redis:
    return redis.Redis.from_url(tls.url(), ssl_ca_certs=str(tls.files.ca), **options)


def test_the_lock_over_tls_renews_and_wakes_a_waiter(tls: TlsRedis) -> None:
    client = _client(tls)
    name = f"tls-{uuid.uuid4().hex}"
    holder = ReentrantLock(client, name, ttl=1.0, owner="holder")
    assert holder.acquire(blocking=False)
    time.sleep(2.5)  # two and a half leases (the scenario): only the heartbeat, over TLS, keeps it
    assert holder.owned()
    assert 0 < client.pttl(f"lock:{{{name}}}") <= 1000

    holder.release()
    assert not holder.locked()

    # The wake-up, on TLS too: the holder's lease is 30 s now, so a waiter that gets the lock
    # within a few seconds of the release was woken by its message (polling the lease out
    # would take the whole wait); a few seconds, not one: a loaded machine is slow to run it.
    holder = ReentrantLock(client, name, ttl=30.0, owner="holder")
    assert holder.acquire(blocking=False)
    got: list[float] = []
    waiter = ReentrantLock(_client(tls), name, ttl=5.0, owner="waiter")

    def wait() -> None:
        if waiter.acquire(timeout=20):
            got.append(time.monotonic())
            waiter.release()

    thread = threading.Thread(target=wait)
    thread.start()
    # the waiter is subscribed (its wake-up channel is on TLS too)
    wait_until(lambda: wake_subscribers(client, holder.key) >= 1, 10, "the waiter to subscribe")
    released = time.monotonic()
    holder.release()
    thread.join(20)
    assert got, "the waiter never got the lock"
    assert got[0] - released < 5.0  # woken by the release's message, not the lease's end
    assert not holder.locked()


def test_a_server_the_client_does_not_trust_is_a_backend_error_that_says_so(
    tls: TlsRedis,
) -> None:
    untrusting = redis.Redis.from_url(tls.url(), socket_connect_timeout=5)  # the system CAs only
    lock = ReentrantLock(untrusting, f"tls-{uuid.uuid4().hex}")
    with pytest.raises(LockBackendError) as raised:
        lock.acquire(blocking=False)
    assert (
        "certificate verify failed"
        in str(raised.value).lower() + str(raised.value.__cause__).lower()
    )


def test_the_settings_url_with_its_tls_options_in_the_query(tls: TlsRedis) -> None:
    app = new_app("tls_query")
    app.conf.singleton_lock_redis_url = (
        f"{tls.url(2)}?ssl_cert_reqs=required&ssl_ca_certs={tls.files.ca}"
    )
    try:
        client = lock_space(app).client
        assert client.ping()
        assert client.connection_pool.connection_class is redis.SSLConnection
    finally:
        reload_settings(app)


gates = Gates()
app = new_app("tls_app")


@app_task(app, base=LockedTask, name="tls.run_once")
def run_once(key: str) -> str:
    gates.enter(key)
    return "ran"


@app_task(app, base=LockedTask, name="tls.queued_once", lock_at="publish")
def queued_once(key: str) -> str:
    gates.enter(key)
    return "ran"


@pytest.fixture(scope="module")
def tls_worker(tls: TlsRedis) -> Iterator[TlsRedis]:
    """A worker whose broker, result backend and locks are all on the TLS server: the locks
    follow the broker's URL and its ``broker_use_ssl`` (no lock setting at all)."""
    use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(tls.files.ca)}
    app.conf.update(
        BASE_CONF,
        broker_url=tls.url(0),
        result_backend=tls.url(1),
        broker_use_ssl=use_ssl,
        redis_backend_use_ssl=use_ssl,
    )
    reload_settings(app)
    try:
        with running_worker(app):
            yield tls
    finally:
        gates.open_all()
        reload_settings(app)


def test_a_worker_on_a_tls_broker_locks_over_tls(tls_worker: TlsRedis) -> None:
    k = uuid.uuid4().hex
    first = run_once.delay(k)
    gates.wait_started(k)
    dup = run_once.delay(k)
    wait_until(lambda: app.AsyncResult(dup.id).state == "SKIPPED", 10)
    assert run_once.lock_holder(k) == first.id
    gates.open(k)
    assert first.get(timeout=10) == "ran"
    assert gates.runs[k] == 1
    assert lock_space(app).client.connection_pool.connection_class is redis.SSLConnection


def test_a_publish_lock_over_tls_returns_the_first_job(tls_worker: TlsRedis) -> None:
    k = uuid.uuid4().hex
    first = queued_once.delay(k)
    dup = queued_once.delay(k)
    assert dup.id == first.id
    gates.open(k)
    assert first.get(timeout=10) == "ran"
    assert gates.runs[k] == 1
    assert queued_once.lock_holder(k) is None


def test_the_default_lock_client_without_broker_use_ssl_cannot_verify(
    tls: TlsRedis, tmp_path: Path
) -> None:
    """The negative of the worker test above: the CA reaches the lock client only through
    ``broker_use_ssl``."""
    bare = new_app("tls_bare")
    bare.conf.broker_url = tls.url(0)
    try:
        with pytest.raises(redis.ConnectionError, match=r"(?i)certificate verify failed"):
            lock_space(bare).client.ping()
    finally:
        reload_settings(bare)
