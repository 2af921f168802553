"""Leases over time: the heartbeat keeps a held lock alive and stops at release, ``lost`` when
the lease is taken away (DEL, a Redis restart), a SIGKILLed holder frees the lock within one
lease, a forked child inherits neither holds nor heartbeat, and a thread that ends without
releasing stops being renewed."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import pytest
import redis
from lock_helpers import (
    counting_client,
    hold_counts,
    hold_forever_worker,
    lease_end,
    renewed_holds,
    wait_until,
    wake_subscribers,
)

from celery_singleton_lock import LockLostError, LockNotOwnedError, ReentrantLock
from celery_singleton_lock._lock.owner import default_owner

FORK = multiprocessing.get_context("fork")


def _watch(client: Any, key: str, owner: str, seconds: float) -> list[int]:
    """Sample the lock for ``seconds``: it must stay held by ``owner`` the whole time."""
    ttls = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pipe = client.pipeline(transaction=False)
        pipe.hget(key, owner)
        pipe.pttl(key)
        count, ttl = pipe.execute()
        assert count is not None, (
            f"{key} was lost after {seconds - (deadline - time.monotonic())} s"
        )
        ttls.append(ttl)
        time.sleep(0.02)  # the watch's sampling interval: the span watched is the scenario
    return ttls


def test_heartbeat_keeps_the_lock_for_many_leases_and_stops_at_release(
    redis_client: Any,
) -> None:
    lease = 0.5
    lock = ReentrantLock(redis_client, "kept", ttl=lease)
    assert lock.acquire()
    fence = lock.fence
    ttls = _watch(redis_client, lock.key, lock.owner, 5.5 * lease)
    assert min(ttls) > 0 and max(ttls) <= lease * 1000
    assert not lock.lost.is_set()
    lock.ensure_held()
    assert lock.fence == fence  # renewal is not a new holder

    lock.release()
    assert redis_client.exists(lock.key) == 0
    assert all(hold.keys.lock != lock.key for hold in renewed_holds())
    # Nothing brings it back: watch for three leases (and take it with renew=False meanwhile,
    # so a stray renewal would show up as a lease that grows).
    intruder = ReentrantLock(redis_client, "kept", ttl=3 * lease, renew=False, owner="other")
    assert intruder.acquire(blocking=False)
    previous = redis_client.pttl(lock.key)
    deadline = time.monotonic() + 2 * lease
    while time.monotonic() < deadline:
        assert hold_counts(redis_client, lock.key) == {"other": 1}
        ttl = redis_client.pttl(lock.key)
        assert ttl <= previous
        previous = ttl
        time.sleep(0.02)  # the watch's sampling interval, over two leases
    intruder.release()
    assert redis_client.exists(lock.key) == 0


@pytest.mark.slow
def test_a_thousand_held_locks_are_renewed_in_a_few_round_trips(redis_server: Any) -> None:
    lease = 1.5
    client = counting_client(redis_server.port, socket_timeout=10)
    locks = [ReentrantLock(client, f"many-{i}", ttl=lease) for i in range(1000)]
    for lock in locks:
        assert lock.acquire(blocking=False)
    sent = client.round_trips[0]
    # Six renewal periods of the last lock taken (taking 1,000 can last a period or more on a
    # busy machine, and the first locks' renewals may come before `sent`): at most 10 round
    # trips per period, and at least one in each of most of them. (The span counted over is
    # the scenario: nothing is awaited.)
    time.sleep(2 * lease)
    trips = client.round_trips[0] - sent
    assert 4 <= trips <= 60, trips
    pipe = redis_server.client().pipeline(transaction=False)
    for lock in locks:
        pipe.hexists(lock.key, lock.owner)
    assert all(pipe.execute())
    assert not any(lock.lost.is_set() for lock in locks)
    for lock in locks:
        lock.release()


@pytest.mark.faults
def test_lost_is_set_when_the_key_is_deleted_behind_the_holders_back(
    redis_client: Any,
) -> None:
    lease = 0.5
    lock = ReentrantLock(redis_client, "deleted", ttl=lease)
    assert lock.acquire()
    assert not lock.lost.is_set()
    redis_client.delete(lock.key)
    assert lock.lost.wait(2 * lease)
    with pytest.raises(LockLostError):
        lock.ensure_held()
    with pytest.raises(LockLostError):
        lock.acquire()  # re-entering a lost hold is refused
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert lock.hold_count == 0
    assert lock.acquire(blocking=False)  # and a new hold starts afresh
    assert not lock.lost.is_set()
    lock.release()


@pytest.mark.faults
def test_lost_is_set_after_a_redis_restart(make_redis_server: Any) -> None:
    lease = 0.5
    server = make_redis_server()
    client = server.client()
    lock = ReentrantLock(client, "restarted", ttl=lease)
    assert lock.acquire()
    _watch(client, lock.key, lock.owner, lease)
    server.restart()  # same port; every key is gone
    restarted = time.monotonic()
    assert lock.lost.wait(10)
    assert time.monotonic() - restarted < 2 * lease + 1.0
    with pytest.raises(LockLostError):
        lock.ensure_held()
    with pytest.raises(LockNotOwnedError):
        lock.release()
    # The same client carries on against the new server.
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_thread_that_ends_without_releasing_stops_being_renewed(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    lease = 0.5
    lock = ReentrantLock(redis_client, "orphan", ttl=lease)
    caplog.set_level(logging.WARNING, logger="celery_singleton_lock.heartbeat")
    seen: dict[str, Any] = {}

    def take_and_leave() -> None:
        assert lock.acquire()
        seen["owner"] = lock.owner
        seen["lost"] = lock.lost

    thread = threading.Thread(target=take_and_leave)
    thread.start()
    thread.join(5)
    assert redis_client.hget(lock.key, seen["owner"]) == b"1"
    # From the thread's end on, the lease only runs down: no renewal, until it expires. When
    # it ends is read from Redis (TIME and PTTL at once), so a slow test does not move it.
    first_end = lease_end(redis_client, lock.key)
    assert first_end is not None

    def expired() -> bool:
        end = lease_end(redis_client, lock.key)
        assert end is None or end <= first_end + 0.002, "renewed after its thread ended"
        return end is None

    wait_until(expired, 5 * lease, "the lease to run out", 0.01)
    assert seen["lost"].is_set()
    warnings = [r for r in caplog.records if r.name == "celery_singleton_lock.heartbeat"]
    assert any("ended without releasing" in r.getMessage() for r in warnings)
    assert all(r.levelno == logging.WARNING for r in warnings)


def test_a_new_thread_does_not_inherit_the_locks_of_a_dead_one(redis_client: Any) -> None:
    # The OS hands a finished thread's id to the next thread at once: the owner token must not
    # be derived from it alone, or the new thread would "re-enter" the orphaned lock.
    lock = ReentrantLock(redis_client, "inherited", ttl=5)
    seen: list[tuple[int, str, bool, int]] = []

    def run() -> None:
        got = lock.acquire(blocking=False)
        seen.append((threading.get_ident(), lock.owner, got, lock.hold_count))

    for _ in range(5):  # the first one takes it and leaves it; none of the others may have it
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(5)
    assert len({owner for _, owner, _, _ in seen}) == len(seen)
    assert [(got, count) for _, _, got, count in seen] == [(True, 1)] + [(False, 0)] * 4
    assert hold_counts(redis_client, lock.key) == {seen[0][1]: 1}
    redis_client.delete(lock.key)


# -- a holder killed -----------------------------------------------------------------------


@pytest.mark.faults
def test_a_holder_killed_with_sigkill_frees_the_lock_within_a_lease(
    redis_client: Any, redis_server: Any
) -> None:
    lease = 1.0
    held = FORK.Event()
    holder = FORK.Process(
        target=hold_forever_worker, args=(redis_server.port, "killed", lease, held), daemon=True
    )
    holder.start()
    assert holder.pid is not None  # set by start()
    try:
        assert held.wait(10)
        # Let the heartbeat renew it at least once, so the lock would outlive a lease if
        # renewing went on without the holder.
        (owner,) = hold_counts(redis_client, "lock:{killed}")
        _watch(redis_client, "lock:{killed}", owner, 1.5 * lease)

        waiter = ReentrantLock(redis_client, "killed", ttl=lease)
        got: dict[str, float] = {}

        def wait() -> None:
            if waiter.acquire(timeout=10 * lease):
                got["at"] = time.monotonic()
                waiter.release()

        thread = threading.Thread(target=wait)
        thread.start()
        wait_until(
            lambda: wake_subscribers(redis_client, "lock:{killed}") >= 1, 5, "the waiter to block"
        )
        assert "at" not in got
        killed = time.monotonic()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
    thread.join(10 * lease)
    holder.join(5)
    assert holder.exitcode == -signal.SIGKILL
    assert "at" in got
    assert got["at"] - killed <= lease + 1.0


# -- fork ----------------------------------------------------------------------------------


def _child_after_fork(lock: ReentrantLock, port: int, parent_owner: str, results: Any) -> None:
    try:
        client = redis.Redis(port=port, socket_timeout=10)
        report: dict[str, Any] = {
            "hold_count": lock.hold_count,
            "fence": lock.fence,
            "owner_differs": default_owner() != parent_owner and lock.owner != parent_owner,
            "heartbeat_holds": len(renewed_holds()),
            "heartbeat_threads": [
                t.name for t in threading.enumerate() if t.name.startswith("celery-singleton")
            ],
        }
        try:
            lock.release()
            report["release"] = "released"
        except LockNotOwnedError:
            report["release"] = "not owned"
        report["parent_lock_taken"] = lock.acquire(blocking=False)
        own = ReentrantLock(client, "child's own", ttl=0.5)
        report["own"] = own.acquire(blocking=False)
        report["own_holders"] = hold_counts(client, own.key)
        report["own_heartbeat"] = [h.keys.lock for h in renewed_holds()]
        time.sleep(1.5)  # three leases: the child's heartbeat must keep it
        report["own_still_held"] = hold_counts(client, own.key) == {own.owner: 1}
        own.release()
        report["own_released"] = client.exists(own.key) == 0
        results.put(report)
    except BaseException as exc:
        results.put({"error": repr(exc)})


def test_a_forked_child_inherits_no_holds_and_no_heartbeat(
    redis_client: Any, redis_server: Any
) -> None:
    lease = 0.5
    lock = ReentrantLock(redis_client, "parent's", ttl=lease)
    assert lock.acquire()
    assert lock.acquire()  # nested: the child must not think it holds two
    results = FORK.Queue()
    child = FORK.Process(
        target=_child_after_fork,
        args=(lock, redis_server.port, lock.owner, results),
        daemon=True,
    )
    child.start()
    # Meanwhile the parent's heartbeat goes on renewing its own lock.
    _watch(redis_client, lock.key, lock.owner, 4 * lease)
    report = results.get(timeout=20)
    child.join(10)
    assert child.exitcode == 0
    assert report == {
        "hold_count": 0,
        "fence": None,
        "owner_differs": True,
        "heartbeat_holds": 0,
        "heartbeat_threads": [],
        "release": "not owned",
        "parent_lock_taken": False,
        "own": True,
        "own_holders": report["own_holders"],
        "own_heartbeat": ["lock:{child's own}"],
        "own_still_held": True,
        "own_released": True,
    }
    assert list(report["own_holders"].values()) == [1]
    assert f":{child.pid}:" in next(iter(report["own_holders"]))
    assert hold_counts(redis_client, lock.key) == {lock.owner: 1}
    assert not lock.lost.is_set()
    assert lock.hold_count == 2
    lock.release()
    lock.release()
    assert redis_client.exists(lock.key) == 0
