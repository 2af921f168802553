"""Redis unreachable, hung or failing: every call raises ``LockBackendError`` with the redis-py
error chained, within a bounded time; ``with lock:`` never runs its body unlocked; and the
heartbeat survives an outage, setting ``lost`` when it cannot renew in time."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from lock_helpers import renewed_holds, stopped, wait_until
from redis.backoff import ConstantBackoff, NoBackoff
from redis.retry import Retry

from celery_singleton_lock import (
    LockBackendError,
    LockError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    ReentrantLock,
)
from celery_singleton_lock._lock.deadline import deadline
from celery_singleton_lock._lock.runtime import LockRuntime
from celery_singleton_lock.lock import DeadlineRetry
from celery_singleton_lock.testing import RedisServer, free_port

pytestmark = pytest.mark.faults


def _no_retry_client(port: int, timeout: float = 0.5) -> Any:
    return redis.Redis(
        port=port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.fixture
def closes() -> Iterator[list[Any]]:
    """Clients whose runtime is closed after the test: the cancels of their lost acquires,
    retried in the background against a server that never comes, end with the test instead
    of logging their end during a later one."""
    clients: list[Any] = []
    yield clients
    for client in clients:
        LockRuntime.of(client).close()


def test_redis_down_raises_backend_error_at_once(closes: list[Any]) -> None:
    client = _no_retry_client(free_port())
    closes.append(client)
    lock = ReentrantLock(client, "down", ttl=1)
    calls: tuple[Callable[[], bool], ...] = (
        lambda: lock.acquire(),
        lambda: lock.acquire(blocking=False),
        lambda: lock.acquire(timeout=5),
        lambda: lock.owned(),
        lambda: lock.locked(),
    )
    for call in calls:
        started = time.monotonic()
        with pytest.raises(LockBackendError) as info:
            call()
        assert time.monotonic() - started < 1.0
        assert isinstance(info.value.__cause__, redis.ConnectionError)
        assert isinstance(info.value, LockError)
        assert "down" in str(info.value)
    assert lock.hold_count == 0

    entered = False
    with pytest.raises(LockBackendError), lock:
        entered = True
    assert not entered


@pytest.mark.slow
def test_redis_down_with_the_default_retry_is_bounded(
    make_redis_server: Any, closes: list[Any]
) -> None:
    # redis-py's default client retries (with backoff) before it gives up: still bounded.
    port = free_port()
    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    closes.append(client)
    lock = ReentrantLock(client, "down", ttl=1)
    started = time.monotonic()
    with pytest.raises(LockBackendError) as info:
        lock.acquire(timeout=30)
    assert time.monotonic() - started < 15
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_a_hung_redis_times_out_instead_of_hanging(make_redis_server: Any) -> None:
    server = make_redis_server()
    client = _no_retry_client(server.port, timeout=0.3)
    lock = ReentrantLock(client, "hung", ttl=1)
    assert client.ping()
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(LockBackendError) as info:
            lock.acquire()
        assert time.monotonic() - started < 2.0
        assert isinstance(info.value.__cause__, redis.TimeoutError)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert lock.acquire(timeout=5)
    lock.release()


def test_with_lock_times_out_and_never_enters_unlocked(redis_client: Any) -> None:
    holder = ReentrantLock(redis_client, "busy", ttl=30, owner="holder")
    assert holder.acquire()
    waiter = ReentrantLock(redis_client, "busy", ttl=30, timeout=0.3)
    entered = False
    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as info, waiter:
        entered = True
    elapsed = time.monotonic() - started
    assert not entered
    assert 0.3 <= elapsed < 1.5
    assert info.value.name == "busy" and info.value.timeout == 0.3
    assert waiter.hold_count == 0
    assert redis_client.hkeys(holder.key) == [b"holder"]
    holder.release()
    with waiter:
        entered = True
        assert waiter.hold_count == 1
    assert entered and redis_client.exists(holder.key) == 0


def test_a_waiter_gets_an_error_not_a_hang_when_redis_dies(make_redis_server: Any) -> None:
    server = make_redis_server()
    client = _no_retry_client(server.port)
    holder = ReentrantLock(client, "dies", ttl=1, owner="holder")
    assert holder.acquire()
    outcome: dict[str, Any] = {}

    def wait() -> None:
        lock = ReentrantLock(client, "dies", ttl=1)
        try:
            outcome["acquired"] = lock.acquire(timeout=30)
        except LockError as exc:
            outcome["error"] = exc
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: server.client().pubsub_numsub("lock:{dies}:wake")[0][1] == 1, 5)
    killed = time.monotonic()
    server.kill()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome.get("error"), LockBackendError), outcome
    assert outcome["at"] - killed < 2.0  # at most the holder's lease, plus the failing call
    assert holder.lost.wait(3)
    # The waiter left: the process keeps no subscription to the dead server.
    assert LockRuntime.of(client).hub.subscriptions == {}


def test_the_heartbeat_survives_an_outage_and_sets_lost(
    make_redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="celery_singleton_lock.heartbeat")
    lease = 0.6
    server = make_redis_server()
    client = _no_retry_client(server.port, timeout=0.2)
    lock = ReentrantLock(client, "outage", ttl=lease)
    assert lock.acquire()
    os.kill(server.process.pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        # The heartbeat cannot renew: it retries, and ``lost`` is set when the lease has run out.
        assert lock.lost.wait(4 * lease)
        assert time.monotonic() - paused >= lease / 2  # renewed at most lease/3 before
        with pytest.raises(LockLostError):
            lock.ensure_held()
        # The heartbeat gives the lock up (with an ERROR) while Redis is still away.
        wait_until(lambda: all(h.keys.lock != lock.key for h in renewed_holds()), 3)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    records = [r for r in caplog.records if "lock:{outage}" in r.getMessage()]
    assert any("renewing lock:{outage} failed" in r.getMessage() for r in records), records
    assert any(r.levelno == logging.ERROR for r in records), records

    # The heartbeat thread did not die: a new hold is renewed as before.
    again = ReentrantLock(client, "after-outage", ttl=lease)
    assert again.acquire()
    deadline = time.monotonic() + 3 * lease
    while time.monotonic() < deadline:
        assert client.hexists(again.key, again.owner)
        time.sleep(0.02)  # the watch's sampling interval: the span watched is the scenario
    assert not again.lost.is_set()
    again.release()


def test_a_redis_that_hangs_without_a_socket_timeout_still_sets_lost(
    make_redis_server: Any,
) -> None:
    # redis-py's default client has no socket timeout: a renewal sent to a server that stops
    # answering blocks that client's renewal lane for as long as the server hangs. The leases
    # it cannot renew meanwhile must still be reported lost at their end, and never revived by a
    # late renewal; and a lock on another server, renewed by its own client's lane, is kept.
    lease = 0.6
    hung_server, other_server = make_redis_server(), make_redis_server()
    hung_client = redis.Redis(port=hung_server.port)  # no timeout
    other_client = redis.Redis(port=other_server.port, socket_timeout=5)
    hung = ReentrantLock(hung_client, "hangs", ttl=lease)
    other = ReentrantLock(other_client, "elsewhere", ttl=lease)
    assert hung.acquire() and other.acquire()
    os.kill(hung_server.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        assert hung.lost.wait(3 * lease)
        assert time.monotonic() - stopped <= lease + 0.5
        with pytest.raises(LockLostError):
            hung.ensure_held()
        # The healthy server's lock is renewed all along, for several of its leases.
        while time.monotonic() - stopped < 4 * lease:
            assert not other.lost.is_set()
            assert other_client.hexists(other.key, other.owner)
            time.sleep(0.02)  # the watch's sampling interval
        with pytest.raises(LockLostError):
            hung.acquire()  # no re-entry into a lost lease
    finally:
        os.kill(hung_server.process.pid, signal.SIGCONT)
    other.ensure_held()
    other.release()

    # The hung server's lane gets going again and renews new holds; the lost ones stay lost.
    fresh = ReentrantLock(hung_client, "fresh", ttl=lease)
    assert fresh.acquire()
    deadline = time.monotonic() + 3 * lease
    while time.monotonic() < deadline:
        assert hung_client.hexists(fresh.key, fresh.owner)
        assert not fresh.lost.is_set()
        time.sleep(0.02)  # the watch's sampling interval: the span watched is the scenario
    assert hung_client.exists(hung.key) == 0
    fresh.release()
    with pytest.raises(LockNotOwnedError):
        hung.release()


# -- resends and background calls under a deadline -------------------------------------------


def test_resends_stop_before_a_pause_would_pass_the_deadline() -> None:
    """The policy would resend 50 times, 0.3 s apart (15 s); under a 1 s deadline the last
    resend starts before it, and no pause ends past it. (The policy is called directly: a
    refused connect is not resent at all by redis-py before 6, whatever the policy.)"""
    policy = DeadlineRetry(ConstantBackoff(0.3), 50)
    attempts: list[float] = []

    def refused() -> None:
        attempts.append(time.monotonic())
        raise redis.ConnectionError("refused")

    started = time.monotonic()
    with deadline(1.0), pytest.raises(redis.ConnectionError):
        policy.call_with_retry(refused, lambda _error: None)
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 1.1, elapsed  # resent at 0.3, 0.6 and 0.9 s
    assert len(attempts) == 4, attempts
    # without a deadline the same policy resends as redis-py's Retry does
    attempts.clear()
    with pytest.raises(redis.ConnectionError):
        DeadlineRetry(ConstantBackoff(0.01), 5).call_with_retry(refused, lambda _error: None)
    assert len(attempts) == 6, attempts


def test_a_background_call_outlives_a_stall_only_when_asked_to(
    make_redis_server: Callable[..., RedisServer],
) -> None:
    """A cancel keeps trying while the server does not answer (it may run the lost acquire
    when it wakes); a plain background call gives up when its time is up, and says so (a
    pending cancel is forgotten that way)."""
    server = make_redis_server()
    client = redis.Redis(
        port=server.port,
        socket_timeout=0.3,
        socket_connect_timeout=0.3,
        retry=Retry(NoBackoff(), 0),
    )
    assert client.ping()

    def setter(key: str) -> Callable[[], None]:
        def set_key() -> None:
            client.set(key, 1)

        return set_key

    lane = LockRuntime.of(client).lane
    gave_up: list[str] = []
    with stopped(server):
        lane.retry(
            setter("stalled:kept"),
            "set stalled:kept",
            0.5,
            budget=0.3,
            while_stalled=True,
            gave_up=lambda: gave_up.append("kept"),
        )
        lane.retry(
            setter("stalled:dropped"),
            "set stalled:dropped",
            0.5,
            gave_up=lambda: gave_up.append("dropped"),
        )
        time.sleep(2.0)  # the stall's length (the scenario): four times what either was given
    wait_until(lambda: client.exists("stalled:kept"), timeout=10)
    assert not client.exists("stalled:dropped")
    assert gave_up == ["dropped"]
